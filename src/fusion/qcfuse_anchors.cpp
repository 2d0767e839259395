// QCFuse anchors (§3.3.1, Eq. 14) and the anchor-conditioned probe (§3.3.2 and §3.4,
// Eq. 15-18, 20). Deviations from the paper / the artifact (digest-qcfuse.md [C]):
//  - KVzip is the artifact's simplified form: only the repeat prompt's tokens are queries
//    (no teacher-forced re-feed of the context), reduction "max_head_query". The artifact
//    prepends 4 system-prompt sink keys; here the chunk's own cache is the whole prefix
//    (the chunk's first tokens already act as sinks, and they are forced anchors anyway).
//  - One anchor set per chunk, not one per layer: an entry's score is the SUM over all
//    layers of its per-layer max, so entries that matter in many layers rank first; the
//    profile may change without invalidating stored anchors.
//  - The probe scores with ALL tokens of U (question and chat-template tail) as queries;
//    the artifact uses the question tokens only (U's template part is always the same).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "base/thread_pool.h"
#include "fusion/qcfuse.h"
#include "runtime/attention.h"
#include "runtime/vector_math.h"

namespace cf::qcfuse {
namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }
}  // namespace

size_t anchor_count(size_t n, double ratio) {
  if (!(ratio >= 0.0 && ratio <= 1.0)) throw std::invalid_argument("anchor ratio must be in [0, 1]");
  const auto k = static_cast<size_t>(std::ceil(ratio * static_cast<double>(n) - 1e-9));
  return std::min(n, k);
}

std::vector<uint32_t> anchor_order(const std::vector<double>& score, size_t forced) {
  const size_t n = score.size();
  std::vector<uint32_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = static_cast<uint32_t>(i);
  const size_t f = std::min(forced, n);
  std::stable_sort(order.begin() + f, order.end(), [&](uint32_t a, uint32_t b) { return score[a] > score[b]; });
  return order;
}

std::vector<uint32_t> rank_anchors(const std::vector<double>& score, double ratio, size_t forced) {
  std::vector<uint32_t> order = anchor_order(score, forced);
  order.resize(anchor_count(score.size(), ratio));
  std::sort(order.begin(), order.end());
  return order;
}

