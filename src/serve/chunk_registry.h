// The registered chunks of `chunkfuse serve` (POST /v1/chunks): id -> text and tokens, mirrored
// in a JSON index (<store dir>/serve-chunks.json, {"version": 1, "chunks": [text, ...]}) so ids
// survive restarts. Ids are content ids recomputed from the texts when the index is read, so
// another model gives other ids. The caches themselves live in the chunk store. Thread-safe.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "model/tokenizer.h"

namespace cf {

struct DocumentRef;
struct PromptLayout;

struct RegisteredChunk {
  std::string id;  // content id of its tokens (kv/chunk_key.h)
  std::string text;
  std::vector<TokenId> tokens;
};

class ChunkRegistry {
 public:
  // The chunk a text becomes under the engine's model (its tokens and content id).
  using ChunkOf = std::function<RegisteredChunk(const std::string& text)>;
  // Reads the index at `index_path` when there is one. A damaged one (not a regular file, not
  // the index's JSON) is renamed to <index_path>.damaged-<UTC time> with a warning on stderr,
  // and the registry starts empty: a damaged index never stops the server (issue 59).
  ChunkRegistry(std::string index_path, ChunkOf chunk_of);

  RegisteredChunk chunk_of(const std::string& text) const { return chunk_of_(text); }
  std::optional<RegisteredChunk> find(const std::string& id) const;
  // Each document's chunk (inline text, or a registered id) appended to layout.chunks and
  // layout.chunk_ids in request order; RequestError 400 (both or neither given) or 404 (an
  // unknown id).
  void lay_out_documents(const std::vector<DocumentRef>& documents, PromptLayout& layout) const;
  // Both write the index first and change the registry only once it is written: a failed
  // write (a full disk) throws RequestError 507 (503 for another I/O fault) with nothing changed.
  void add(std::vector<RegisteredChunk> chunks);
  bool remove(const std::string& id);  // false when unknown
  std::vector<std::string> texts() const;         // in id order
  uint64_t version() const { return version_.load(); }  // changes whenever the chunks do

 private:
  void save_locked(const std::map<std::string, const std::string*>& texts_by_id) const;  // throws

  const std::string path_;
  const ChunkOf chunk_of_;
  mutable std::mutex mu_;
  std::map<std::string, RegisteredChunk> chunks_;
  std::atomic<uint64_t> version_{0};
};

}  // namespace cf
