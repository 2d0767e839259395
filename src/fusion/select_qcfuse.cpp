// QCFuse selection (arXiv 2606.05875 §3.3-3.5, Eq. 15-20; digest-qcfuse.md §2.2-2.4):
//  offline: per chunk, KVzip anchor rankings (prepare_chunk, kept in
//           ChunkCache::extra["qcfuse"]); per model, the critical layers L* (a profile:
//           chunkfuse profile-layers, or the one shipped in data/qcfuse_profiles).
//  online:  U runs over S + every chunk's anchors (request positions kept, U after the full
//           context) up to the deepest critical layer; the question rows' queries at each
//           layer of L* are scored against the stitched cache's full keys; the scores are
//           summed over L*, heads and rows (Eq. 20) and the global top floor(rho N) context
//           positions are recomputed (Eq. 11). The stitched cache is never written: the probe
//           runs in a scratch cache (qcfuse::query_probe, shared with ProphetKV).
//
// Options (--method-options '{"qcfuse": {...}}' or the request's fusion.options); the
// default of each is the paper's / the authors' artifact's reading (issue 16):
//   anchor_ratio  r_a in [0, 1] (0.1, §3.3.3 Implication 2; 0 = query-only probing, §4.6.1)
//   anchors       "per_layer" (artifact: each layer its own set) | "shared" (one set, summed layers)
//   anchor_sinks  true (artifact: 4 system-prefix sink keys in the KVzip softmax) | false
//   probe_rows    "question" (artifact: question tokens only) | "suffix" (all of U)
//   layers        "profile" (L*, §3.4.3) | "all" | "top1" (profiled Top-1, §4.6.2) | "middle"
//                 (floor(L/2)) | "last" | [l, ...]
//   profile       "default" (cached profile, else the shipped default) | "evidence" | "prophet"
//                 (the shipped profile of that target) | a profile file; one made for another
//                 model is refused
// Deviations (besides those of qcfuse_anchors.cpp):
//  - the shipped default profile is the one that measured best on our calibration split
//    (docs/benchmarks-history.md, issue 16), whichever target made it; the paper profiles gold answer spans;
//  - without any profile, L* = {floor(L/2)} (the paper's best fixed layer, §4.6.2), or on a
//    model with sliding-window layers the global layer nearest to it, said in
//    Selection::details and printed by `chunkfuse ask`;
//  - the artifact's budget is max(1, int(rho N)); we use floor(rho N) (the paper's Eq. 11),
//    so rho = 0 recomputes nothing;
//  - the paper overlaps loading critical-layer keys with the probe; here all PIC K/V are
//    already in memory (stitched), so there is nothing to overlap;
//  - a chat request's suffix (the server) has no known question span: all of U probes there;
//  - a request over twice as long as the profile's longest calibration prompt is said in
//    Selection::details["profile_note"] (the paper profiles one length; ours rank differently
//    at 1.4K and 6K tokens, docs/benchmarks-history.md). The 1.5B's shipped profile is fitted on ~6K-token
//    prompts, which did as well on short ones; on the 0.5B neither length's profile won both.
#include <chrono>
#include <filesystem>
#include <mutex>
#include <stdexcept>

#include "base/bounded_json.h"
#include "fusion/qcfuse.h"
#include "fusion/selector.h"
#include "fusion/top_k.h"

