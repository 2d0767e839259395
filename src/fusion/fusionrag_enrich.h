// FusionRAG's offline stage (§3.1, eq. 10): every chunk C_i of a corpus gets a
// neighbour-enriched cache, C_i computed after [S + the independently precomputed caches of
// its n most similar chunks], keeping only C_i's own rows:
//
//   context  = S at 0..|S|-1, then N_1 .. N_n (their PIC caches moved to consecutive
//              positions, most similar first, so the most similar is farthest from C_i)
//   C_i      at |X| .. |X|+|C_i|-1, X = S N_1 .. N_n (the paper's [|X|+1 : |X|+|C_i|], 1-based)
//   key      ChunkKey(model, C_i tokens, KeyContext::neighbours(S, [PIC keys of N_1..N_n]))
//
// The neighbours in the context are base caches (EnrichOptions::chunk_context: prefixed, i.e.
// eq. 5's S-prefixed KV^cached, by default; or PIC caches), never enriched ones (one hop,
// independent of processing order, as the paper's KV^cached in eq. 10). "PIC" below means
// the chunk's base cache of that context.
//
// The index from a chunk's PIC key to its enriched variant lives in the PIC entry itself:
// extra["fusionrag"] = FusionRagLink (enriched key id, its context hash, S, neighbour ids).
// Chosen over a separate index file because it travels with the store through every tier
// (memory-only stores included), needs no second file kept consistent across processes, and
// `chunks rm` of a PIC drops its link with it. The price: enrichment rewrites each PIC file
// once (same K/V, new metadata).
// Reading a whole PIC file only for its link would double a request's loads, so a disk store
// also gets <store>/fusionrag_index.json ({"version": 1, "links": {pic id: link}}), written
// atomically (temp file + rename, under an flock so concurrent enrichers merge, not clobber)
// and read once per process (again when its mtime changes). find_enriched tries it first and
// falls back to the PIC entry's link.
#pragma once
#include <cstddef>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "fusion/rag_prompt.h"
#include "kv/chunk_store.h"

namespace cf {

inline constexpr const char* kFusionRagExtraKey = "fusionrag";
inline constexpr size_t kFusionRagDefaultNeighbours = 10;  // the paper's default top-n

struct FusionRagLink {
  std::string enriched_id;            // key id of the enriched variant
  Hash128 context_hash{};             // its KeyContext::neighbours hash
  std::vector<TokenId> system;        // S it was computed after
  std::vector<std::string> neighbours;  // PIC key ids, most similar first
  double enrich_ms = 0;               // offline cost of the enriched variant

  nlohmann::json to_json() const;
  // nullopt when `j` is not a well-formed link.
  static std::optional<FusionRagLink> from_json(const nlohmann::json& j);
};

// The link a PIC cache carries, if any (nullopt also for a malformed one).
std::optional<FusionRagLink> fusionrag_link(const ChunkCache& pic);

// The enriched key of a chunk, given its PIC key, S and its neighbours' PIC keys.
ChunkKey fusionrag_enriched_key(const ChunkKey& pic_key, std::span<const TokenId> system,
                                std::span<const ChunkKey> neighbours);

// Eq. 10 for one chunk. `system_kv` holds S's K/V at 0..|S|-1; `scratch` is reused across
// calls (its content is replaced). offline_ms covers stitching the context and the pass.
ChunkCache compute_enriched_cache(Forward& fwd, const KvCache& system_kv, std::span<const TokenId> system,
                                  const ChunkCache& pic, std::span<const std::shared_ptr<const ChunkCache>> neighbours,
                                  KvCache& scratch);

// The enriched variant of `pic_key` for a request whose system prefix is `system`: nullptr
// (and `why` says why) when the PIC is missing, carries no link, was enriched after another
// S, or the enriched entry is missing.
std::shared_ptr<const ChunkCache> find_enriched(ChunkStore& store, const ChunkKey& pic_key,
                                                std::span<const TokenId> system, std::string* why = nullptr);

// The index file of a disk store ("" for a memory-only store).
std::string fusionrag_index_path(const ChunkStore& store);
// Its links; empty when the file is missing; malformed links are skipped.
std::map<std::string, FusionRagLink> read_fusionrag_index(const std::string& path);
// Merges `links` into the file (read-merge-write under an exclusive flock), atomically.
void merge_fusionrag_index(const std::string& path, const std::map<std::string, FusionRagLink>& links);

struct CorpusChunk {
  std::string text;             // for similarity
  std::vector<TokenId> tokens;  // the chunk's tokens (its PIC key)
};

// Passages of a corpus file: JSON Lines {"title", "text"} (as read_passages_jsonl), or one
// JSON array whose elements are passages or dataset examples with "ctxs" (musique_s.json):
// every passage of every example, in order.
std::vector<Passage> read_corpus_passages(const std::string& path);

// Tokens + text of each passage as a request would chunk it (RagPromptOptions defaults).
std::vector<CorpusChunk> corpus_chunks(const Model& model, const std::vector<Passage>& passages,
                                       const RagPromptOptions& opt = {});

// The default S of build_rag_request (chat template + default system message).
std::vector<TokenId> default_system_tokens(const Model& model, const RagPromptOptions& opt = {});

struct EnrichOptions {
  size_t neighbours = kFusionRagDefaultNeighbours;
  std::vector<TokenId> system;                       // S
  // The base caches: of the chunks (what the link hangs on) and of the neighbours in the
  // offline context. prefixed is eq. 10 as written (KV^cached of eq. 5, computed after S);
  // alone is this engine's earlier reading (PIC neighbours). Keyed apart, so both coexist.
  // Must match the chunk context of the requests that will use them (FusionOptions), whose
  // default is alone; the paper's setting is prefixed for both.
  ChunkContext chunk_context = ChunkContext::alone;
  size_t limit = std::numeric_limits<size_t>::max();  // enrich only the first `limit` unique chunks
  // Progress: (phase "pic" or "enrich", done, total).
  std::function<void(const char*, size_t, size_t)> progress;
};

struct EnrichReport {
  size_t chunks = 0, unique = 0, duplicates_or_empty = 0;
  size_t pic_computed = 0, pic_present = 0;
  size_t enriched = 0, enriched_present = 0;
  size_t no_neighbours = 0;        // chunks sharing no term with any other: not enriched
  double similarity_ms = 0;        // BM25 index + neighbour search, whole corpus
  double pic_ms = 0;               // forward passes of the PIC caches computed
  std::vector<double> enrich_ms;   // per enriched chunk: stitching + forward pass
  size_t enriched_tokens = 0, context_tokens = 0;  // chunk rows computed, context rows attended
};

// Both passes over a corpus: PIC caches of the chunks (and of the neighbours they need),
// then the enriched caches, each stored, with links written into the PIC entries. Chunks
// already enriched with the same S and neighbours are skipped.
EnrichReport enrich_corpus(Forward& fwd, ChunkStore& store, const std::vector<CorpusChunk>& corpus,
                           const EnrichOptions& opt);

// The offline stage for one request's chunks (bench, deviation tool): its chunks enriched
// (eq. 10, n = 10) with the request's S, their neighbours searched among the chunks
// themselves and `knowledge_base`, base caches of `chunk_context`.
EnrichReport enrich_request_chunks(Forward& fwd, ChunkStore& store, const RagRequest& request,
                                   const std::vector<CorpusChunk>& knowledge_base, ChunkContext chunk_context);

}  // namespace cf
