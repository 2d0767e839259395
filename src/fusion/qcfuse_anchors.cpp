// QCFuse anchors (§3.3.1, Eq. 14), the query probe shared with ProphetKV (§3.2.1 Eq. 9-10)
// and the anchor-conditioned probe (§3.3.2 and §3.4, Eq. 15-18, 20).
// Defaults follow the authors' artifact where the paper is silent (digest-qcfuse.md [C]):
//  - anchors per layer (AnchorRule::per_layer): at layer l the probe sees layer l's own
//    anchor set, ranked by that layer's KVzip score ("ranked_indices_by_layer_chunk"). The
//    paper's text implies one set per chunk; per_layer = false gives that, ranked by the sum
//    over layers. One pass serves every layer: the compact cache holds the union of the sets
//    and each layer's causal mask hides the others (ForwardHooks::mask_positions).
//  - KVzip sinks (AnchorRule::sinks): the first kSinkKeys tokens of a system prefix (the
//    model's default RAG prefix S, computed exactly at positions 0..3) are keys inside the
//    repeat prompt's softmax; the chunk keeps its own PIC cache at positions 0.. (the artifact
//    prefills each doc alone from position 0 too). sinks = false: the chunk is the whole prefix.
//  - probe rows (ProbeRows::question): only the question's tokens score; "Question: " runs
//    (its keys are in the softmax) and the chat-template tail is not run at all.
// Remaining deviations:
//  - KVzip is the artifact's simplified form: only the repeat prompt's tokens are queries
//    (no teacher-forced re-feed of the context), reduction "max_head_query" (§3.3.1 names
//    KVzip; [C] simplifies it the same way).
//  - the artifact stores a separate anchor K/V copy per layer; we keep rankings (all
//    positions in order) in ChunkCache::extra and gather the anchors from the stitched cache
//    (Eq. 16 as the paper writes it), so every ratio and layer is served without recomputing.
//  - scores are sums over heads and rows, not means (same ranking; the artifact divides by
//    rows x heads) and, over layers, the selector sums (Eq. 20) where the artifact averages.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "base/clock.h"
#include "base/thread_pool.h"
#include "fusion/qcfuse.h"
#include "runtime/attention.h"
#include "runtime/vector_math.h"