namespace cf {
namespace {

struct CriticalLayers {
  std::vector<int> layers;
  std::string source;             // profile path, or why the fallback is used
  size_t fitted_max_tokens = 0;   // the profile's longest calibration prompt; 0: not recorded
};

// The longest prompt a profile was fitted on (profile-layers records it since 2026-11-28;
// 0 for an older profile).
size_t fitted_max_tokens(const qcfuse::LayerProfile& p) {
  const auto it = p.data.find("context_tokens");
  if (it == p.data.end() || !it->is_object() || !it->contains("max") || !(*it)["max"].is_number_unsigned()) return 0;
  return (*it)["max"].get<size_t>();
}

// Said when a request is much longer than any prompt its profile was fitted on: on the 1.5B,
// layers ranked on ~1.4K-token prompts lost to layers ranked on ~6K-token ones there, while the
// long-prompt layers did as well on short prompts (docs/benchmarks-history.md, "A profile fitted on long
// prompts"; on the 0.5B the long-prompt layers raised fidelity and not KL). A note, not a
// refusal: the layers still serve.
constexpr size_t kProfileLengthMargin = 2;
std::string profile_length_note(const CriticalLayers& cl, size_t context_tokens) {
  if (cl.fitted_max_tokens == 0 || context_tokens <= kProfileLengthMargin * cl.fitted_max_tokens) return "";
  return "profile fitted on prompts of at most " + std::to_string(cl.fitted_max_tokens) + " context tokens, this one has " +
         std::to_string(context_tokens) +
         ": layers ranked on short prompts may not rank a long one's tokens; fit a profile on prompts like yours "
         "(chunkfuse profile-layers --data FILE)";
}

std::vector<int> layers_of(const qcfuse::LayerProfile& p, int n_layers) {
  std::vector<int> out;
  for (int l : p.critical_layers)
    if (l >= 0 && l < n_layers) out.push_back(l);
  return out;
}

// A profile made before profile-layers kept local layers out may name some: said where the
// layers' source is reported, since on a prompt longer than the window they see only its end.
std::string local_layers_note(const std::vector<int>& layers, const ModelHparams& h) {
  std::string local;
  for (int l : layers)
    if (h.is_local(l)) local += (local.empty() ? "" : ", ") + std::to_string(l);
  if (local.empty()) return "";
  return " (names sliding-window layer(s) " + local + ", which see only the last " + std::to_string(h.sliding_window) +
         " positions: re-run chunkfuse profile-layers)";
}

// The default profile of the model: the cache's (re-read only when its file changes; the
// executor makes one selector per request), else the shipped one, else floor(L/2).
CriticalLayers default_critical_layers(const Model& m) {
  static std::mutex mu;
  static std::string cached_path;
  static std::filesystem::file_time_type cached_time;
  static CriticalLayers cached;
  const std::string path = qcfuse::default_profile_path(m.fingerprint_hex());
  const int n_layers = m.hparams().n_layers;
  std::error_code ec;
  const auto mtime = std::filesystem::last_write_time(path, ec);
  std::lock_guard<std::mutex> lock(mu);
  if (!ec && path == cached_path && mtime == cached_time) return cached;
  CriticalLayers out;
  std::string why = "no profile at " + path;
  auto take = [&](const qcfuse::LayerProfile& p, const std::string& where) {
    out.layers = layers_of(p, n_layers);
    out.fitted_max_tokens = fitted_max_tokens(p);
    if (out.layers.empty()) why = "profile " + where + " names no layer of this model";
    else out.source = where + local_layers_note(out.layers, m.hparams());
  };
  if (!ec) {
    try {
      if (auto p = qcfuse::load_profile(path)) {
        qcfuse::check_profile_model(*p, m.fingerprint_hex(), path);  // a copied file of another model: refused
        take(*p, path);
      }
    } catch (const std::exception& e) {
      why = std::string("refused profile: ") + e.what();
      out.layers.clear();
    }
  }
  if (out.layers.empty()) {
    std::string where;
    if (auto p = qcfuse::bundled_profile(m.fingerprint_hex(), &where)) take(*p, "bundled " + where);
  }
  if (out.layers.empty()) {
    out.layers = {qcfuse::fallback_critical_layer(m.hparams())};
    out.fitted_max_tokens = 0;
    out.source = "fallback middle layer (" + why + " and none bundled for this model; run chunkfuse profile-layers)";
  }
  if (!ec) {
    cached_path = path;
    cached_time = mtime;
    cached = out;
  }
  return out;
}

// `choice`: "default", a shipped target ("evidence", "prophet") or a profile file.
CriticalLayers profile_layers(const Model& m, const std::string& choice) {
  if (choice == "default") return default_critical_layers(m);
  const std::string fp = m.fingerprint_hex();
  std::string where;
  std::optional<qcfuse::LayerProfile> p;
  if (choice == "evidence" || choice == "prophet") {
    p = qcfuse::bundled_profile(fp, &where, choice);
    if (!p) {  // the shipped default may itself be of that target
      p = qcfuse::bundled_profile(fp, &where);
      if (p && p->target != choice) p.reset();
    }
    if (!p) throw std::invalid_argument("qcfuse profile '" + choice + "': none shipped for model " + fp);
    where = "bundled " + where;
  } else {
    try {
      p = qcfuse::load_profile(choice);
    } catch (const std::exception& e) {
      throw std::invalid_argument(std::string("qcfuse profile: ") + e.what());
    }
    if (!p)
      throw std::invalid_argument("qcfuse profile '" + choice +
                                  "': no such file (known: default, evidence, prophet, or a profile file)");
    where = choice;
  }
  try {
    qcfuse::check_profile_model(*p, fp, where);
  } catch (const std::runtime_error& e) {
    throw std::invalid_argument(e.what());
  }
  CriticalLayers out{layers_of(*p, m.hparams().n_layers), where, fitted_max_tokens(*p)};
  out.source += local_layers_note(out.layers, m.hparams());
  if (out.layers.empty()) throw std::invalid_argument("qcfuse profile " + where + " names no layer of this model");
  return out;
}

class QcfuseSelector final : public Selector {
 public:
  std::string_view name() const override { return "qcfuse"; }

