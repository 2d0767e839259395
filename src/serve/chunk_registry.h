// The registered chunks of `chunkfuse serve` (POST /v1/chunks): id -> text and tokens, mirrored
// in a JSON index (<store dir>/serve-chunks.json, {"version": 1, "chunks": [text, ...]}) so ids
// survive restarts. A registration appends its new texts (one JSON string a line) to
// <index>.journal and fsyncs it; the index is rewritten with everything, and the journal
// removed, when the journal would outgrow the index, on a removal, and at start when a journal
// is there (issue 59: the knowledge base registers its chunks one at a time, and rewriting the
// whole index each time cost n^2/2 texts of writes for n chunks; now the bytes written stay
// within a few times the index's size). A torn last journal line (a crash mid-append) is left
// out; a journal with a bad line is read up to it and set aside like a damaged index. Ids are content ids recomputed from the texts when the index is read, so
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
  // `budget_bytes` bounds what add() keeps in memory (texts and tokens, bytes_of()): a
  // registration past it is RequestError 409 naming serve --registry-budget; an index read at
  // start is kept whole even when it is larger (nothing stored is dropped). 0: unbounded.
  ChunkRegistry(std::string index_path, ChunkOf chunk_of, size_t budget_bytes = 0);

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
  size_t bytes() const;                           // what the budget counts, all chunks together
  static size_t bytes_of(const RegisteredChunk& c) { return c.text.size() + c.tokens.size() * sizeof(TokenId); }
  uint64_t version() const { return version_.load(); }  // changes whenever the chunks do
  // Bytes written to the index files, and writes (issue 59: counted for tests).
  uint64_t index_bytes_written() const { return index_bytes_.load(); }
  uint64_t index_writes() const { return index_writes_.load(); }

 private:
  void save_locked(const std::map<std::string, const std::string*>& texts_by_id);  // the index; throws
  void append_locked(const std::string& lines);  // to the journal, truncated back on failure; throws
  void read_journal();                           // constructor
  void keep_locked(RegisteredChunk c);           // into chunks_, counted in bytes_


  const std::string path_;
  const ChunkOf chunk_of_;
  const std::string journal_path_;                  // <index>.journal
  const size_t budget_bytes_;
  size_t bytes_ = 0;                                // sum of bytes_of over chunks_
  size_t index_bytes_now_ = 0, journal_bytes_ = 0;  // the files' sizes as this registry left them
  mutable std::mutex mu_;
  std::map<std::string, RegisteredChunk> chunks_;
  std::atomic<uint64_t> version_{0};
  mutable std::atomic<uint64_t> index_bytes_{0}, index_writes_{0};
};

}  // namespace cf
