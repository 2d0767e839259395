// Cache-Craft (cache-craft-paper.txt §3.2-3.4, Eqs. 6-14; digest part B, whose fixes for
// the paper's bugs are applied in cachecraft_metrics.h).
//
// Offline, per chunk: its PIC cache with stats (pic_stats), and up to M after_prefix
// variants, each the chunk's K/V after the prefix S c1..c(i-1) of a request it was seen in,
// with the attention each of its tokens paid to that old prefix, per-prefix-chunk inter
// sums, intra, ā, b̄ and CCI (build_cachecraft_variants: one pass with attention capture).
// The PIC cache's extra["cachecraft"]["variants"] is the chunk's entry in the metadata
// store: it lists the variants and their stats, so choosing one loads no K/V.
// Online: lookup_chunk picks, per chunk, the variant with the lowest CCI·(1-β') for this
// request's preceding chunks (§3.3); select() turns CFO = α·CCI·(1-β') into a token count
// per chunk and takes each chunk's first tokens in its stored ranking (Eq. 14).
//
// Deviations from the paper (and choices where it is silent):
//  - The system prefix S is in every old and every new prefix, so it gets zero weight in β
//    and in CCI's a: it carries no information on reusability, and the attention sink at
//    S's first token (most of the prefix attention) would make β ≈ 1 for every variant.
//    It still counts as present: a variant made after S alone has β = 1 (the literal
//    formula with S as a chunk gives the same). A variant made after another S is not a
//    candidate. S enters the token ranking as a tie-break.
//  - Like the paper's β, ours ignores new chunks that the old prefix lacked: a variant
//    whose old prefix survives whole (e.g. made after S alone) scores β' = 1 and CFO = 0
//    wherever the chunk now sits.
//  - A PIC cache is a variant with an empty old prefix: β = γ = 0, CCI = 0.5 (a = 0), so
//    its penalty is 0.5. Its tokens are ranked by the attention they pay to the chunk's
//    first token, the sink that stands in for the missing prefix (the paper has no PIC).
//  - Ties between variants go to an after_prefix variant (it saw the real S).
//  - Budget: Cache-Craft picks its own (own_budget = true: ceil(CFO_i·|C_i|), ρ caps the
//    total). By default the request's ρ is a global budget floor(ρN) split in proportion
//    to CFO, i.e. ρ fixes α, which keeps every selector's invariants (ρ = 1: everything,
//    ρ = 0: nothing, exactly floor(ρN) rows). "cfo_fraction" in the details reports what
//    CFO at the configured α would have chosen.
//  - Variants: made from the request's full pass after the chunk's true prefix ("a unique
//    chunk and prefix", §3.3), at most M per chunk (paper: a global N×M budget with f_r
//    eviction): a chunk with M variants gets no more. select() credits each chunk's cache
//    with f_r += 1/CFO in the store (ChunkStore::note_use); the store's cachecraft policy
//    and its entry budget (N×M) evict by it.
//    Online creation is offline work (Selector::offline_ms) and serves later requests only:
//    the request that creates a variant chose its own variants before.
//  - Attention statistics: mean over heads and layers (B6.1), inter(prev, cur) direction.
//  - Focused-chunk early stop (Algorithm 1), option focus_early_stop (off by default): during
//    the recompute pass, inter_l(C_i, U) = the question rows' attention to chunk i's entries,
//    mean over heads and question rows, accumulated over layers; focused = the chunks above
//    the largest gap (our reading of line 8, digest B2.4); once that set is unchanged for w
//    layers (w = focus_window, default 3: the paper gives none), the recompute rows of the
//    other chunks leave the pass (ForwardHooks::retire_after_layer). Never at ρ = 1, and not
//    with fewer than 2 chunks. If the set never settles, every layer is recomputed.
//  - On prefixed base caches (issue 14: the chunk computed after S) the base cache gets the
//    same offline stats as a PIC cache (pic_stats: computed alone), so its CCI is the chunk's
//    own and its old prefix is empty (β = 0 unless the chunk is first); it is not a variant
//    made from a request. Variants, when created, are after_prefix caches as before.
//  - Tiers, demotion and preloading (§3.4.2, §3.5) are the chunk store's (kv/chunk_store.h).
#include "base/clock.h"
#include "fusion/select_cachecraft.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <numeric>

