#include "runtime/forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>

#include "base/thread_pool.h"
#include "runtime/attention.h"
#include "runtime/rope.h"
#include "runtime/vector_math.h"

namespace cf {
namespace {

void check_input(const ModelHparams& h, const KvCache& cache, const ForwardInput& in) {
  const size_t n = in.tokens.size();
  if (in.positions.size() != n)
    throw std::invalid_argument("forward: " + std::to_string(n) + " tokens but " +
                                std::to_string(in.positions.size()) + " positions");
  if (!in.slots.empty() && in.slots.size() != n)
    throw std::invalid_argument("forward: slots given for " + std::to_string(in.slots.size()) + " of " +
                                std::to_string(n) + " rows");
  if (cache.n_layers() != h.n_layers || cache.kv_dim() != h.kv_dim())
    throw std::invalid_argument("forward: KV cache belongs to a model of another shape");
  for (size_t i = 0; i < n; ++i) {
    if (in.tokens[i] < 0 || in.tokens[i] >= h.vocab_size)
      throw std::invalid_argument("forward: token id " + std::to_string(in.tokens[i]) + " out of range");
    if (in.positions[i] < 0) throw std::invalid_argument("forward: negative position");
    if (!in.slots.empty() && in.slots[i] >= cache.size())
      throw std::invalid_argument("forward: slot " + std::to_string(in.slots[i]) + " beyond the cache (" +
                                  std::to_string(cache.size()) + " entries)");
  }
  for (size_t r : in.logit_rows)
    if (r >= n) throw std::invalid_argument("forward: logit row " + std::to_string(r) + " out of range");
}

// Copies the rows `rows` of a [n][dim] matrix into dst [rows.size()][dim].
void gather_rows(const float* src, size_t dim, std::span<const size_t> rows, std::vector<float>& dst) {
  dst.resize(rows.size() * dim);
  for (size_t i = 0; i < rows.size(); ++i) std::memcpy(&dst[i * dim], src + rows[i] * dim, dim * sizeof(float));
}

}  // namespace

Forward::Forward(const Model& model, ThreadPool& pool) : model_(model), pool_(pool) {}

ForwardOutput Forward::run(KvCache& cache, const ForwardInput& in, const ForwardHooks* hooks) {
  const size_t max_rows = splitting() ? split_rows() : kMaxPassRows;
  const bool by_rows = !hooks || (hooks->only_stop() && in.logit_rows.empty());
  if (by_rows && in.tokens.size() > 1 &&
      std::adjacent_find(in.positions.begin(), in.positions.end(), std::greater_equal<>()) == in.positions.end()) {
    const size_t first_end = end_of_pass(in.positions, 0, max_rows);
    if (first_end < in.tokens.size()) {
      check_input(model_.hparams(), cache, in);  // all of it, before a first pass touches the cache
      return run_in_passes(cache, in, hooks, first_end, max_rows);
    }
  }
  const BatchSequence seq{&cache, in};
  return std::move(run_sequences(std::span<const BatchSequence>(&seq, 1), hooks).front());
}

// A long pass with increasing positions (a prompt, a chunk, a fused prefill's recomputed rows
// and question) as consecutive passes of at most pass_rows rows, as llama.cpp's micro-batches
// (n_ubatch 512). Each row's result is the same as in one pass: attention reads K/V from the
// cache, where every earlier row's entry already is, and no row sees a later one (causal by
// position); the matrix kernels are batch-invariant (a ByRowCount order is then decided per
// pass, as llama.cpp decides per micro-batch). Rows written into given slots get their
// positions first, as one pass gives them: a slot still waiting for its pass (a question row
// appended with K/V zero at position 0) is then later than every row of the passes before it,
// hence invisible to them, as in one pass. What passes buy is bounded scratch memory
// (activations for 512 rows: about 100 MB less for a 2048-token prompt on Qwen2.5-0.5B) and,
// with a PassSplit, room for other work between them. Hooks that only stop the pass after a
// layer stop every piece there (the rows of later pieces see those layers' K/V, nothing after).
ForwardOutput Forward::run_in_passes(KvCache& cache, const ForwardInput& in, const ForwardHooks* stop, size_t first_end,
                                     size_t max_rows) {
  const size_t n = in.tokens.size();
  ForwardOutput out;
  out.vocab = static_cast<size_t>(model_.hparams().vocab_size);
  out.slots.reserve(n);
  out.logits.resize(in.logit_rows.size() * out.vocab);
  for (size_t i = 0; i < in.slots.size(); ++i) cache.set_position(in.slots[i], in.positions[i]);
  for (size_t begin = 0, end = 0; begin < n; begin = end) {
    end = begin == 0 ? first_end : end_of_pass(in.positions, begin, max_rows);
    ForwardInput part = in;
    part.tokens = in.tokens.subspan(begin, end - begin);
    part.positions = in.positions.subspan(begin, end - begin);
    if (!in.slots.empty()) part.slots = in.slots.subspan(begin, end - begin);
    std::vector<size_t> rows, where;  // this pass's logit rows and their place in the output
    for (size_t i = 0; i < in.logit_rows.size(); ++i)
      if (in.logit_rows[i] >= begin && in.logit_rows[i] < end) {
        rows.push_back(in.logit_rows[i] - begin);
        where.push_back(i);
      }
    part.logit_rows = rows;
    const BatchSequence seq{&cache, part};
    ForwardOutput o = std::move(run_sequences(std::span<const BatchSequence>(&seq, 1), stop).front());
    out.stopped_early = o.stopped_early;
    out.slots.insert(out.slots.end(), o.slots.begin(), o.slots.end());
    for (size_t i = 0; i < where.size(); ++i)
      std::copy_n(o.row_logits(i), out.vocab, out.logits.begin() + static_cast<std::ptrdiff_t>(where[i] * out.vocab));
    if (end < n && splitting()) pause([&] { split_.between(part.positions); });
  }
  return out;
}

void Forward::pause(const std::function<void()>& work) {
  in_between_ = true;
  struct Reset {
    bool& flag;
    ~Reset() { flag = false; }
  } reset{in_between_};
  work();
}

// The layers a hooked pass runs before its next pause (PassSplit::between_layers), from layer
// `from`: the share of the model's layers that the rows next_rows grants a whole pass buy.
int Forward::layers_of_next_run(std::span<const int32_t> positions, int from) const {
  const int n_layers = model_.hparams().n_layers;
  const size_t max_rows = split_rows();
  const size_t rows = split_.next_rows ? std::clamp<size_t>(split_.next_rows(positions), 2, max_rows) : max_rows;
  const size_t layers = static_cast<size_t>(n_layers) * rows / std::max<size_t>(positions.size(), 1);
  return static_cast<int>(std::clamp<size_t>(layers, 1, static_cast<size_t>(n_layers - from)));
}

// Where the pass that starts at row `begin` of a pass at `positions` ends: max_rows later, or what the
// PassSplit's owner asks for within [2, max_rows] (max_rows >= kMinSplitRows). No pass is of a
// single row when the whole has more: the attention of one row takes the decode path, another
// summation order, and the rows would then differ from one pass's by a last bit.
size_t Forward::end_of_pass(std::span<const int32_t> positions, size_t begin, size_t max_rows) const {
  const size_t n = positions.size();
  size_t rows = max_rows;
  if (splitting() && split_.next_rows) rows = std::clamp<size_t>(split_.next_rows(positions.subspan(begin)), 2, max_rows);
  if (n - begin <= rows) return n;
  if (n - begin - rows == 1) rows = rows < max_rows ? rows + 1 : rows - 1;
  return begin + rows;
}

std::vector<ForwardOutput> Forward::run_batch(std::span<const BatchSequence> sequences) {
  return run_sequences(sequences, nullptr);
}

// The pass over all rows of all sequences: per-row work (norms, projections, RoPE, the MLP)
// runs on the concatenated rows, attention per sequence over its own cache. Row i of
// sequence s is global row offset[s] + i. Hooks see global rows, which equal the rows of
// the input when there is one sequence (the only case run() allows hooks for).
std::vector<ForwardOutput> Forward::run_sequences(std::span<const BatchSequence> seqs, const ForwardHooks* hooks) {
  const ModelHparams& h = model_.hparams();
  if (hooks && seqs.size() != 1) throw std::invalid_argument("forward: hooks need exactly one sequence");
  std::vector<size_t> offset(seqs.size() + 1, 0);
  for (size_t s = 0; s < seqs.size(); ++s) {
    if (!seqs[s].cache) throw std::invalid_argument("forward: sequence without a cache");
    for (size_t t = 0; t < s; ++t)
      if (seqs[t].cache == seqs[s].cache) throw std::invalid_argument("forward: two sequences share one cache");
    check_input(h, *seqs[s].cache, seqs[s].input);
    offset[s + 1] = offset[s] + seqs[s].input.tokens.size();
  }
  if (hooks)  // before any cache is touched: bad input changes nothing
    for (size_t r : hooks->rows)
      if (r >= offset.back()) throw std::invalid_argument("forward: hook row " + std::to_string(r) + " out of range");
  const std::vector<size_t> input_offset = offset;
  auto order = seqs.empty() ? WeightMatrix::KQuantOrder::Batched : seqs.front().input.kquant_order;
  for (const BatchSequence& s : seqs)
    if (s.input.kquant_order != order) order = WeightMatrix::KQuantOrder::Batched;
  size_t n = offset.back();  // live rows; rows retired by a hook leave (single sequence only)
  const size_t n_input = n;
  const size_t d = h.d_model, qd = h.q_dim(), kvd = h.kv_dim(), ff = h.d_ff;
  std::vector<ForwardOutput> outs(seqs.size());
  for (auto& o : outs) o.vocab = h.vocab_size;
  if (n == 0) return outs;

  // Where each row's K/V goes, and each row's token, position and cache.
  std::vector<TokenId> tokens(n);
  std::vector<int32_t> positions(n);
  std::vector<size_t> slots(n);
  std::vector<KvCache*> row_cache(n);
  for (size_t s = 0; s < seqs.size(); ++s) {
    const ForwardInput& in = seqs[s].input;
    KvCache& cache = *seqs[s].cache;
    const size_t ns = in.tokens.size();
    ForwardOutput& out = outs[s];
    out.slots.resize(ns);
    if (in.slots.empty()) {
      const size_t first = ns ? cache.append(ns) : cache.size();
      for (size_t i = 0; i < ns; ++i) out.slots[i] = first + i;
    } else {
      std::copy(in.slots.begin(), in.slots.end(), out.slots.begin());
    }
    for (size_t i = 0; i < ns; ++i) {
      cache.set_position(out.slots[i], in.positions[i]);
      tokens[offset[s] + i] = in.tokens[i];
      positions[offset[s] + i] = in.positions[i];
      slots[offset[s] + i] = out.slots[i];
      row_cache[offset[s] + i] = &cache;
    }
  }
  // live_of_input[r]: where input row r sits among the live rows (npos once retired).
  constexpr size_t kRetired = static_cast<size_t>(-1);
  std::vector<size_t> live_of_input(n), input_of_live(n);
  for (size_t i = 0; i < n; ++i) live_of_input[i] = input_of_live[i] = i;
  std::vector<size_t> tap_rows = hooks ? hooks->rows : std::vector<size_t>{};  // live indices of hooks->rows

  std::vector<float> x(n * d), xn(n * d), q(n * qd), k(n * kvd), v(n * kvd), attn(n * qd);
  std::vector<float> gate(n * ff), up(n * ff);

  pool_.parallel_range(n, [&](size_t b, size_t e, size_t) {
    for (size_t i = b; i < e; ++i) {
      model_.token_embedding().dequantize_weight_row(tokens[i], &x[i * d]);
      if (h.embed_scale != 1.f)  // Gemma: embeddings times sqrt(d_model), as ggml_scale
        for (size_t j = 0; j < d; ++j) x[i * d + j] *= h.embed_scale;
    }
  });

  std::vector<float> tap_hidden_in, tap_hidden_out, tap_q, tap_k, tap_v, tap_probs;
  // Gemma's post-norms: RMSNorm in place over the n rows of a block's output.
  auto post_norm = [&](const std::vector<float>& weight, float* rows, size_t n_rows) {
    pool_.parallel_range(n_rows, [&](size_t b, size_t e, size_t) {
      for (size_t i = b; i < e; ++i) rms_norm(&rows[i * d], weight.data(), &rows[i * d], d, h.rms_eps);
    });
  };
  const bool any_hook = hooks && hooks->on_layer;
  // A hooked pass pauses between runs of layers (PassSplit::between_layers); run_end: the
  // layer before which the current run ends.
  const bool layer_pauses = hooks && !hooks->only_stop() && splitting() && split_.between_layers;
  int run_end = layer_pauses ? layers_of_next_run(std::span(positions.data(), n), 0) : h.n_layers;

  for (int l = 0; l < h.n_layers; ++l) {
    const LayerWeights& w = model_.layers()[l];
    const AttentionShape shape = attention_shape(h, l);
    const float rope_base = h.rope_base_of(l);
    const bool tap_here = any_hook && (hooks->layers.empty() ||
                                       std::find(hooks->layers.begin(), hooks->layers.end(), l) != hooks->layers.end());
    if (tap_here) gather_rows(x.data(), d, tap_rows, tap_hidden_in);

    pool_.parallel_range(n, [&](size_t b, size_t e, size_t) {
      for (size_t i = b; i < e; ++i) rms_norm(&x[i * d], w.attn_norm.data(), &xn[i * d], d, h.rms_eps);
    });
    w.wq.multiply(xn.data(), n, d, q.data(), qd, pool_, order);
    w.wk.multiply(xn.data(), n, d, k.data(), kvd, pool_, order);
    w.wv.multiply(xn.data(), n, d, v.data(), kvd, pool_, order);

    pool_.parallel_range(n, [&](size_t b, size_t e, size_t) {
      for (size_t i = b; i < e; ++i) {
        float* qi = &q[i * qd];
        float* ki = &k[i * kvd];
        float* vi = &v[i * kvd];
        if (h.qkv_bias) {
          add_inplace(qi, w.bq.data(), qd);
          add_inplace(ki, w.bk.data(), kvd);
          add_inplace(vi, w.bv.data(), kvd);
        }
        if (h.qk_norm) {
          for (int hh = 0; hh < h.n_heads; ++hh)
            rms_norm(qi + hh * h.head_dim, w.q_norm.data(), qi + hh * h.head_dim, h.head_dim, h.rms_eps);
          for (int hh = 0; hh < h.n_kv_heads; ++hh)
            rms_norm(ki + hh * h.head_dim, w.k_norm.data(), ki + hh * h.head_dim, h.head_dim, h.rms_eps);
        }
        rope_rotate(qi, h.n_heads, h.head_dim, positions[i], rope_base, h.rope_style, h.rope_factors());
        rope_rotate(ki, h.n_kv_heads, h.head_dim, positions[i], rope_base, h.rope_style, h.rope_factors());
        // Rounded here too (not only in the cache) so that hooks see the K/V attention uses.
        round_to_f16(ki, kvd);
        round_to_f16(vi, kvd);
        // Write-back before attention: every row of this pass sees the fresh K/V of the others.
        row_cache[i]->write_k(l, slots[i], 1, ki);
        row_cache[i]->write_v(l, slots[i], 1, vi);
      }
    });

    const int32_t* masked_positions = hooks && hooks->mask_positions ? hooks->mask_positions(l) : nullptr;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const size_t ns = offset[s + 1] - offset[s];
      if (ns == 0) continue;
      const KvCache& cache = *seqs[s].cache;
      attention(shape, &q[offset[s] * qd], &positions[offset[s]], ns, cache.k_f16(l, 0), cache.v_f16(l, 0),
                masked_positions ? masked_positions : cache.positions().data(), cache.size(), &attn[offset[s] * qd],
                pool_);
    }
    const size_t n_entries = seqs.front().cache->size();

    if (tap_here) {
      const KvCache& cache = *seqs.front().cache;
      gather_rows(q.data(), qd, tap_rows, tap_q);
      gather_rows(k.data(), kvd, tap_rows, tap_k);
      gather_rows(v.data(), kvd, tap_rows, tap_v);
      if (hooks->capture_attention) {
        const size_t per_row = static_cast<size_t>(h.n_heads) * n_entries;
        tap_probs.assign(tap_rows.size() * per_row, 0.f);
        pool_.parallel_for(tap_rows.size(), [&](size_t i, size_t) {
          const size_t r = tap_rows[i];
          attention_probs(shape, &q[r * qd], positions[r], cache.k_f16(l, 0),
                          masked_positions ? masked_positions : cache.positions().data(), n_entries,
                          &tap_probs[i * per_row]);
        });
      }
    }

    // Output projection and residual; xn is free again and takes the projection.
    w.wo.multiply(attn.data(), n, qd, xn.data(), d, pool_, order);
    if (h.post_norms) post_norm(w.attn_post_norm, xn.data(), n);
    add_inplace(x.data(), xn.data(), n * d);

    pool_.parallel_range(n, [&](size_t b, size_t e, size_t) {
      for (size_t i = b; i < e; ++i) rms_norm(&x[i * d], w.ffn_norm.data(), &xn[i * d], d, h.rms_eps);
    });
    w.w_gate.multiply(xn.data(), n, d, gate.data(), ff, pool_, order);
    w.w_up.multiply(xn.data(), n, d, up.data(), ff, pool_, order);
    pool_.parallel_range(n, [&](size_t b, size_t e, size_t) {
      if (h.activation == FfnActivation::SiLU)
        silu_mul(&gate[b * ff], &up[b * ff], (e - b) * ff);
      else
        gelu_mul(&gate[b * ff], &up[b * ff], (e - b) * ff);
    });
    w.w_down.multiply(gate.data(), n, ff, xn.data(), d, pool_, order);
    if (h.post_norms) post_norm(w.ffn_post_norm, xn.data(), n);
    add_inplace(x.data(), xn.data(), n * d);

    if (tap_here) {
      gather_rows(x.data(), d, tap_rows, tap_hidden_out);
      LayerTap tap;
      tap.layer = l;
      tap.rows = hooks->rows;
      tap.hidden_in = tap_hidden_in.data();
      tap.hidden_out = tap_hidden_out.data();
      tap.q = tap_q.data();
      tap.k = tap_k.data();
      tap.v = tap_v.data();
      tap.attn_probs = hooks->capture_attention ? tap_probs.data() : nullptr;
      tap.n_entries = n_entries;
      hooks->on_layer(tap);
    }
    if (hooks && hooks->stop_after_layer == l) {
      outs.front().stopped_early = true;
      return outs;
    }
    if (hooks && hooks->retire_after_layer) {
      const std::vector<size_t> leaving = hooks->retire_after_layer(l);
      if (!leaving.empty()) {
        std::vector<char> drop(n, 0);
        for (size_t r : leaving) {
          if (r >= n_input) throw std::invalid_argument("forward: retired row " + std::to_string(r) + " out of range");
          const auto& keep = seqs.front().input.logit_rows;
          if (std::find(keep.begin(), keep.end(), r) != keep.end() ||
              std::find(hooks->rows.begin(), hooks->rows.end(), r) != hooks->rows.end())
            throw std::invalid_argument("forward: row " + std::to_string(r) + " has logits or a tap and cannot retire");
          if (live_of_input[r] != kRetired) drop[live_of_input[r]] = 1;
        }
        size_t w = 0;
        for (size_t c = 0; c < n; ++c) {
          if (drop[c]) {
            live_of_input[input_of_live[c]] = kRetired;
            continue;
          }
          if (w != c) {
            std::memcpy(&x[w * d], &x[c * d], d * sizeof(float));
            tokens[w] = tokens[c];
            positions[w] = positions[c];
            slots[w] = slots[c];
            row_cache[w] = row_cache[c];
          }
          input_of_live[w] = input_of_live[c];
          live_of_input[input_of_live[w]] = w;
          ++w;
        }
        n = w;
        offset[1] = n;  // one sequence (hooks)
        for (size_t i = 0; i < tap_rows.size(); ++i) tap_rows[i] = live_of_input[hooks->rows[i]];
      }
    }
    if (layer_pauses && l + 1 == run_end && run_end < h.n_layers) {
      pause(split_.between_layers);
      run_end += layers_of_next_run(std::span(positions.data(), n), run_end);
    }
  }

