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

std::string knowledge_base_file_text(const SavedKnowledgeBase& kb);
// Throws std::runtime_error saying what is wrong: not JSON, another version, a missing or
// mistyped field, a duplicate id, a document without chunks, more than the limits allow.
SavedKnowledgeBase parse_knowledge_base_file(std::string_view text, size_t max_documents, size_t max_chunks);

}  // namespace cf
