// Fuzz target for the knowledge base's saved file (serve/knowledge_base_file.h), which the
// server reads at start from its store folder: anything may be refused with
// std::runtime_error (the server then sets the file aside); a crash, a sanitizer report, or
// a file that parses but does not survive writing and reading again is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string_view>

#include "serve/knowledge_base_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  cf::SavedKnowledgeBase kb;
  try {
    kb = cf::parse_knowledge_base_file(text, cf::KnowledgeBaseLimits{});
  } catch (const std::runtime_error&) {
    return 0;
  }
  const cf::SavedKnowledgeBase again = cf::parse_knowledge_base_file(cf::knowledge_base_file_text(kb), cf::KnowledgeBaseLimits{});
  if (again.documents.size() != kb.documents.size() || again.next_document != kb.next_document) std::abort();
  for (size_t i = 0; i < kb.documents.size(); ++i)
    if (again.documents[i].chunks.size() != kb.documents[i].chunks.size() || again.documents[i].id != kb.documents[i].id)
      std::abort();
  return 0;
}