  // Logits of the rows asked for, all sequences in one product.
  std::vector<size_t> logit_rows;
  for (size_t s = 0; s < seqs.size(); ++s)
    for (size_t r : seqs[s].input.logit_rows) logit_rows.push_back(live_of_input[input_offset[s] + r]);
  if (!logit_rows.empty()) {
    const size_t nl = logit_rows.size();
    std::vector<float> normed(nl * d);
    for (size_t i = 0; i < nl; ++i)
      rms_norm(&x[logit_rows[i] * d], model_.output_norm().data(), &normed[i * d], d, h.rms_eps);
    std::vector<float> logits(nl * h.vocab_size);
    // The logits rows in the one-row order whatever their count, so that a row's logits never
    // depend on how many rows ask for them (a decode step, a prefill's last row and a full
    // pass's row agree); the order-free panel GEMM would change with the count.
    model_.output().multiply(normed.data(), nl, d, logits.data(), h.vocab_size, pool_,
                             WeightMatrix::KQuantOrder::PerRow);
    if (h.final_logit_softcap > 0.f) {  // as llama.cpp: scale by 1/cap, tanh, scale by cap
      const float cap = h.final_logit_softcap, inv = 1.0f / cap;
      for (float& z : logits) z = std::tanh(z * inv) * cap;
    }
    if (seqs.size() == 1) {
      outs.front().logits = std::move(logits);
      return outs;
    }
    size_t done = 0;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const size_t k_rows = seqs[s].input.logit_rows.size();
      outs[s].logits.assign(logits.begin() + static_cast<std::ptrdiff_t>(done * h.vocab_size),
                            logits.begin() + static_cast<std::ptrdiff_t>((done + k_rows) * h.vocab_size));
      done += k_rows;
    }
  }
  return outs;
}

}  // namespace cf
