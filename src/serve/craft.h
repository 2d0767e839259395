// CRAFT (craft-paper.txt §4; digest part A): reorder a request's chunks by how often recent
// requests retrieved them, so that requests sharing chunks share exact token prefixes and
// hit the prefix cache; a chunk-prefix tree (CP-Tree) decides which chunk prefixes are worth
// keeping; conversation-scoped dedup drops chunks a conversation has already seen.
//
// Chunk ids are content ids (hex of the chunk's token hash), so the same passage text is
// the same chunk whether it came inline or registered.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>
#include <memory>

namespace cf {

struct CraftOptions {
  size_t window_requests = 1000;  // CA-Table sliding window (paper default)
  int promotion_threshold = 2;    // CP-Tree promotion/extension threshold (paper default)
  // Deviation (digest A6.1): walk the CP-Tree first, taking the stored path through the
  // request's chunks, then frequency-sort the rest. Keeps hits when frequencies drift.
  bool tree_guided_order = true;
  size_t max_conversations = 10000;  // ChunkMaps kept (least recently used dropped)
  // Bytes of the ChunkMaps together (their ids and seen chunk ids, with node overhead): a
  // conversation's map grows by each turn's documents, so the count alone did not bound them
  // (issue 59); past it the least recently used go, as past max_conversations.
  size_t max_conversation_bytes = size_t{64} << 20;
  size_t max_tree_nodes = 100000;    // CP-Tree nodes kept (least recently used leaves dropped)
};

struct CraftPlan {
  std::vector<size_t> order;     // indices into the request's chunk list, new order (dedup applied)
  std::vector<size_t> dropped;   // indices dropped by conversation dedup
  size_t matched_chunks = 0;     // CP-Tree prefix (in `order`) found before this request
  size_t keep_chunks = 0;        // prefix (in `order`) to keep exact in the prefix cache after it
};

struct CraftStats {
  uint64_t requests = 0, chunks_seen = 0, chunks_deduped = 0;
  uint64_t tree_hits = 0, tree_hit_chunks = 0;
  size_t table_entries = 0, tree_nodes = 0, conversations = 0;
  size_t conversation_bytes = 0;  // what max_conversation_bytes bounds
};

class Craft {
 public:
  explicit Craft(CraftOptions opt = {});
  ~Craft();
  // One request: CA-Table update, dedup (when conversation_id is non-empty), order (when
  // reorder; else the given order), CP-Tree lookup and promotion/extension. Thread-safe.
  // Ties in frequency break by chunk id (request-independent, digest A6.2). A conversation's
  // later turns (its id seen before) follow its history, so they skip the CP-Tree
  // (matched_chunks = keep_chunks = 0).
  CraftPlan plan(const std::vector<std::string>& chunk_ids, const std::string& conversation_id, bool reorder);
  void forget_conversation(const std::string& conversation_id);
  CraftStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cf
