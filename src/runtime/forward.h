// The one primitive everything in chunkfuse is built from: a transformer forward pass over
// an explicit list of (token, position) rows against a KV cache.
//
//  - Rows may come in any order and at any positions.
//  - Each row's K/V is written into the cache (at a new entry, or over an existing entry
//    when `slots` says so: selective recompute) BEFORE attention, so rows of one pass see
//    each other's fresh K/V (QCFuse Eq. 7 semantics).
//  - Attention is causal by position: row r sees cache entry e iff pos(e) <= pos(r).
//  - Logits are computed only for the rows asked for.
//  - Hooks can read, per layer and for chosen rows, the hidden state, Q/K/V and attention
//    probabilities, and the pass can stop after a given layer.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "model/model.h"
#include "runtime/kv_cache.h"

namespace cf {

class ThreadPool;

struct ForwardInput {
  std::span<const TokenId> tokens;
  std::span<const int32_t> positions;     // one per token
  std::span<const size_t> slots;          // empty: append new entries in row order
  std::span<const size_t> logit_rows;     // rows (indices into tokens) whose logits we want
  // Which of llama.cpp's two orders K-quant weights follow in this pass (WeightMatrix::
  // KQuantOrder). Batched (its tiled GEMM) by default, whatever the number of rows, so that
  // every way of splitting a prompt (prefix cache, chunk caches, recomputation) gives the
  // same bits as one full prefill. A generation step takes PerRow (its vec-dot, what it
  // uses for one token), a whole prompt may take ByRowCount (its own rule) to equal
  // llama.cpp's prompt evaluation also below 8 tokens. A pass of several sequences takes
  // their common order, or Batched when they differ.
  WeightMatrix::KQuantOrder kquant_order = WeightMatrix::KQuantOrder::Batched;
};

// What a hook sees at one layer, for the rows it asked for. Pointers are valid only
// during the callback. Arrays are row-major, one row per entry of `rows`.
struct LayerTap {
  int layer = 0;
  std::span<const size_t> rows;
  const float* hidden_in = nullptr;   // [rows][d_model] residual stream entering the layer
  const float* hidden_out = nullptr;  // [rows][d_model] leaving the layer
  const float* q = nullptr;           // [rows][n_heads * head_dim], after RoPE
  const float* k = nullptr;           // [rows][kv_dim], after RoPE
  const float* v = nullptr;           // [rows][kv_dim]
  // [rows][n_heads][n_entries]: softmax over all cache entries (0 where masked).
  const float* attn_probs = nullptr;
  size_t n_entries = 0;
};

struct ForwardHooks {
  std::vector<size_t> rows;            // rows to capture (indices into the input)
  bool capture_attention = false;      // fills LayerTap::attn_probs (costly: rows x heads x entries)
  std::vector<int> layers;             // layers to call back at; empty = all
  int stop_after_layer = -1;           // >= 0: skip the rest of the pass after this layer
  std::function<void(const LayerTap&)> on_layer;
  // Called after every layer l (after on_layer): the input rows it returns leave the pass.
  // Their K/V in layers > l stay as the cache holds them and their hidden states are not
  // computed further (Cache-Craft's focused-chunk early stop). Rows asked for logits or
  // captured by `rows` cannot leave (std::invalid_argument).
  std::function<std::vector<size_t>(int layer)> retire_after_layer;
  // Per-layer visibility (QCFuse's per-layer anchor sets): when set and it returns non-null
  // for a layer, those positions (one per cache entry) replace the cache's in that layer's
  // causal mask; kHiddenEntry hides an entry there. Keys keep their rotation. Single-sequence
  // passes only.
  static constexpr int32_t kHiddenEntry = INT32_MAX;
  std::function<const int32_t*(int layer)> mask_positions;