#include "base/thread_pool.h"
#include "runtime/attention.h"

namespace cf {
namespace {

constexpr const char* kKey = "cachecraft";

// Ranking by attention to the old prefix chunks, ties by attention to S (or the sink).
std::vector<uint32_t> rank_by(const std::vector<double>& primary, const std::vector<double>& secondary) {
  std::vector<uint32_t> order = cachecraft::rank_tokens(secondary);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return primary[a] > primary[b]; });
  return order;
}

std::vector<int32_t> iota_positions(size_t n) {
  std::vector<int32_t> p(n);
  std::iota(p.begin(), p.end(), 0);
  return p;
}

const nlohmann::json* cachecraft_extra(const ChunkCache& c) {
  auto it = c.extra.find(kKey);
  return it == c.extra.end() ? nullptr : &*it;
}

bool has_stats(const ChunkCache& c) {
  const nlohmann::json* e = cachecraft_extra(c);
  return e && e->contains("stats");
}

struct Scored {
  double beta = 0, gamma = 0, beta_prime = 0, cci = 0.5, penalty = 0.5;
};

Scored score(const VariantStats& s, const std::vector<std::string>& new_prefix) {
  Scored r;
  // S has zero weight but is present: a variant made after S alone keeps all its old prefix.
  r.beta = s.prefix.empty() && !s.system_id.empty() ? 1.0 : cachecraft::prefix_overlap_beta(s.prefix, new_prefix);
  r.gamma = cachecraft::order_penalty_gamma(s.prefix, new_prefix);
  r.beta_prime = cachecraft::adjusted_overlap(r.beta, r.gamma);
  r.cci = s.cci;
  r.penalty = cachecraft::reuse_penalty(r.cci, r.beta_prime);
  return r;
}

std::vector<TokenId> prefix_tokens(const RagRequest& req, size_t chunk_index) {
  std::vector<TokenId> p = req.system;
  for (size_t j = 0; j < chunk_index; ++j) p.insert(p.end(), req.chunks[j].begin(), req.chunks[j].end());
  return p;
}

std::vector<std::string> preceding_ids(uint64_t fp, const RagRequest& req, size_t chunk_index) {
  std::vector<std::string> ids;
  for (size_t j = 0; j < chunk_index; ++j) ids.push_back(segment_id(fp, req.chunks[j]));
  return ids;
}
}  // namespace

CacheCraftOptions CacheCraftOptions::from_json(const nlohmann::json& j) {
  CacheCraftOptions o;
  if (j.is_null()) return o;
  if (!j.is_object()) throw std::invalid_argument("cachecraft options must be a JSON object");
  // Each value checked for its type here: a json type_error would escape as a server error.
  auto boolean = [](const nlohmann::json& v, const std::string& k) {
    if (!v.is_boolean()) throw std::invalid_argument("cachecraft " + k + " must be true or false");
    return v.get<bool>();
  };
  auto whole = [](const nlohmann::json& v, const std::string& k, int64_t lo, int64_t hi) {
    if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi)
      throw std::invalid_argument("cachecraft " + k + " must be a whole number in [" + std::to_string(lo) + ", " +
                                  std::to_string(hi) + "]");
    return v.get<int64_t>();
  };
  for (const auto& [k, v] : j.items()) {
    if (k == "alpha") {
      if (!v.is_number() || !std::isfinite(v.get<double>()))
        throw std::invalid_argument("cachecraft alpha must be a finite number");
      o.alpha = v.get<double>();
    } else if (k == "own_budget") {
      o.own_budget = boolean(v, k);
    } else if (k == "max_variants") {  // every variant is a cache file per chunk: bounded
      o.max_variants = static_cast<size_t>(whole(v, k, 0, static_cast<int64_t>(kMaxVariantsCeiling)));
    } else if (k == "create_variants") {
      o.create_variants = boolean(v, k);
    } else if (k == "focus_early_stop") {
      o.focus_early_stop = boolean(v, k);
    } else if (k == "focus_window") {
      o.focus_window = static_cast<int>(whole(v, k, 1, 1024));
    } else {
      throw std::invalid_argument("unknown cachecraft option '" + k +
                                  "' (alpha, own_budget, max_variants, create_variants, focus_early_stop, focus_window)");
    }
  }
  if (!(o.alpha >= 0)) throw std::invalid_argument("cachecraft alpha must be >= 0");
  return o;
}