  void configure(const nlohmann::json& options) override {
    if (options.is_null()) return;
    if (!options.is_object()) throw std::invalid_argument("qcfuse options must be a JSON object");
    auto bad = [](const std::string& key, const std::string& what) {
      throw std::invalid_argument("qcfuse option '" + key + "': " + what);
    };
    for (const auto& [key, value] : options.items()) {
      if (key == "anchor_ratio") {
        if (!value.is_number() || !(value.get<double>() >= 0.0 && value.get<double>() <= 1.0))
          bad(key, "must be a number in [0, 1], got " + json_excerpt(value));
        anchor_ratio_ = value.get<double>();
      } else if (key == "anchors") {
        if (value == "per_layer") rule_.per_layer = true;
        else if (value == "shared") rule_.per_layer = false;
        else bad(key, "must be \"per_layer\" or \"shared\", got " + json_excerpt(value));
      } else if (key == "anchor_sinks") {
        if (!value.is_boolean()) bad(key, "must be true or false, got " + json_excerpt(value));
        rule_.sinks = value.get<bool>();
      } else if (key == "probe_rows") {
        if (!value.is_string() || !qcfuse::parse_probe_rows(value.get<std::string>(), rows_))
          bad(key, "must be \"question\" or \"suffix\", got " + json_excerpt(value));
      } else if (key == "layers") {
        fixed_layers_.clear();
        if (value.is_string()) {
          const std::string v = value.get<std::string>();
          if (v != "profile" && v != "all" && v != "top1" && v != "middle" && v != "last")
            bad(key, "must be \"profile\", \"all\", \"top1\", \"middle\", \"last\" or a list of layers, got " + json_excerpt(value));
          layer_mode_ = v;
        } else if (value.is_array() && !value.empty()) {
          for (const auto& l : value) {
            if (!l.is_number_integer() || l.get<long long>() < 0 || l.get<long long>() > 100000)
              bad(key, "layers must be non-negative integers, got " + json_excerpt(l));
            fixed_layers_.push_back(l.get<int>());
          }
          layer_mode_ = "list";
        } else {
          bad(key, "must be a non-empty list of layers or a name, got " + json_excerpt(value));
        }
      } else if (key == "profile") {
        if (!value.is_string() || value.get<std::string>().empty()) bad(key, "must be a name or a file, got " + json_excerpt(value));
        profile_ = value.get<std::string>();
      } else {
        throw std::invalid_argument("qcfuse has no option '" + key +
                                    "' (known: anchor_ratio, anchors, anchor_sinks, probe_rows, layers, profile)");
      }
    }
  }

  std::vector<MethodParam> parameters() const override {
    return {
        {"anchor_ratio", "number", anchor_ratio_, {}, "share of each chunk's tokens kept as anchors (0: no anchors), in [0, 1]"},
        {"anchors", "string", rule_.per_layer ? "per_layer" : "shared", {"per_layer", "shared"},
         "one anchor set per layer, or one per chunk"},
        {"anchor_sinks", "boolean", rule_.sinks, {}, "the system prefix's first tokens are keys when ranking anchors"},
        {"probe_rows", "string", qcfuse::probe_rows_name(rows_), {"question", "suffix"},
         "which rows of the question suffix probe"},
        {"layers", "layers", layer_mode_, {"profile", "all", "top1", "middle", "last"},
         "probe layers: a name, or a list of layer numbers"},
        {"profile", "string", profile_, {"default", "evidence", "prophet"},
         "critical-layer profile (a shipped one by name over the API)"},
    };
  }

