// The knowledge base behind the web page (issue 12, items 1-2; QCFuse demo paper §4): uploaded
// documents split into chunks (chunking.h), each chunk's K/V cache precomputed into the
// engine's chunk store by a background thread (progress visible per document), BM25
// retrieval over the chunks (fusion/bm25.h) and per-chunk use counts.
//
// Chunks are registered with the engine like POST /v1/chunks does, so their caches live in
// the one chunk store and a request that retrieves them hits them. The cache state
// (chunk_cache_state.h) says which tiers hold a chunk and which methods' offline work it has.
//
// Retrieval keeps one BM25 index (fusion/bm25.h), updated as chunks come and go, never rebuilt
// per query (issue 59).
//
// Persistence (knowledge_base_file.h): documents, chunks (text, summary, hash, cache id)
// and use counts are saved to <store folder>/knowledge-base.json after every change (written
// atomically, 0600, never through a symlink; an upload or a delete is written before it is
// made in memory, so a full disk refuses it with 507 and changes nothing, issue 59) and read
// back when the server starts. Use counts alone (a completion that used retrieved chunks) are
// not worth a rewrite and fsync of the whole file per request: they are saved by the worker at
// most once a second (kSaveAfter) and when the knowledge base closes (issue 59); a crash loses
// at most that second's counts. A chunk
// whose cache the engine no longer holds is queued again. A damaged file is reported in one
// line, renamed aside to knowledge-base.json.damaged and the server starts with an empty
// knowledge base.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fusion/bm25.h"
#include "serve/busy_gate.h"
#include "serve/document_text.h"
#include "serve/knowledge_base_file.h"
#include "serve/request.h"

namespace cf {

class Engine;

struct KnowledgeBaseOptions {
  size_t default_chunk_tokens = 200;
  size_t max_chunk_tokens = 2048;
  KnowledgeBaseLimits limits;
  ExtractOptions extract;
  size_t max_pdf_jobs = 2;     // pdftotext processes at once; another upload waits pdf_wait_ms, then 503
  size_t pdf_wait_ms = 10000;
};

struct RetrievedChunk {
  std::string chunk_id, document_id, source, text;
  std::string cache_id;  // the engine's chunk id once precomputed
  double score = 0;
  size_t n_tokens = 0;
  nlohmann::json to_json() const;
};

class KnowledgeBase {
 public:
  KnowledgeBase(Engine& engine, KnowledgeBaseOptions opt = {});
  ~KnowledgeBase();  // stops the precompute thread (a chunk being computed finishes first)
  KnowledgeBase(const KnowledgeBase&) = delete;
  KnowledgeBase& operator=(const KnowledgeBase&) = delete;

  // Extracts, splits and queues a document; returns its JSON (status "precomputing").
  // chunk_tokens 0: the default. Throws RequestError (400/413/415) on bad input.
  nlohmann::json add_document(const std::string& name, const std::string& format, std::string_view bytes,
                              size_t chunk_tokens);
  nlohmann::json list_documents() const;
  std::optional<nlohmann::json> document(const std::string& id) const;  // with its chunks and their text
  nlohmann::json list_chunks() const;                                    // every chunk, without text
  const Tokenizer& tokenizer() const;  // the engine's
  size_t max_documents() const;        // the engine's documents per request
  bool remove_document(const std::string& id);
  bool remove_chunk(const std::string& chunk_id);

  // The best k chunks for the query by BM25 (positive scores only), best first.
  std::vector<RetrievedChunk> retrieve(const std::string& query, size_t k) const;
  void note_used(const std::vector<RetrievedChunk>& chunks);
  // Blocks until every queued chunk is computed (tests); chunks waiting to be retried after a
  // refused write (a full disk) do not count.
  void wait_idle();
  // Failed saves, registrations and cache drops of the background work (logged on stderr;
  // /metrics chunkfuse_knowledge_background_failures_total). None of them ends the process.
  uint64_t background_failures() const { return background_failures_.load(); }
  // The work that grows with the knowledge base's size (issue 59), counted for tests:
  // knowledge-base.json written, and BM25 indexes built over every chunk (none since: the
  // index is updated in place).
  uint64_t file_writes() const { return file_writes_.load(); }
  uint64_t bm25_builds() const { return bm25_builds_.load(); }