nlohmann::json VariantStats::to_json() const {
  nlohmann::json prefix_json = nlohmann::json::array();
  for (const auto& s : prefix) prefix_json.push_back({{"id", s.id}, {"n", s.n_tokens}, {"inter", s.inter}});
  return {{"prefix", prefix_json}, {"system", system_id}, {"intra", intra}, {"a_bar", a_bar},
          {"b_bar", b_bar},        {"cci", cci},          {"rank", rank}};
}

VariantStats VariantStats::from_json(const nlohmann::json& j) {
  VariantStats s;
  for (const auto& p : j.at("prefix")) s.prefix.push_back({p.at("id"), p.at("n"), p.at("inter")});
  s.system_id = j.value("system", "");
  s.intra = j.at("intra");
  s.a_bar = j.at("a_bar");
  s.b_bar = j.at("b_bar");
  s.cci = j.at("cci");
  if (j.contains("rank")) s.rank = j.at("rank").get<std::vector<uint32_t>>();
  return s;
}

std::string segment_id(uint64_t model_fingerprint, const std::vector<TokenId>& tokens) {
  return ChunkKey(model_fingerprint, tokens).id();
}

VariantStats pic_stats(Forward& fwd, const std::vector<TokenId>& chunk) {
  const ModelHparams& h = fwd.model().hparams();
  const size_t n = chunk.size();
  VariantStats s;
  if (n == 0) return s;
  std::vector<double> sink(n, 0.0), intra(n, 0.0);
  KvCache kv(h, n);
  const auto pos = iota_positions(n);
  ForwardHooks hooks;
  hooks.rows.resize(n);
  std::iota(hooks.rows.begin(), hooks.rows.end(), size_t{0});
  hooks.capture_attention = true;
  hooks.on_layer = [&](const LayerTap& t) {
    for (size_t r = 0; r < n; ++r)
      for (int hh = 0; hh < h.n_heads; ++hh) {
        const float* p = t.attn_probs + (r * h.n_heads + hh) * t.n_entries;
        sink[r] += p[0];
        for (size_t e = 0; e < r; ++e) intra[r] += p[e];  // strict k < q
      }
  };
  fwd.run(kv, {chunk, pos, {}, {}}, &hooks);
  const double norm = static_cast<double>(h.n_heads) * h.n_layers;
  for (size_t r = 0; r < n; ++r) s.intra += intra[r] / norm;
  s.b_bar = cachecraft::contextualization_b(s.intra, n);
  s.a_bar = 0;
  s.cci = cachecraft::cache_context_impact(s.a_bar, s.b_bar);
  s.rank = cachecraft::rank_tokens(sink);
  return s;
}