namespace cf::qcfuse {
namespace {
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

std::string AnchorRule::name() const { return sinks ? "sink" : "plain"; }

bool parse_probe_rows(const std::string& s, ProbeRows& out) {
  if (s == "question") out = ProbeRows::question;
  else if (s == "suffix") out = ProbeRows::suffix;
  else return false;
  return true;
}
const char* probe_rows_name(ProbeRows r) { return r == ProbeRows::question ? "question" : "suffix"; }

std::pair<size_t, size_t> probe_row_range(const RagRequest& request, ProbeRows rows) {
  if (rows == ProbeRows::question && request.question_end > request.question_begin &&
      request.question_end <= request.suffix.size())
    return {request.question_begin, request.question_end};
  return {0, request.suffix.size()};
}

std::vector<std::vector<double>> kvzip_layer_scores(Forward& fwd, const KvCache& chunk_kv, const KvCache* sinks) {
  const size_t n = chunk_kv.size();
  const Model& m = fwd.model();
  const int L = m.hparams().n_layers;
  std::vector<std::vector<double>> score(static_cast<size_t>(L), std::vector<double>(n, 0.0));
  if (n == 0) return score;
  const std::vector<TokenId> prompt = m.tokenizer().encode(kRepeatPrompt, false, false);
  const size_t ns = sinks ? sinks->size() : 0;
  KvCache scratch(m.hparams(), ns + n + prompt.size());
  if (sinks) scratch.append_from(*sinks, 0, ns, 0);
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
    std::vector<double>& out = score[static_cast<size_t>(t.layer)];
    for (size_t e = 0; e < n; ++e) {
      float best = 0;
      for (size_t r = 0; r < t.rows.size(); ++r)
        for (int h = 0; h < n_heads; ++h) best = std::max(best, t.attn_probs[(r * n_heads + h) * t.n_entries + ns + e]);
      out[e] = best;
    }
  };
  fwd.run(scratch, {prompt, pos, {}, {}}, &hooks);
  return score;
}

std::vector<double> kvzip_scores(Forward& fwd, const KvCache& chunk_kv) {
  const auto by_layer = kvzip_layer_scores(fwd, chunk_kv, nullptr);
  std::vector<double> sum(chunk_kv.size(), 0.0);
  for (const auto& s : by_layer)
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += s[i];
  return sum;
}

const KvCache* sink_keys(Forward& fwd, const AnchorRule& rule) {
  if (!rule.sinks) return nullptr;
  static std::mutex mu;
  static std::map<uint64_t, std::unique_ptr<KvCache>> by_model;
  const Model& m = fwd.model();
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = by_model[m.fingerprint()];
  if (!slot) {
    std::vector<TokenId> s = build_rag_request(m, {}, "", RagPromptOptions{}).system;
    s.resize(std::min(s.size(), kSinkKeys));
    auto kv = std::make_unique<KvCache>(m.hparams(), s.size());
    std::vector<int32_t> pos(s.size());
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
    if (!s.empty()) fwd.run(*kv, {s, pos, {}, {}});
    slot = std::move(kv);
  }
  return slot.get();
}

void prepare_anchors(Forward& fwd, ChunkCache& chunk, const AnchorRule& rule) {
  const auto t0 = SteadyClock::now();
  const auto by_layer = kvzip_layer_scores(fwd, chunk.kv, sink_keys(fwd, rule));
  nlohmann::json layers = nlohmann::json::array();
  std::vector<double> sum(chunk.kv.size(), 0.0);
  for (const auto& s : by_layer) {
    layers.push_back(anchor_order(s));
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += s[i];
  }
  // Whole rankings are kept, so any r_a and either layer mode is served without recomputing.
  nlohmann::json& entry = chunk.extra[kExtraKey];
  if (!entry.is_object()) entry = nlohmann::json::object();
  entry[rule.name()] = {{"layers", std::move(layers)},
                        {"sum", anchor_order(sum)},
                        {"rule", "kvzip_max_head_query"},
                        {"forced", kForcedAnchors},
                        {"ms", ms_since(t0)}};
}

bool has_stored_anchors(const nlohmann::json& extra) {
  const auto it = extra.find(kExtraKey);
  if (it == extra.end() || !it->is_object()) return false;
  for (const auto& rule : *it)
    if (rule.is_object() && rule.contains("sum") && rule["sum"].is_array()) return true;
  return false;
}

std::optional<std::vector<uint32_t>> stored_anchors(const ChunkCache& chunk, double ratio, const AnchorRule& rule,
                                                    int layer) {
  const size_t n = chunk.n_tokens();
  const auto it = chunk.extra.find(kExtraKey);
  if (it == chunk.extra.end() || !it->is_object()) return std::nullopt;
  const auto e = it->find(rule.name());
  if (e == it->end() || !e->is_object()) return std::nullopt;
  const nlohmann::json* r = nullptr;
  if (rule.per_layer) {
    const auto ls = e->find("layers");
    if (ls == e->end() || !ls->is_array() || layer < 0 || static_cast<size_t>(layer) >= ls->size()) return std::nullopt;
    r = &(*ls)[static_cast<size_t>(layer)];
  } else {
    const auto su = e->find("sum");
    if (su == e->end()) return std::nullopt;
    r = &*su;
  }
  if (!r->is_array() || r->size() != n) return std::nullopt;
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

std::vector<double> sum_layers(const ProbeResult& r) {
  std::vector<double> sum(r.scores.empty() ? 0 : r.scores.front().size(), 0.0);
  for (const auto& s : r.scores)
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += s[i];
  return sum;
}

std::vector<std::vector<uint32_t>> chunk_anchor_sets(Forward& fwd, const ChunkCache& chunk, double ratio,
                                                     const AnchorRule& rule, int n_layers, bool* computed_online) {
  const size_t n_sets = rule.per_layer ? static_cast<size_t>(std::max(n_layers, 1)) : 1;
  std::vector<std::vector<uint32_t>> out(n_sets);
  if (computed_online) *computed_online = false;
  if (anchor_count(chunk.n_tokens(), ratio) == 0) return out;
  bool stored = true;
  for (size_t l = 0; l < n_sets && stored; ++l) {
    auto a = stored_anchors(chunk, ratio, rule, static_cast<int>(l));
    if (a) out[l] = std::move(*a);
    else stored = false;
  }
  if (stored) return out;
  // Not prepared offline: rank now (the caller counts it as selection time).
  if (computed_online) *computed_online = true;
  const auto by_layer = kvzip_layer_scores(fwd, chunk.kv, sink_keys(fwd, rule));
  if (rule.per_layer) {
    for (size_t l = 0; l < n_sets; ++l) out[l] = rank_anchors(by_layer[l], ratio);
  } else {
    std::vector<double> sum(chunk.kv.size(), 0.0);
    for (const auto& s : by_layer)
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += s[i];
    out[0] = rank_anchors(sum, ratio);
  }
  return out;
}

ProbeResult query_probe(Forward& fwd, KvCache& stitched, size_t context_begin, size_t context_end, const ProbeView& view,
                        std::span<const TokenId> suffix, size_t rows_begin, size_t rows_end,
                        const std::vector<int>& layers) {
  const auto t0 = SteadyClock::now();
  const ModelHparams& h = fwd.model().hparams();
  if (context_end > stitched.size() || context_begin > context_end)
    throw std::invalid_argument("query_probe: context outside the stitched cache");
  if (layers.empty()) throw std::invalid_argument("query_probe: no layers to score");
  for (int l : layers)
    if (l < 0 || l >= h.n_layers) throw std::invalid_argument("query_probe: layer out of range");
  if (rows_begin > rows_end || rows_end > suffix.size()) throw std::invalid_argument("query_probe: rows outside U");
  const int deepest = *std::max_element(layers.begin(), layers.end());
  if (!view.full && view.anchors.size() != 1 && view.anchors.size() <= static_cast<size_t>(deepest))
    throw std::invalid_argument("query_probe: anchor sets missing for layers up to " + std::to_string(deepest));
  const size_t n = context_end - context_begin;
  const std::span<const TokenId> run_tokens = suffix.first(rows_end);  // the rest of U is not probed
  const size_t nu = run_tokens.size(), n_rows = rows_end - rows_begin;
  ProbeResult res;
  res.scores.assign(layers.size(), std::vector<double>(n, 0.0));
  if (n_rows == 0) return res;

  // The cache U runs over: the stitched one itself (full view; U is removed afterwards) or
  // C_A: S, then the union of the anchor sets in runs of consecutive slots, positions kept.
  std::optional<KvCache> compact;
  std::vector<std::vector<int32_t>> masks;  // per layer (per-layer anchor sets only)
  if (!view.full) {
    std::vector<size_t> all;
    for (const auto& a : view.anchors) all.insert(all.end(), a.begin(), a.end());
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    res.anchor_entries = all.size();
    compact.emplace(h, context_begin + all.size() + nu);
    compact->append_from(stitched, 0, context_begin, 0);
    for (size_t i = 0; i < all.size();) {
      size_t j = i + 1;
      while (j < all.size() && all[j] == all[j - 1] + 1) ++j;
      if (all[i] < context_begin || all[j - 1] >= context_end)
        throw std::invalid_argument("query_probe: anchor outside the context");
      compact->append_from(stitched, all[i], all[j - 1] + 1, 0);
      i = j;
    }
    if (view.anchors.size() > 1) {
      const size_t entries = context_begin + all.size() + nu;
      for (int l = 0; l <= deepest; ++l) {
        std::vector<int32_t> m(entries, ForwardHooks::kHiddenEntry);
        for (size_t i = 0; i < context_begin; ++i) m[i] = compact->position(i);
        const auto& mine = view.anchors[static_cast<size_t>(l)];
        for (size_t i = 0; i < all.size(); ++i)
          if (std::binary_search(mine.begin(), mine.end(), all[i])) m[context_begin + i] = compact->position(context_begin + i);
        for (size_t i = 0; i < nu; ++i) m[context_begin + all.size() + i] = static_cast<int32_t>(context_end + i);
        masks.push_back(std::move(m));
      }
    }
  } else {
    res.anchor_entries = n;
  }
  KvCache& run_cache = view.full ? stitched : *compact;
  const size_t before = run_cache.size();
  std::vector<int32_t> pos(nu);
  for (size_t i = 0; i < nu; ++i) pos[i] = static_cast<int32_t>(context_end + i);

  // Keys the scoring rows are scored against: S + context from the stitched cache, then U's
  // own (from the tap), with their positions.
  const size_t kvd = static_cast<size_t>(h.kv_dim());
  const size_t n_keys = context_end + nu;
  std::vector<uint16_t> keys(n_keys * kvd);  // f16 bits, as attention_probs reads a cache
  std::vector<int32_t> key_pos(n_keys);
  std::copy(stitched.positions().begin(), stitched.positions().begin() + static_cast<long>(context_end), key_pos.begin());
  std::copy(pos.begin(), pos.end(), key_pos.begin() + static_cast<long>(context_end));
  ThreadPool& pool = fwd.pool();
  std::vector<std::vector<float>> probs(pool.size() + 1, std::vector<float>(static_cast<size_t>(h.n_heads) * n_keys));
  std::vector<double> per_row(n_rows * n);  // each row's sum over heads; rows added in order after
  double score_ms = 0;

  ForwardHooks hooks;
  hooks.rows.resize(nu);
  for (size_t i = 0; i < nu; ++i) hooks.rows[i] = i;
  hooks.layers = layers;
  hooks.stop_after_layer = deepest;
  if (!masks.empty()) hooks.mask_positions = [&](int l) -> const int32_t* {
    return l <= deepest ? masks[static_cast<size_t>(l)].data() : nullptr;
  };
  hooks.on_layer = [&](const LayerTap& t) {
    const auto ts = SteadyClock::now();
    const size_t li = static_cast<size_t>(std::find(layers.begin(), layers.end(), t.layer) - layers.begin());
    std::memcpy(keys.data(), stitched.k_f16(t.layer, 0), context_end * kvd * KvCache::kValueBytes);
    f32_to_f16(t.k, keys.data() + context_end * kvd, nu * kvd);  // the tap's K is f16-exact: no rounding
    const AttentionShape shape_of_layer = attention_shape(h, t.layer);  // its window (Gemma 3) included
    pool.parallel_for(n_rows, [&](size_t i, size_t thread) {
      const size_t r = rows_begin + i;
      float* pr = probs[thread].data();
      attention_probs(shape_of_layer, t.q + r * static_cast<size_t>(h.q_dim()), pos[r], keys.data(), key_pos.data(),
                      n_keys, pr);
      double* acc = per_row.data() + i * n;
      std::fill(acc, acc + n, 0.0);
      for (int hh = 0; hh < h.n_heads; ++hh) {
        const float* ph = pr + static_cast<size_t>(hh) * n_keys + context_begin;
        for (size_t c = 0; c < n; ++c) acc[c] += ph[c];
      }
    });
    std::vector<double>& out = res.scores[li];
    for (size_t i = 0; i < n_rows; ++i) {
      const double* acc = per_row.data() + i * n;
      for (size_t c = 0; c < n; ++c) out[c] += acc[c];
    }
    score_ms += ms_since(ts);
  };
  try {
    fwd.run(run_cache, {run_tokens, pos, {}, {}}, &hooks);
  } catch (...) {
    run_cache.truncate(before);
    throw;
  }
  run_cache.truncate(before);
  res.score_ms = score_ms;
  res.probe_ms = ms_since(t0) - score_ms;
  return res;
}

}  // namespace cf::qcfuse