std::vector<double> kvzip_scores(Forward& fwd, const KvCache& chunk_kv) {
  const size_t n = chunk_kv.size();
  std::vector<double> score(n, 0.0);
  if (n == 0) return score;
  const Model& m = fwd.model();
  const std::vector<TokenId> prompt = m.tokenizer().encode(kRepeatPrompt, false, false);
  KvCache scratch(m.hparams(), n + prompt.size());
  scratch.append_from(chunk_kv, 0, n, 0);  // keeps the chunk's positions
  int32_t last = 0;
  for (size_t i = 0; i < n; ++i) last = std::max(last, chunk_kv.position(i));
  std::vector<int32_t> pos(prompt.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = last + 1 + static_cast<int32_t>(i);

  const int n_heads = m.hparams().n_heads;
  ForwardHooks hooks;
  hooks.rows.resize(prompt.size());
  for (size_t i = 0; i < prompt.size(); ++i) hooks.rows[i] = i;
  hooks.capture_attention = true;
  hooks.on_layer = [&](const LayerTap& t) {
    for (size_t e = 0; e < n; ++e) {
      float best = 0;
      for (size_t r = 0; r < t.rows.size(); ++r)
        for (int h = 0; h < n_heads; ++h) best = std::max(best, t.attn_probs[(r * n_heads + h) * t.n_entries + e]);
      score[e] += best;
    }
  };
  fwd.run(scratch, {prompt, pos, {}, {}}, &hooks);
  return score;
}

void prepare_anchors(Forward& fwd, ChunkCache& chunk, double ratio) {
  const auto t0 = Clock::now();
  const std::vector<double> score = kvzip_scores(fwd, chunk.kv);
  const std::vector<uint32_t> order = anchor_order(score);
  std::vector<uint32_t> anchors(order.begin(), order.begin() + static_cast<long>(anchor_count(order.size(), ratio)));
  std::sort(anchors.begin(), anchors.end());
  // The whole ranking is kept, so any other r_a (ablations) is served without recomputing.
  chunk.extra[kExtraKey] = {{"ranking", order},
                            {"anchors", anchors},
                            {"ratio", ratio},
                            {"rule", "kvzip_max_head_query_sum_layers"},
                            {"forced", kForcedAnchors},
                            {"ms", ms_since(t0)}};
}

std::optional<std::vector<uint32_t>> stored_anchors(const ChunkCache& chunk, double ratio) {
  const size_t n = chunk.n_tokens();
  const auto it = chunk.extra.find(kExtraKey);
  if (it == chunk.extra.end() || !it->is_object()) return std::nullopt;
  const auto r = it->find("ranking");
  if (r == it->end() || !r->is_array() || r->size() != n) return std::nullopt;
  const size_t k = anchor_count(n, ratio);
  std::vector<uint32_t> out;
  out.reserve(k);
  for (size_t i = 0; i < k; ++i) {
    const auto& x = (*r)[i];
    if (!x.is_number_unsigned() || x.get<uint64_t>() >= n) return std::nullopt;
    out.push_back(x.get<uint32_t>());
  }
  std::sort(out.begin(), out.end());
  if (std::adjacent_find(out.begin(), out.end()) != out.end()) return std::nullopt;
  return out;
}

ProbeResult anchor_probe(Forward& fwd, const KvCache& stitched, size_t context_begin, size_t context_end,
                         std::span<const size_t> anchor_slots, std::span<const TokenId> suffix,
                         const std::vector<int>& layers) {
  const auto t0 = Clock::now();
  const ModelHparams& h = fwd.model().hparams();
  if (context_end > stitched.size() || context_begin > context_end)
    throw std::invalid_argument("anchor_probe: context outside the stitched cache");
  if (layers.empty()) throw std::invalid_argument("anchor_probe: no layers to score");
  for (int l : layers)
    if (l < 0 || l >= h.n_layers) throw std::invalid_argument("anchor_probe: layer out of range");
  const size_t n = context_end - context_begin;
  const size_t nu = suffix.size();
  ProbeResult res;
  res.scores.assign(layers.size(), std::vector<double>(n, 0.0));
  res.anchor_entries = anchor_slots.size();
  if (nu == 0) return res;

  // Compact cache C_A: S, then the anchors in runs of consecutive slots, positions kept.
  KvCache compact(h, context_begin + anchor_slots.size() + nu);
  compact.append_from(stitched, 0, context_begin, 0);
  for (size_t i = 0; i < anchor_slots.size();) {
    size_t j = i + 1;
    while (j < anchor_slots.size() && anchor_slots[j] == anchor_slots[j - 1] + 1) ++j;
    if (anchor_slots[i] < context_begin || anchor_slots[j - 1] >= context_end)
      throw std::invalid_argument("anchor_probe: anchor outside the context");
    compact.append_from(stitched, anchor_slots[i], anchor_slots[j - 1] + 1, 0);
    i = j;
  }
  std::vector<int32_t> pos(nu);
  for (size_t i = 0; i < nu; ++i) pos[i] = static_cast<int32_t>(context_end + i);

  // Keys the U queries are scored against: S + context from the stitched cache, then U's
  // own (from the tap), with their positions.
  const size_t kvd = static_cast<size_t>(h.kv_dim());
  const size_t n_keys = context_end + nu;
  std::vector<uint16_t> keys(n_keys * kvd);  // f16 bits, as attention_probs reads a cache
  std::vector<int32_t> key_pos(n_keys);
  std::copy(stitched.positions().begin(), stitched.positions().begin() + static_cast<long>(context_end), key_pos.begin());
  std::copy(pos.begin(), pos.end(), key_pos.begin() + static_cast<long>(context_end));
  ThreadPool& pool = fwd.pool();
  std::vector<std::vector<double>> partial(pool.size() + 1, std::vector<double>(n));
  std::vector<std::vector<float>> probs(pool.size() + 1, std::vector<float>(static_cast<size_t>(h.n_heads) * n_keys));
  double score_ms = 0;

  ForwardHooks hooks;
  hooks.rows.resize(nu);
  for (size_t i = 0; i < nu; ++i) hooks.rows[i] = i;
  hooks.layers = layers;
  hooks.stop_after_layer = *std::max_element(layers.begin(), layers.end());
  hooks.on_layer = [&](const LayerTap& t) {
    const auto ts = Clock::now();
    const size_t li = static_cast<size_t>(std::find(layers.begin(), layers.end(), t.layer) - layers.begin());
    std::memcpy(keys.data(), stitched.k_f16(t.layer, 0), context_end * kvd * KvCache::kValueBytes);
    f32_to_f16(t.k, keys.data() + context_end * kvd, nu * kvd);  // the tap's K is f16-exact: no rounding
    for (auto& p : partial) std::fill(p.begin(), p.end(), 0.0);
    const AttentionShape shape_of_layer = attention_shape(h, t.layer);  // its window (Gemma 3) included
    pool.parallel_for(nu, [&](size_t r, size_t thread) {
      float* pr = probs[thread].data();
      attention_probs(shape_of_layer, t.q + r * static_cast<size_t>(h.q_dim()), pos[r], keys.data(), key_pos.data(), n_keys, pr);
      double* acc = partial[thread].data();
      for (int hh = 0; hh < h.n_heads; ++hh) {
        const float* ph = pr + static_cast<size_t>(hh) * n_keys + context_begin;
        for (size_t i = 0; i < n; ++i) acc[i] += ph[i];
      }
    });
    std::vector<double>& out = res.scores[li];
    for (const auto& p : partial)
      for (size_t i = 0; i < n; ++i) out[i] += p[i];
    score_ms += ms_since(ts);
  };
  fwd.run(compact, {suffix, pos, {}, {}}, &hooks);
  res.score_ms = score_ms;
  res.probe_ms = ms_since(t0) - score_ms;
  return res;
}

}  // namespace cf::qcfuse