VariantBuildReport build_cachecraft_variants(Forward& fwd, ChunkStore& store, const RagRequest& req,
                                             const CacheCraftOptions& opt) {
  const auto t0 = SteadyClock::now();
  VariantBuildReport rep;
  const ModelHparams& h = fwd.model().hparams();
  const uint64_t fp = fwd.model().fingerprint();
  const size_t m = req.chunks.size();
  const std::string system_id = segment_id(fp, req.system);

  std::vector<size_t> begin(m + 1);
  begin[0] = req.system.size();
  for (size_t i = 0; i < m; ++i) begin[i + 1] = begin[i] + req.chunks[i].size();

  // Which chunks get a variant for this prefix.
  std::vector<std::shared_ptr<const ChunkCache>> pics(m);
  std::vector<KeyContext> variants(m);
  std::vector<bool> need(m, false);
  bool any = false;
  for (size_t i = 0; i < m; ++i) {
    if (req.chunks[i].empty()) continue;
    const ChunkKey pic_key(fp, req.chunks[i]);
    pics[i] = store.get_or_compute(pic_key, [&] { return compute_chunk_cache(fwd, pic_key); });
    variants[i] = KeyContext::after_prefix(prefix_tokens(req, i));
    const std::string hash = hash128_hex(variants[i].context_hash);
    size_t count = 0;
    bool exists = false;
    if (const nlohmann::json* e = cachecraft_extra(*pics[i]); e && e->contains("variants")) {
      count = e->at("variants").size();
      for (const auto& v : e->at("variants")) exists |= v.at("context_hash") == hash;
    }
    if (exists) ++rep.skipped_existing;
    else if (count >= opt.max_variants) ++rep.skipped_full;
    else need[i] = any = true;
  }
  if (!any) {
    rep.total_ms = ms_since(t0);
    return rep;
  }

  // One pass over S c1..cm; every context row's attention, summed per prefix segment.
  const std::vector<TokenId> tokens = req.flatten();
  const size_t ctx_begin = begin[0], ctx_end = begin[m];
  std::vector<size_t> chunk_of(ctx_end - ctx_begin);
  for (size_t i = 0; i < m; ++i)
    for (size_t s = begin[i]; s < begin[i + 1]; ++s) chunk_of[s - ctx_begin] = i;
  // seg[r][j]: attention of context row r to segment j (0 = S, j = chunk j-1), j <= chunk.
  std::vector<std::vector<double>> seg(ctx_end - ctx_begin);
  std::vector<double> intra(ctx_end - ctx_begin, 0.0);
  for (size_t r = 0; r < seg.size(); ++r) seg[r].assign(chunk_of[r] + 1, 0.0);

  KvCache full(h, tokens.size());
  const auto pos = iota_positions(tokens.size());
  ForwardHooks hooks;
  for (size_t s = ctx_begin; s < ctx_end; ++s)
    if (need[chunk_of[s - ctx_begin]]) hooks.rows.push_back(s);
  // Probabilities row by row from the tapped Q and the layer's finished K, instead of the
  // hook's capture: that buffer (rows x heads x entries) is over 1 GB a layer at 6k tokens.
  const size_t q_dim = static_cast<size_t>(h.n_heads) * h.head_dim;
  std::vector<std::vector<float>> probs(fwd.pool().size() + 1);
  hooks.on_layer = [&](const LayerTap& t) {
    const AttentionShape shape = attention_shape(h, t.layer);  // its window (Gemma 3) included
    fwd.pool().parallel_for(t.rows.size(), [&](size_t ri, size_t thread) {
      const size_t slot = t.rows[ri];
      const size_t r = slot - ctx_begin;
      const size_t ci = chunk_of[r];
      std::vector<float>& pb = probs[thread];
      pb.resize(static_cast<size_t>(h.n_heads) * t.n_entries);
      attention_probs(shape, t.q + ri * q_dim, static_cast<int32_t>(slot), full.k_f16(t.layer, 0), full.positions().data(),
                      t.n_entries, pb.data());
      for (int hh = 0; hh < h.n_heads; ++hh) {
        const float* p = pb.data() + static_cast<size_t>(hh) * t.n_entries;
        for (size_t j = 0; j <= ci; ++j) {
          const size_t lo = j == 0 ? 0 : begin[j - 1], hi = j == 0 ? ctx_begin : begin[j];
          double sum = 0;
          for (size_t e = lo; e < hi; ++e) sum += p[e];
          seg[r][j] += sum;
        }
        double in = 0;
        for (size_t e = begin[ci]; e < slot; ++e) in += p[e];  // strict k < q
        intra[r] += in;
      }
    });
  };
  const auto tf = SteadyClock::now();
  fwd.run(full, {tokens, pos, {}, {}}, &hooks);
  rep.forward_ms = ms_since(tf);

  const double norm = static_cast<double>(h.n_heads) * h.n_layers;
  const size_t n_ctx = ctx_end - ctx_begin;
  for (size_t i = 0; i < m; ++i) {
    if (!need[i]) continue;
    const size_t n = req.chunks[i].size();
    VariantStats st;
    st.system_id = system_id;
    for (size_t j = 0; j < i; ++j) st.prefix.push_back({segment_id(fp, req.chunks[j]), req.chunks[j].size(), 0.0});
    std::vector<double> to_chunks(n, 0.0), to_system(n, 0.0);
    for (size_t t = 0; t < n; ++t) {
      const size_t r = begin[i] - ctx_begin + t;
      to_system[t] = seg[r][0] / norm;
      for (size_t j = 0; j < i; ++j) {
        st.prefix[j].inter += seg[r][j + 1] / norm;
        to_chunks[t] += seg[r][j + 1] / norm;
      }
      st.intra += intra[r] / norm;
    }
    st.a_bar = cachecraft::contextualization_a(st.prefix, n);
    st.b_bar = cachecraft::contextualization_b(st.intra, n);
    st.cci = cachecraft::cache_context_impact(st.a_bar, st.b_bar);
    st.rank = rank_by(to_chunks, to_system);

    KvCache kv(h, n);
    kv.append_from(full, begin[i], begin[i + 1], 0);
    ChunkCache variant(ChunkKey(fp, req.chunks[i], variants[i]), std::move(kv));
    variant.offline_ms = rep.forward_ms * static_cast<double>(n) / static_cast<double>(n_ctx);  // its share
    variant.created_unix_ms = unix_time_ms();
    variant.extra[kKey]["stats"] = st.to_json();
    store.put(std::move(variant));

    // The chunk's metadata-store entry lists the new variant (stats without the ranking).
    auto latest = store.get(pics[i]->key);  // re-read: this request may hold the chunk twice
    ChunkCache pic = latest ? *latest : *pics[i];
    if (!has_stats(pic)) pic.extra[kKey]["stats"] = pic_stats(fwd, pic.tokens()).to_json();
    nlohmann::json entry = {{"context_hash", hash128_hex(variants[i].context_hash)}, {"stats", st.to_json()}};
    entry["stats"].erase("rank");
    pic.extra[kKey]["variants"].push_back(std::move(entry));
    store.put(std::move(pic));
    ++rep.created;
  }
  rep.total_ms = ms_since(t0);
  return rep;
}

