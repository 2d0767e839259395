#include "fusion/executor.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "base/clock.h"
#include "fusion/auto_quality.h"
#include "fusion/methods.h"

// Sliding-window models (Gemma 3: local layers see the last `window` positions, every
// sixth layer sees all). The rule, layer by layer, and why it needs no special case here:
//  - Chunk cache: a chunk prefilled alone at positions 0..n-1, every layer with its own mask.
//    On a local layer a chunk token sees the chunk tokens of the last `window` positions;
//    that is exactly the part of its full-prefill window that lies inside its own chunk, so
//    what the chunk cache lacks on local layers is the same kind of thing it lacks on global
//    ones (the tokens before the chunk), only bounded by the window. A chunk longer than the
//    window is computed with the window applied inside it, as full prefill would.
//    A prefixed chunk cache (computed after S, issue 14) is the same with S before it: its
//    local layers see the part of S inside the window, as full prefill's first chunk does.
//  - Moving: keys are re-rotated by the position delta with each layer's own RoPE base
//    (KvCache::shift: 10000 on local layers, 1e6 on global ones). Relative positions inside a
//    chunk do not change, so which chunk entries a chunk token sees does not change either.
//  - Stitching: entries keep one position each; no layer stores a window. Visibility is decided
//    at attention time by position (runtime/attention.h): entry e is visible to row r on a
//    local layer iff pos(r) - window < pos(e) <= pos(r). So stale entries further back than the
//    window are never read on local layers by U or by recomputed rows, and are read on the
//    global layers exactly as on a model without windows.
//  - Recomputation: a recomputed row is computed like a full-prefill row (same positions, the
//    same per-layer windows over the stitched cache, fresh K/V of the other recomputed rows).
//    Hence rho = 1 equals full prefill on every layer and rho = 0 is pure reuse, as before
//    (tests/fusion/test_gemma3_fusion.cpp). Selectors that score rows by attention read it
//    through the same masks (attention_shape(h, layer)), so a local layer cannot credit the
//    question's attention to tokens outside its window; those rows can still be chosen
//    through the global layers' scores.
namespace cf {
namespace {
}  // namespace

void extend_prefix(Forward& fwd, KvCache& kv, std::span<const TokenId> tokens) {
  const size_t have = kv.size();
  if (have > tokens.size()) throw std::invalid_argument("extend_prefix: the cache is longer than the prefix");
  if (have == tokens.size()) return;
  std::vector<int32_t> pos(tokens.size() - have);
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(have + i);
  fwd.run(kv, {tokens.subspan(have), pos, {}, {}});
}

ChunkKey FusionExecutor::chunk_key(uint64_t model_fingerprint, const RagRequest& req, const FusionOptions& opt,
                                   size_t i) {
  return base_chunk_key(model_fingerprint, req.chunks.at(i), opt.chunk_context, req.system);
}

std::vector<ChunkKey> FusionExecutor::chunk_keys(uint64_t model_fingerprint, const RagRequest& req,
                                                 const FusionOptions& opt) {
  std::vector<ChunkKey> keys;
  if (opt.full()) return keys;
  for (size_t i = 0; i < req.chunks.size(); ++i) keys.push_back(chunk_key(model_fingerprint, req, opt, i));
  return keys;
}

void FusionExecutor::prefetch(ChunkStore& store, uint64_t model_fingerprint, const RagRequest& req,
                              const FusionOptions& opt) {
  const std::vector<ChunkKey> keys = chunk_keys(model_fingerprint, req, opt);
  if (!keys.empty()) store.prefetch(keys);
}

FusionExecutor::FusionExecutor(Forward& fwd, ChunkStore& store, PrefixSource* prefixes, ColdChunks cold)
    : fwd_(fwd), store_(store), external_prefixes_(prefixes), cold_(cold) {}

std::vector<ChunkFill> FusionExecutor::missing_chunks(const RagRequest& req, const FusionOptions& opt) const {
  std::vector<ChunkFill> missing;
  if (cold_ != ColdChunks::priced) return missing;
  for (ChunkKey& key : chunk_keys(fwd_.model().fingerprint(), req, opt)) {
    if (store_.contains(key) || store_.tiers(key.id()).remote.value_or(false)) continue;
    const auto prefix = base_chunk_prefix(opt.chunk_context, req.system);
    missing.push_back({std::move(key), std::vector<TokenId>(prefix.begin(), prefix.end())});
  }
  return missing;
}

std::shared_ptr<const ChunkCache> FusionExecutor::compute_missing(const ChunkFill& c) {
  return store_.get_or_compute(c.key, [&] { return compute_chunk_cache(fwd_, c.key, c.prefix); });
}

void FusionExecutor::fill(std::span<const ChunkFill> chunks) {
  for (const ChunkFill& c : chunks) compute_missing(c);
}

// Method "auto": the escalation ladder of the model's calibration (auto_quality.h), each
// step an ordinary prefill of this executor; without a calibration, full prefill, stated.
FusionResult FusionExecutor::prefill_auto(const RagRequest& req, const FusionOptions& opt) {
  autoq::AutoDecision decision;
  const autoq::AutoCalibration* cal =
      calibration_ ? calibration_ : autoq::shared_calibration(fwd_.model().fingerprint_hex());
  FusionResult r = autoq::prefill(*this, req, opt, cal, opt.quality, decision,
                                  opt.ttft_ms > 0 ? &autoq::shared_cost_model(fwd_) : nullptr);
  r.auto_decision = decision.to_json();
  return r;
}

std::shared_ptr<const KvCache> FusionExecutor::prefix_cache(const std::vector<TokenId>& system, size_t& hit_tokens) {
  if (external_prefixes_) return external_prefixes_->prefix(fwd_, system, hit_tokens);
  {
    std::lock_guard<std::mutex> lock(prefix_mu_);
    auto it = prefixes_.find(system);
    if (it != prefixes_.end()) {
      hit_tokens = system.size();
      return it->second;
    }
  }
  hit_tokens = 0;
  auto kv = std::make_shared<KvCache>(fwd_.model().hparams(), system.size());
  extend_prefix(fwd_, *kv, system);
  std::lock_guard<std::mutex> lock(prefix_mu_);
  prefixes_.emplace(system, kv);
  return kv;
}

FusionResult FusionExecutor::prefill(const RagRequest& req, const FusionOptions& opt) {
  if (opt.automatic()) return prefill_auto(req, opt);
  if (!(opt.ratio >= 0.0 && opt.ratio <= 1.0))
    throw std::invalid_argument("fusion ratio must be in [0, 1], got " + std::to_string(opt.ratio));
  if (req.suffix.empty()) throw std::invalid_argument("fused prefill needs a non-empty question suffix");
  const ModelHparams& h = fwd_.model().hparams();
  const std::vector<TokenId> tokens = req.flatten();
  if (static_cast<int>(tokens.size()) > h.context_length)
    throw std::invalid_argument("prompt of " + std::to_string(tokens.size()) + " tokens exceeds the context of " +
                                std::to_string(h.context_length));
  const size_t context_begin = req.system.size();
  const size_t context_end = context_begin + req.context_tokens();

  const auto t0 = SteadyClock::now();
  FusionResult r{.logits = {},
                 .cache = KvCache(h, tokens.size() + 256),
                 .next_position = static_cast<int32_t>(tokens.size()),
                 .recomputed = {},
                 .context_tokens = req.context_tokens(),
                 .chunk_hits = 0,
                 .chunk_misses = 0,
                 .chunk_hit = {},
                 .prefix_hit = false,
                 .prefix_hit_tokens = 0,
                 .timings = {},
                 .selection_details = {},
                 .token_scores = {},
                 .score_kind = {},
                 .auto_decision = {},
                 .chunks_to_fill = {}};

  if (opt.full()) {  // the reference: one plain prefill of the whole request
    size_t start = 0;          // with a prefix source, S comes from it (exact K/V)
    if (external_prefixes_) {
      auto prefix = prefix_cache(req.system, r.prefix_hit_tokens);
      r.prefix_hit = r.prefix_hit_tokens > 0;
      r.cache.append_from(*prefix, 0, prefix->size(), 0);
      start = prefix->size();
    }
    std::vector<int32_t> pos(tokens.size() - start);
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(start + i);
    const size_t last_row = pos.size() - 1;
    auto out = fwd_.run(r.cache, {std::span<const TokenId>(tokens).subspan(start), pos, {},
                                  std::span<const size_t>(&last_row, 1)});
    r.logits = std::move(out.logits);
    for (size_t s = context_begin; s < context_end; ++s) r.recomputed.push_back(s);
    r.timings.recompute_ms = r.timings.ttft_ms = ms_since(t0);
    return r;
  }
  std::unique_ptr<Selector> selector = make_selector(opt.method);
  selector->configure(opt.method_options);

  // Lookup: S from the prefix cache, each chunk from the store (computed if missing).
  auto t_lookup = SteadyClock::now();
  auto prefix = prefix_cache(req.system, r.prefix_hit_tokens);
  r.prefix_hit = r.prefix_hit_tokens > 0;
  std::vector<std::shared_ptr<const ChunkCache>> caches;
  double offline = 0;
  for (size_t i = 0; i < req.chunks.size(); ++i) {
    const ChunkKey key = chunk_key(fwd_.model().fingerprint(), req, opt, i);
    auto c = selector->lookup_chunk(fwd_, store_, key, req, i);
    if (!c) c = store_.get(key);
    r.chunk_hit.push_back(c != nullptr);
    if (c) {
      ++r.chunk_hits;
    } else {
      ++r.chunk_misses;
      const auto tc = SteadyClock::now();
      const auto prefix = base_chunk_prefix(opt.chunk_context, req.system);
      c = compute_missing({key, std::vector<TokenId>(prefix.begin(), prefix.end())});
      offline += ms_since(tc);
    }
    // The method's offline metadata, when this chunk does not carry it yet.
    if (selector->needs_preparation(*c)) {
      const auto tp = SteadyClock::now();
      ChunkCache prepared = *c;
      selector->prepare_chunk(fwd_, prepared);
      c = store_.put(std::move(prepared));
      offline += ms_since(tp);
    }
    caches.push_back(std::move(c));
  }
  offline += selector->offline_ms();
  const auto t_stitch = SteadyClock::now();

  // Stitch: S at 0.., chunk i at its offset (keys rotated by the offset). A prefixed cache
  // starts at |S| (its S rows were not stored) and an alone one at 0: both move by
  // begin - position(0), so no selector needs to know which variant it got.
  r.cache.append_from(*prefix, 0, prefix->size(), 0);
  FusionInputs in{req, r.cache, {}, context_begin, context_end, tokens, opt.ratio, opt.seed, opt.chunk_context};
  for (const auto& c : caches) {
    const size_t begin = r.cache.size();
    const int32_t delta = static_cast<int32_t>(begin) - (c->kv.size() ? c->kv.position(0) : 0);
    r.cache.append_from(c->kv, 0, c->kv.size(), delta);
    in.chunks.push_back({begin, c->kv.size(), c});
  }
  const auto t_select = SteadyClock::now();

  Selection sel = selector->select(fwd_, in);
  if (r.cache.size() != context_end) throw std::logic_error("selector " + std::string(selector->name()) + " left probe entries in the cache");
  for (size_t s : sel.slots)
    if (s < context_begin || s >= context_end) throw std::logic_error("selector chose a slot outside the context");
  const auto t_recompute = SteadyClock::now();

  // Recompute P in place and compute U into new slots, in one pass (Eq. 7 semantics).
  std::vector<TokenId> rows;
  std::vector<int32_t> pos;
  std::vector<size_t> slots;
  rows.reserve(sel.slots.size() + req.suffix.size());
  for (size_t s : sel.slots) {
    rows.push_back(tokens[s]);
    pos.push_back(static_cast<int32_t>(s));
    slots.push_back(s);
  }
  const size_t first_new = r.cache.append(req.suffix.size());
  for (size_t i = 0; i < req.suffix.size(); ++i) {
    rows.push_back(req.suffix[i]);
    pos.push_back(static_cast<int32_t>(context_end + i));
    slots.push_back(first_new + i);
  }
  const size_t logit_row = rows.size() - 1;
  ForwardHooks hooks;
  const bool hooked = selector->recompute_hooks(in, sel.slots, hooks);
  auto out = fwd_.run(r.cache, {rows, pos, slots, std::span<const size_t>(&logit_row, 1)}, hooked ? &hooks : nullptr);
  const auto t_end = SteadyClock::now();
  if (hooked) selector->after_recompute(sel.details);

  r.logits = std::move(out.logits);
  r.recomputed = std::move(sel.slots);
  r.selection_details = std::move(sel.details);
  r.token_scores = std::move(sel.scores);
  r.score_kind = std::move(sel.score_kind);
  r.timings.lookup_ms = ms_between(t_lookup, t_stitch) - offline;
  r.timings.offline_ms = offline;
  r.timings.load_ms = ms_between(t_stitch, t_select);
  r.timings.selection_ms = ms_between(t_select, t_recompute);
  r.timings.recompute_ms = ms_between(t_recompute, t_end);
  r.timings.ttft_ms = ms_between(t0, t_end) - offline;
  return r;
}

}  // namespace cf