  // Hooks that only stop the pass (CacheBlend's fresh pass up to its check layer): each row's
  // result does not depend on the other rows beyond what the cache holds, so such a pass may
  // be cut into rows like a pass without hooks.
  bool only_stop() const {
    return rows.empty() && !capture_attention && !on_layer && !retire_after_layer && !mask_positions;
  }
};

struct ForwardOutput {
  std::vector<float> logits;           // [logit_rows.size()][vocab]
  size_t vocab = 0;
  std::vector<size_t> slots;           // cache entry of each input row
  bool stopped_early = false;
  const float* row_logits(size_t i) const { return logits.data() + i * vocab; }
};

// One sequence of a batched pass: its own cache and rows (hooks are not supported).
struct BatchSequence {
  KvCache* cache = nullptr;
  ForwardInput input;
};

class Forward {
 public:
  Forward(const Model& model, ThreadPool& pool);
  // Throws std::invalid_argument on inconsistent input (sizes, token ids out of range,
  // slots out of range, negative positions). An append of more than kMaxPassRows rows with
  // increasing positions and no hooks (or hooks that only stop it, without logits) runs as
  // several passes (same results, bounded memory).
  ForwardOutput run(KvCache& cache, const ForwardInput& in, const ForwardHooks* hooks = nullptr);
  static constexpr size_t kMaxPassRows = 512;
  static constexpr size_t kMinSplitRows = 4;  // a PassSplit's max_rows is raised to this

  // Chunked prefill (issue 58 item 1): whoever owns this Forward (the server's scheduler) may
  // cut every long pass run() makes into passes of at most `max_rows` rows and do other work
  // between them, such as a decode step of other sequences. Applies to the passes run()
  // already splits (no hooks, increasing positions), now also with explicit slots (a fused
  // prefill's recomputed rows); each row's result is that of one pass (run_in_passes).
  // `between` runs after every pass but the last; it may call run_batch (not split again).
  // What it throws leaves run(), the cache holding the rows of the passes done. `next_rows`
  // (optional) is asked before each pass how many of the rows left, given their positions, it
  // may take (clamped to [2, max_rows]; a
  // pass of one row is never cut off, see end_of_pass), so that the owner can size a pass by the
  // time it may take (serve --itl-target-ms).
  //
  // A pass with hooks that see every row of a layer at once (a selector's probe: QCFuse's
  // question rows, FusionRAG's and Cache-Craft's attention captures, a chunk's kvzip scoring)
  // cannot be cut into rows (hooks that only stop it can: ForwardHooks::only_stop); with
  // `between_layers` set it is cut into runs of layers instead: before
  // each run next_rows is asked as for a piece (rows of a whole pass through every layer), and
  // the run takes that share of the layers, n_layers x rows / the pass's rows (at least one);
  // `between_layers` runs after every run but the last. Hooks and results do not change: the
  // pass only waits between two layers (its own state stays in run's locals; what runs in the
  // pause uses other caches and is not split).
  struct PassSplit {
    size_t max_rows = 0;  // 0 or no `between`: passes of kMaxPassRows, nothing between
    std::function<void(std::span<const int32_t> done)> between;  // `done`: the positions of the pass just run
    std::function<size_t(std::span<const int32_t> positions)> next_rows;  // of the rows left; unset: max_rows
    std::function<void()> between_layers;  // unset: hooked passes run whole
  };
  void set_pass_split(PassSplit split) { split_ = std::move(split); }
  // Several independent sequences in one pass (continuous batching of decode steps): the
  // matrix products run over all rows together, attention per sequence over its own cache.
  // Each sequence's output equals what run() gives it alone (the kernels are batch-invariant).
  std::vector<ForwardOutput> run_batch(std::span<const BatchSequence> sequences);

  const Model& model() const { return model_; }
  ThreadPool& pool() { return pool_; }

 private:
  std::vector<ForwardOutput> run_sequences(std::span<const BatchSequence> sequences, const ForwardHooks* hooks);
  ForwardOutput run_in_passes(KvCache& cache, const ForwardInput& in, const ForwardHooks* stop, size_t first_end,
                              size_t max_rows);
  size_t split_rows() const { return std::clamp(split_.max_rows, kMinSplitRows, kMaxPassRows); }
  int layers_of_next_run(std::span<const int32_t> positions, int from) const;
  void pause(const std::function<void()>& work);  // runs `work` with splitting off
  size_t end_of_pass(std::span<const int32_t> positions, size_t begin, size_t max_rows) const;
  const Model& model_;
  ThreadPool& pool_;
  bool splitting() const { return split_.between && split_.max_rows > 0 && !in_between_; }
  PassSplit split_;
  bool in_between_ = false;  // inside split_.between: passes are not split again
};

}  // namespace cf