namespace {
class CacheCraftSelector final : public Selector {
 public:
  explicit CacheCraftSelector(CacheCraftOptions opt) : opt_(opt) {}
  std::string_view name() const override { return "cachecraft"; }
  void configure(const nlohmann::json& options) override { opt_ = CacheCraftOptions::from_json(options); }
  std::vector<MethodParam> parameters() const override {
    return {
        {"alpha", "number", opt_.alpha, {}, "alpha of Eq. 12: the recompute fraction's scale (>= 0)"},
        {"own_budget", "boolean", opt_.own_budget, {}, "Cache-Craft picks its own budget; the ratio only caps it"},
        {"max_variants", "integer", opt_.max_variants, {}, "stored prefix-dependent caches per chunk besides its PIC cache"},
        {"create_variants", "boolean", opt_.create_variants, {}, "store each chunk's cache after this request's prefix for later requests"},
        {"focus_early_stop", "boolean", opt_.focus_early_stop, {}, "stop recomputing unfocused chunks (Alg. 1)"},
        {"focus_window", "integer", opt_.focus_window, {}, "w of Alg. 1: layers the focused set must stay the same (>= 1)"},
    };
  }
  double offline_ms() const override { return offline_ms_; }

  std::shared_ptr<const ChunkCache> lookup_chunk(Forward& fwd, ChunkStore& store, const ChunkKey& pic_key,
                                                 const RagRequest& request, size_t chunk_index) override {
    store_ = &store;  // select() credits the caches it reuses (f_r)
    if (!planned_) plan(fwd, store, request);
    return chunk_index < chosen_.size() ? chosen_[chunk_index] : nullptr;
  }