  bool needs_preparation(const ChunkCache& chunk) const override {
    return anchor_ratio_ > 0 && !qcfuse::stored_anchors(chunk, anchor_ratio_, rule_, 0).has_value();
  }
  void prepare_chunk(Forward& fwd, ChunkCache& chunk) override { qcfuse::prepare_anchors(fwd, chunk, rule_); }

  Selection select(Forward& fwd, FusionInputs& in) override {
    const size_t n = in.context_tokens();
    const size_t k = recompute_budget(in.ratio, n);
    Selection sel;
    sel.details["anchor_ratio"] = anchor_ratio_;
    if (k == 0 || n == 0) return sel;
    const CriticalLayers cl = layers_for(fwd.model());
    const int deepest = *std::max_element(cl.layers.begin(), cl.layers.end());

    // Anchors of every chunk as slots of the stitched cache, per layer up to the deepest.
    qcfuse::ProbeView view;
    view.anchors.resize(rule_.per_layer ? static_cast<size_t>(deepest) + 1 : 1);
    size_t computed_online = 0;
    for (const ChunkPlacement& c : in.chunks) {
      if (!c.cache) continue;
      bool online = false;
      const auto sets = qcfuse::chunk_anchor_sets(fwd, *c.cache, anchor_ratio_, rule_, deepest + 1, &online);
      computed_online += online ? 1 : 0;
      for (size_t l = 0; l < view.anchors.size(); ++l)
        for (uint32_t x : sets[l])
          if (x < c.n_tokens) view.anchors[l].push_back(c.begin + x);
    }
    const RagRequest& req = in.request;
    const auto [rb, re] = qcfuse::probe_row_range(req, rows_);
    const qcfuse::ProbeResult pr =
        qcfuse::query_probe(fwd, in.cache, in.context_begin, in.context_end, view, in.suffix_tokens(), rb, re, cl.layers);
    const std::vector<double> score = qcfuse::sum_layers(pr);
    sel.slots = top_k_slots(score, in.context_begin, k);
    sel.details["critical_layers"] = cl.layers;
    sel.details["layers_source"] = cl.source;
    if (cl.fitted_max_tokens > 0) sel.details["profile_max_context_tokens"] = cl.fitted_max_tokens;
    if (const std::string note = profile_length_note(cl, n); !note.empty()) sel.details["profile_note"] = note;
    sel.details["probe_depth"] = deepest + 1;
    sel.details["anchors"] = pr.anchor_entries;
    sel.details["anchor_rule"] = rule_.name() + (rule_.per_layer ? "_per_layer" : "_shared");
    sel.details["anchors_computed_online"] = computed_online;
    sel.details["probe_rows"] = re - rb == req.suffix.size() ? "suffix" : "question";
    sel.details["probe_ms"] = pr.probe_ms;
    sel.details["score_ms"] = pr.score_ms;
    sel.scores = std::move(score);
    sel.score_kind = "question-to-key attention at the critical layers, summed (Eq. 20)";
    return sel;
  }

 private:
  CriticalLayers layers_for(const Model& m) const {
    const int L = m.hparams().n_layers;
    if (layer_mode_ == "list") {
      for (int l : fixed_layers_)
        if (l < 0 || l >= L)
          throw std::invalid_argument("qcfuse option 'layers': " + std::to_string(l) + " is not a layer of the model (0.." +
                                      std::to_string(L - 1) + ")");
      return {fixed_layers_, "method option"};
    }
    if (layer_mode_ == "all") {
      std::vector<int> all(static_cast<size_t>(L));
      for (int l = 0; l < L; ++l) all[static_cast<size_t>(l)] = l;
      return {all, "all layers"};
    }
    if (layer_mode_ == "middle") return {{L / 2}, "floor(L/2)"};
    if (layer_mode_ == "last") return {{L - 1}, "last layer"};
    CriticalLayers p = profile_layers(m, profile_);
    if (layer_mode_ == "top1") {
      p.layers.resize(1);
      p.source += " (top-1)";
    }
    return p;
  }

  double anchor_ratio_ = qcfuse::kDefaultAnchorRatio;
  qcfuse::AnchorRule rule_;
  qcfuse::ProbeRows rows_ = qcfuse::ProbeRows::question;
  std::string layer_mode_ = "profile";
  std::vector<int> fixed_layers_;
  std::string profile_ = "default";
};
}  // namespace

std::unique_ptr<Selector> make_qcfuse_selector() { return std::make_unique<QcfuseSelector>(); }
}  // namespace cf
