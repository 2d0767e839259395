// The knowledge base's file (knowledge_base.h, "Persistence"): one JSON document inside the
// chunk store's folder, so a restarted server lists the same documents, chunks and use counts.
//
//   {"version": 1, "next_document": 7,
//    "documents": [{"id", "name", "format", "bytes", "chunk_tokens", "created",
//                   "chunks": [{"id", "index", "text", "summary", "hash", "n_tokens",
//                               "cache_id", "state", "error", "uses"}]}]}
//
// The format alone (no engine), so the reader has a fuzz target (fuzz/knowledge_base_file_fuzz.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cf {

struct SavedChunk {
  std::string id, text, summary, hash, cache_id, state, error;
  size_t index = 0, n_tokens = 0;
  uint64_t uses = 0;
};

struct SavedDocument {
  std::string id, name, format;
  size_t bytes = 0, chunk_tokens = 0;
  int64_t created = 0;
  std::vector<SavedChunk> chunks;
};

struct SavedKnowledgeBase {
  uint64_t next_document = 0;  // the last document number handed out
  std::vector<SavedDocument> documents;
};

inline constexpr int kKnowledgeBaseFileVersion = 1;

// What one knowledge base may hold (serve --kb-max-documents, --kb-max-chunks, --kb-max-text;
// issue 59: every store has a budget a user can see): an upload past any of them is 409, and a
// file with more documents or chunks than the first two is set aside at start-up. The text
// bound also bounds knowledge-base.json, which a save rewrites whole.
struct KnowledgeBaseLimits {
  size_t max_documents = 1000;
  size_t max_chunks = 20000;
  size_t max_text_bytes = size_t{64} << 20;  // the chunks' texts together
};

std::string knowledge_base_file_text(const SavedKnowledgeBase& kb);
// Throws std::runtime_error saying what is wrong: not JSON, another version, a missing or
// mistyped field, a duplicate id, a document without chunks, more than the limits allow.
SavedKnowledgeBase parse_knowledge_base_file(std::string_view text, const KnowledgeBaseLimits& limits);

}  // namespace cf