  const KnowledgeBaseOptions& options() const { return opt_; }

 private:
  struct Chunk {
    std::string id, document_id, text, summary, hash, cache_id, error;
    size_t index = 0, n_tokens = 0;
    std::string state = "queued";  // queued | computing | ready | failed
    uint64_t uses = 0;
    std::vector<std::string> terms;  // BM25
    size_t slot = kNotIndexed;       // in index_ (every chunk but failed ones)
  };
  static constexpr size_t kNotIndexed = static_cast<size_t>(-1);
  struct Document {
    std::string id, name, format;
    size_t bytes = 0, chunk_tokens = 0;
    int64_t created = 0;
    std::vector<std::string> chunk_ids;
  };
  nlohmann::json document_json_locked(const Document& d) const;
  // RequestError 409 naming the limit and its serve flag when a document of n_chunks chunks
  // and n_bytes of text would not fit (KnowledgeBaseLimits).
  void check_room_locked(size_t n_chunks, size_t n_bytes) const;
  void add_chunk_locked(Chunk c);  // into chunks_, the text count and the BM25 index
  std::string extract_text(const std::string& format, std::string_view bytes);  // PDFs through pdf_gate_
  std::string file_path() const;  // <store folder>/knowledge-base.json
  void load();                    // constructor: reads the file (if any)
  static SavedDocument saved_document(const Document& d, const std::function<const Chunk*(const std::string&)>& chunk_of);
  SavedKnowledgeBase saved_locked(const std::set<std::string>& leave_out) const;  // the file, less those chunks
  void write_file(const SavedKnowledgeBase& kb) const;  // RequestError 507 (full disk) / 503 on failure
  void save_locked() const;  // use counts and states: failures are reported and counted, not thrown
  nlohmann::json chunk_json_locked(const Chunk& c, bool with_text) const;  // cache state left to:
  void fill_cache_states(nlohmann::json& chunks) const;                     // without the lock
  void remove_chunks_locked(const std::vector<std::string>& ids);  // write, then commit
  void drop_cache_locked(const std::string& cache_id);              // unless shared; never throws
  void worker();
  void precompute_locked(std::unique_lock<std::mutex>& lk, const std::string& id);
  void note_failure(const std::string& what, const std::exception& e) const;
  void index_locked(Chunk& c);
  void unindex_locked(Chunk& c);

  Engine& engine_;
  const KnowledgeBaseOptions opt_;
  BusyGate pdf_gate_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Document> documents_;  // by id (ids sort by upload order)
  std::map<std::string, Chunk> chunks_;
  size_t text_bytes_ = 0;  // chunks_' texts together (KnowledgeBaseLimits::max_text_bytes)
  std::deque<std::string> queue_;  // chunk ids to precompute
  std::vector<std::string> retry_;  // refused by a full disk: back in the queue at retry_at_
  std::chrono::steady_clock::time_point retry_at_;
  static constexpr std::chrono::seconds kRetryAfter{5};
  Bm25Index index_;
  std::vector<const Chunk*> by_slot_;  // index_'s slot -> chunk (nodes of chunks_ do not move)
  // Use counts changed since the file was written; the worker saves them at save_at_.
  mutable bool dirty_ = false;
  mutable std::chrono::steady_clock::time_point save_at_;
  bool rethink_ = false;  // the worker's deadlines changed
  static constexpr std::chrono::seconds kSaveAfter{1};
  mutable std::atomic<uint64_t> background_failures_{0};
  mutable std::atomic<uint64_t> file_writes_{0}, bm25_builds_{0};
  bool busy_ = false, stop_ = false;
  uint64_t next_document_ = 0;
  std::thread thread_;
};

}  // namespace cf