  bool needs_preparation(const ChunkCache& chunk) const override { return !has_stats(chunk); }

  void prepare_chunk(Forward& fwd, ChunkCache& chunk) override {
    // Only PIC caches arrive without stats (variants are made with theirs).
    chunk.extra[kKey]["stats"] = pic_stats(fwd, chunk.tokens()).to_json();
  }

  Selection select(Forward& fwd, FusionInputs& in) override {
    const uint64_t fp = fwd.model().fingerprint();
    const size_t k = in.chunks.size();
    const size_t n_ctx = in.context_tokens();
    const size_t budget = recompute_budget(in.ratio, n_ctx);
    std::vector<double> penalty(k, 0.5);
    std::vector<size_t> sizes(k);
    std::vector<Scored> scored(k);
    std::vector<std::vector<uint32_t>> rank(k);
    for (size_t i = 0; i < k; ++i) {
      const ChunkCache& c = *in.chunks[i].cache;
      sizes[i] = in.chunks[i].n_tokens;
      if (const nlohmann::json* e = cachecraft_extra(c); e && e->contains("stats")) {
        const VariantStats st = VariantStats::from_json(e->at("stats"));
        if (c.key.context().kind != ContextKind::pic) scored[i] = score(st, preceding_ids(fp, in.request, i));
        rank[i] = st.rank;
      }
      penalty[i] = scored[i].penalty;
      if (rank[i].size() != sizes[i]) {  // no stats: position order
        rank[i].resize(sizes[i]);
        std::iota(rank[i].begin(), rank[i].end(), 0u);
      }
    }

    const std::vector<size_t> cfo_counts = cachecraft::cfo_token_counts(opt_.alpha, penalty, sizes);
    const size_t cfo_total = std::accumulate(cfo_counts.begin(), cfo_counts.end(), size_t{0});
    double alpha_used = opt_.alpha;
    std::vector<size_t> counts;
    if (opt_.own_budget && cfo_total <= budget) counts = cfo_counts;
    else counts = cachecraft::allocate_budget(budget, penalty, sizes, &alpha_used);

    Selection sel;
    nlohmann::json per_chunk = nlohmann::json::array();
    for (size_t i = 0; i < k; ++i) {
      for (size_t t = 0; t < counts[i]; ++t) sel.slots.push_back(in.chunks[i].begin + rank[i][t]);
      const KeyContext& cv = in.chunks[i].cache->key.context();
      const double cfo = cachecraft::cache_fix_overhead(opt_.alpha, scored[i].cci, scored[i].beta_prime);
      if (store_) store_->note_use(in.chunks[i].cache->key.id(), cfo);  // f_r += 1/CFO (§3.3)
      per_chunk.push_back({{"variant", context_kind_name(cv.kind)},
                           {"context_hash", hash128_hex(cv.context_hash)},
                           {"penalty", penalty[i]},
                           {"beta", scored[i].beta},
                           {"gamma", scored[i].gamma},
                           {"beta_prime", scored[i].beta_prime},
                           {"cci", scored[i].cci},
                           {"cfo", cfo},
                           {"tokens", sizes[i]},
                           {"recomputed", counts[i]}});
    }
    std::sort(sel.slots.begin(), sel.slots.end());
    // Its two metrics as one score: the chunk's penalty CCI·(1-β') scaled down along the
    // chunk's stored token ranking (attention to the old prefix), so each chunk's chosen
    // tokens are its top-scored ones.
    for (size_t i = 0; i < k; ++i) {
      std::vector<double> s(sizes[i], 0.0);
      for (size_t r = 0; r < rank[i].size() && r < sizes[i]; ++r)
        if (rank[i][r] < sizes[i]) s[rank[i][r]] = penalty[i] * (1.0 - static_cast<double>(r) / static_cast<double>(sizes[i]));
      sel.scores.insert(sel.scores.end(), s.begin(), s.end());
    }
    sel.score_kind = "chunk penalty CCI*(1-beta') x the token's place in its stored ranking";
    sel.details = {{"chunks", per_chunk},
                   {"alpha", opt_.alpha},
                   {"alpha_used", std::isfinite(alpha_used) ? nlohmann::json(alpha_used) : nlohmann::json("inf")},
                   {"own_budget", opt_.own_budget},
                   {"cfo_fraction", n_ctx ? static_cast<double>(cfo_total) / static_cast<double>(n_ctx) : 0.0},
                   {"variants_created", created_},
                   {"variant_build_ms", offline_ms_}};
    return sel;
  }

