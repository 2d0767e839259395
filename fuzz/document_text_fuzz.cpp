// Fuzz target for the web page's upload parsers (issue 12): text, CSV and JSON Lines
// extraction (serve/document_text.h; PDF goes to pdftotext, a separate process, so it is not
// fuzzed here), then paragraph chunking and the summary. Bad input may be refused with
// RequestError; anything else (a crash, a sanitizer report, a chunk over its budget that
// could have been cut) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "serve/chunking.h"
#include "serve/document_text.h"
#include "serve/engine.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const char* kFormats[] = {"txt", "md", "csv", "jsonl", "xyz"};
  const std::string format = kFormats[data[0] % 5];
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string text;
  try {
    text = cf::extract_document_text(format, bytes);
  } catch (const cf::RequestError&) {
    return 0;
  }
  auto count = [](std::string_view s) { return s.size() / 4 + 1; };  // a stand-in tokenizer
  const size_t budget = 8 + data[0] % 64;
  for (const auto& c : cf::split_into_chunks(text, budget, count)) {
    if (c.empty()) std::abort();
    (void)cf::first_sentence(c, 40);
  }
  return 0;
}