  bool recompute_hooks(const FusionInputs& in, const std::vector<size_t>& recompute_slots, ForwardHooks& hooks) override {
    focus_ = Focus{};
    if (!opt_.focus_early_stop || in.ratio >= 1.0 || in.chunks.size() < 2 || recompute_slots.empty()) return false;
    const size_t n_p = recompute_slots.size(), n_u = in.suffix_tokens().size();
    focus_.active = true;
    focus_.cumulative.assign(in.chunks.size(), 0.0);
    focus_.chunk_of_row.resize(n_p);
    for (size_t r = 0; r < n_p; ++r) {  // chunks are laid out in slot order
      size_t c = 0;
      while (c + 1 < in.chunks.size() && in.chunks[c + 1].begin <= recompute_slots[r]) ++c;
      focus_.chunk_of_row[r] = c;
    }
    for (size_t i = 0; i < n_u; ++i) hooks.rows.push_back(n_p + i);
    hooks.capture_attention = true;
    const int n_heads = in.cache.hparams().n_heads;
    std::vector<std::pair<size_t, size_t>> spans;
    for (const auto& c : in.chunks) spans.emplace_back(c.begin, c.begin + c.n_tokens);
    hooks.on_layer = [this, spans, n_heads](const LayerTap& t) {
      if (focus_.decided) return;
      const size_t per_row = static_cast<size_t>(n_heads) * t.n_entries;
      const double norm = 1.0 / static_cast<double>(t.rows.size() * static_cast<size_t>(n_heads));
      for (size_t c = 0; c < spans.size(); ++c) {
        double mass = 0;
        for (size_t r = 0; r < t.rows.size(); ++r)
          for (int hd = 0; hd < n_heads; ++hd) {
            const float* p = t.attn_probs + r * per_row + static_cast<size_t>(hd) * t.n_entries;
            for (size_t e = spans[c].first; e < spans[c].second; ++e) mass += p[e];
          }
        focus_.cumulative[c] += mass * norm;
      }
      // The focused set at this layer: the chunks above the largest gap.
      std::vector<size_t> order(spans.size());
      std::iota(order.begin(), order.end(), size_t{0});
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return focus_.cumulative[a] > focus_.cumulative[b]; });
      order.resize(cachecraft::focused_chunk_count(focus_.cumulative));
      std::sort(order.begin(), order.end());
      focus_.history.push_back(order);
      const size_t w = static_cast<size_t>(opt_.focus_window);
      if (focus_.history.size() >= w &&
          std::all_of(focus_.history.end() - static_cast<std::ptrdiff_t>(w), focus_.history.end(),
                      [&](const auto& f) { return f == order; })) {
        focus_.decided = true;
        focus_.layer = t.layer;
        focus_.focused = order;
      }
    };
    hooks.retire_after_layer = [this](int layer) {
      std::vector<size_t> leaving;
      if (!focus_.decided || focus_.retired || layer != focus_.layer) return leaving;
      focus_.retired = true;
      for (size_t r = 0; r < focus_.chunk_of_row.size(); ++r)
        if (!std::binary_search(focus_.focused.begin(), focus_.focused.end(), focus_.chunk_of_row[r])) leaving.push_back(r);
      focus_.rows_retired = leaving.size();
      return leaving;
    };
    return true;
  }

  void after_recompute(nlohmann::json& details) override {
    if (!focus_.active) return;
    details["focus"] = {{"decided", focus_.decided},
                        {"layer", focus_.decided ? nlohmann::json(focus_.layer) : nlohmann::json(nullptr)},
                        {"focused_chunks", focus_.focused},
                        {"rows_retired", focus_.rows_retired},
                        {"window", opt_.focus_window}};
  }

 private:
  struct Focus {  // state of Alg. 1 during one recompute pass
    bool active = false, decided = false, retired = false;
    int layer = -1;
    std::vector<double> cumulative;           // cinter per chunk
    std::vector<std::vector<size_t>> history;  // focused set per layer
    std::vector<size_t> focused, chunk_of_row;
    size_t rows_retired = 0;
  };
  Focus focus_;

  void plan(Forward& fwd, ChunkStore& store, const RagRequest& req) {
    planned_ = true;
    const uint64_t fp = fwd.model().fingerprint();
    const std::string system_id = segment_id(fp, req.system);
    chosen_.assign(req.chunks.size(), nullptr);
    for (size_t i = 0; i < req.chunks.size(); ++i) {
      auto pic = store.get(ChunkKey(fp, req.chunks[i]));
      const nlohmann::json* e = pic ? cachecraft_extra(*pic) : nullptr;
      if (!e || !e->contains("variants")) continue;
      const auto new_prefix = preceding_ids(fp, req, i);
      double best = Scored{}.penalty;  // the PIC cache's: CCI 0.5, β' 0
      bool have = false;
      Hash128 best_hash{};
      for (const auto& v : e->at("variants")) {
        const VariantStats st = VariantStats::from_json(v.at("stats"));
        if (st.system_id != system_id) continue;
        const double p = score(st, new_prefix).penalty;
        if (p < best || (!have && p <= best)) {
          best = p;
          have = parse_hash128_hex(v.at("context_hash").get<std::string>(), best_hash);
        }
      }
      if (have)  // a variant lost from the store falls back to the PIC cache
        chosen_[i] = store.get(ChunkKey(fp, req.chunks[i], KeyContext{ContextKind::after_prefix, best_hash}));
    }
    if (opt_.create_variants) {
      const VariantBuildReport rep = build_cachecraft_variants(fwd, store, req, opt_);
      offline_ms_ += rep.total_ms;
      created_ = rep.created;
    }
  }

  CacheCraftOptions opt_;
  ChunkStore* store_ = nullptr;  // the executor's, set by lookup_chunk; outlives this request
  bool planned_ = false;
  std::vector<std::shared_ptr<const ChunkCache>> chosen_;
  double offline_ms_ = 0;
  size_t created_ = 0;
};
}  // namespace

size_t cachecraft_variant_count(const nlohmann::json& extra) {
  const auto e = extra.find(kKey);
  if (e == extra.end() || !e->is_object()) return 0;
  const auto v = e->find("variants");
  return v != e->end() && v->is_array() ? v->size() : 0;
}

std::unique_ptr<Selector> make_cachecraft_selector(const CacheCraftOptions& opt) {
  return std::make_unique<CacheCraftSelector>(opt);
}
std::unique_ptr<Selector> make_cachecraft_selector() { return make_cachecraft_selector(CacheCraftOptions{}); }

}  // namespace cf
