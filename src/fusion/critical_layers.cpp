// QCFuse critical-layer profiling (§3.2.3 Eq. 12-13, §3.4 Eq. 18-19): once per model,
// every layer's anchor-conditioned score I_l (Eq. 18) is judged by Recall@10% and the top-3
// layers by their individual recall become L*. Two targets for the recall:
//  - evidence: gold evidence positions (Eq. 13);
//  - prophet: the full-view selector's own top-10% set (ProphetKV, all layers, same probe
//    rows), the agreement §3.2.2 / Fig. 5 measures; it needs no labels.
// The probe uses the serving defaults (per-layer KVzip anchors with sink keys, question rows),
// so what is profiled is what is served; each is a ProfileOptions field.
// Deviations:
//  - on a model with sliding-window layers only the global layers may become critical
//    (LayerCandidates, qcfuse.h: the paper's models have none; a local layer profiled on
//    short prompts is not the layer served on long ones);
//  - calibration data: Natural Questions (oracle passage + other examples' passages as
//    distractors, gold = answer occurrences) and HotpotQA (gold = supporting sentences),
//    the last examples of each file (evaluation runs usually take the first ones); the
//    paper uses SQuAD, NewsQA and NQ, which we do not have offline. HotpotQA gold is whole
//    evidence sentences, not answer spans.
//  - the recall of a layer is the mean of the two datasets' mean recalls;
//  - the .gz file is read through `gzip -dc` (no zlib in the build).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <optional>
#include <stdexcept>

#include "base/clock.h"
#include "base/paths.h"
#include "fusion/bundled_profiles.h"
#include "fusion/qcfuse.h"
#include "fusion/selector.h"
#include "fusion/top_k.h"
#include "kv/chunk_store.h"

namespace cf::qcfuse {
namespace {

std::vector<std::string> read_lines(const std::string& path) {
  std::vector<std::string> lines;
  const bool gz = path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  if (!std::filesystem::exists(path)) throw std::runtime_error(path + ": no such file");
  if (!gz) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error(path + ": cannot open");
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) lines.push_back(std::move(line));
    return lines;
  }
  std::string quoted = "'";
  for (char c : path) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  quoted += "'";
  FILE* p = ::popen(("gzip -dc -- " + quoted).c_str(), "r");
  if (!p) throw std::runtime_error(path + ": cannot run gzip");
  std::string cur;
  char buf[1 << 16];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, p)) > 0) {
    for (size_t i = 0; i < got; ++i) {
      if (buf[i] == '\n') {
        if (!cur.empty()) lines.push_back(std::move(cur));
        cur.clear();
      } else {
        cur += buf[i];
      }
    }
  }
  if (!cur.empty()) lines.push_back(std::move(cur));
  if (::pclose(p) != 0) throw std::runtime_error(path + ": gzip failed");
  return lines;
}

// Prefix passage_text() puts before the passage body.
size_t body_offset(const Passage& p) { return p.title.empty() ? 0 : std::string("Title: " + p.title + "\n").size(); }

std::vector<std::pair<size_t, size_t>> find_all(const std::string& hay, const std::string& needle) {
  std::vector<std::pair<size_t, size_t>> out;
  if (needle.empty()) return out;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + needle.size()))
    out.emplace_back(at, at + needle.size());
  return out;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The answers' occurrences in the passage's chunk text, as byte spans of it: exact matches,
// else case-insensitive ones.
std::vector<std::pair<size_t, size_t>> answer_spans(const Passage& p, const std::vector<std::string>& answers) {
  const std::string text = passage_text(p, RagPromptOptions{});
  const size_t off = body_offset(p);
  const std::string body = text.substr(off);
  std::vector<std::pair<size_t, size_t>> spans;
  for (const std::string& a : answers) {
    auto hits = find_all(body, a);
    if (hits.empty()) hits = find_all(lower(body), lower(a));
    for (auto [b, e] : hits) spans.emplace_back(off + b, off + e);
  }
  return spans;
}

}  // namespace

LayerCandidates parse_layer_candidates(const std::string& name) {
  if (name == "auto") return LayerCandidates::automatic;
  if (name == "all") return LayerCandidates::all;
  if (name == "global") return LayerCandidates::global;
  throw std::runtime_error("unknown layer candidates '" + name + "' (auto, all or global)");
}

std::vector<int> candidate_layers(LayerCandidates c, const ModelHparams& h) {
  std::vector<int> all(h.n_layers), global;
  std::iota(all.begin(), all.end(), 0);
  if (c == LayerCandidates::all || (c == LayerCandidates::automatic && !h.has_local_layers())) return all;
  for (int l : all)
    if (!h.is_local(l)) global.push_back(l);
  return global.empty() ? all : global;
}

int fallback_critical_layer(const ModelHparams& h) {
  const int middle = h.n_layers / 2;
  const std::vector<int> candidates = candidate_layers(LayerCandidates::automatic, h);
  int best = candidates.front();
  for (int l : candidates)
    if (std::abs(l - middle) < std::abs(best - middle)) best = l;
  return best;
}

std::string default_profile_path(const std::string& fp) { return cache_root() + "/profiles/" + fp + ".qcfuse.json"; }

nlohmann::json profile_to_json(const LayerProfile& p) {
  return {{"format", "chunkfuse.qcfuse.profile/1"},
          {"model_fingerprint", p.model_fingerprint},
          {"recall_at_10pct", p.recall},
          {"critical_layers", p.critical_layers},
          {"critical_set_recall", p.critical_set_recall},
          {"all_layers_recall", p.all_layers_recall},
          {"anchor_ratio", p.anchor_ratio},
          {"target", p.target},
          {"seconds", p.seconds},
          {"data", p.data}};
}

LayerProfile profile_from_json(const nlohmann::json& j) {
  try {
    if (j.at("format").get<std::string>() != "chunkfuse.qcfuse.profile/1")
      throw std::runtime_error("unknown profile format " + j.at("format").dump());
    LayerProfile p;
    p.model_fingerprint = j.at("model_fingerprint").get<std::string>();
    p.recall = j.at("recall_at_10pct").get<std::vector<double>>();
    p.critical_layers = j.at("critical_layers").get<std::vector<int>>();
    p.critical_set_recall = j.value("critical_set_recall", 0.0);
    p.all_layers_recall = j.value("all_layers_recall", 0.0);
    p.anchor_ratio = j.at("anchor_ratio").get<double>();
    p.target = j.value("target", "evidence");
    if (p.target != "evidence" && p.target != "prophet") throw std::runtime_error("unknown profile target " + p.target);
    p.seconds = j.value("seconds", 0.0);
    p.data = j.value("data", nlohmann::json::object());
    for (int l : p.critical_layers)
      if (l < 0 || static_cast<size_t>(l) >= p.recall.size())
        throw std::runtime_error("critical layer " + std::to_string(l) + " outside the profiled layers");
    return p;
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(std::string("malformed QCFuse profile: ") + e.what());
  }
}

void save_profile(const LayerProfile& p, const std::string& path) {
  const std::filesystem::path target(path);
  if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path());
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) throw std::runtime_error(tmp + ": cannot write");
    out << profile_to_json(p).dump(2) << "\n";
    if (!out.flush()) throw std::runtime_error(tmp + ": write failed");
  }
  std::filesystem::rename(tmp, target);
}

std::optional<LayerProfile> load_profile(const std::string& path) {
  if (!std::filesystem::exists(path)) return std::nullopt;
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + ": not valid JSON (" + e.what() + ")");
  }
  return profile_from_json(j);
}

void check_profile_model(const LayerProfile& p, const std::string& fp, const std::string& where) {
  if (p.model_fingerprint != fp)
    throw std::runtime_error(where + " is a profile of model " + p.model_fingerprint + ", not of this model (" + fp +
                             "); it is not used. Run chunkfuse profile-layers for this model");
}

std::optional<LayerProfile> bundled_profile(const std::string& fp, std::string* source, const std::string& target) {
  const std::string key = target.empty() ? fp : fp + "." + target;
  for (const BundledProfile* b = kBundledProfiles; b->fingerprint; ++b) {
    if (key != b->fingerprint) continue;
    LayerProfile p;
    try {
      p = profile_from_json(nlohmann::json::parse(b->json));
    } catch (const std::exception& e) {  // a bad file in data/ is a build defect; say which
      throw std::runtime_error(std::string(b->file) + ": " + e.what());
    }
    check_profile_model(p, fp, b->file);
    if (!target.empty() && p.target != target)
      throw std::runtime_error(std::string(b->file) + ": made with target " + p.target + ", not " + target);
    if (source) *source = b->file;
    return p;
  }
  return std::nullopt;
}

std::vector<CalibrationExample> read_nq_calibration(const std::string& path, size_t limit) {
  const std::vector<std::string> lines = read_lines(path);
  std::vector<CalibrationExample> chosen;
  for (size_t li = lines.size(); li-- > 0 && chosen.size() < limit;) {
    const auto j = nlohmann::json::parse(lines[li]);
    if (!j.contains("ctxs") || j["ctxs"].empty()) continue;
    Passage gold{j["ctxs"][0].value("title", ""), j["ctxs"][0].value("text", "")};
    std::vector<std::string> answers;
    for (const auto& a : j.value("answers", nlohmann::json::array()))
      if (a.is_string()) answers.push_back(a.get<std::string>());
    std::vector<std::pair<size_t, size_t>> spans = answer_spans(gold, answers);
    if (spans.empty()) continue;
    CalibrationExample ex;
    ex.dataset = "nq_open_oracle";
    ex.index = li;
    ex.question = j.value("question", "");
    ex.passages = {gold};
    ex.gold_spans = {spans};
    chosen.push_back(std::move(ex));
  }
  // Distractors: the gold passages of up to 9 other chosen examples; the gold passage's
  // slot moves with the example so position does not give it away.
  const size_t m = chosen.size();
  std::vector<Passage> golds;
  for (const auto& ex : chosen) golds.push_back(ex.passages[0]);
  for (size_t i = 0; i < m; ++i) {
    const size_t n_distract = std::min<size_t>(9, m - 1);
    std::vector<Passage> ps;
    std::vector<std::vector<std::pair<size_t, size_t>>> spans;
    for (size_t d = 1; d <= n_distract; ++d) {
      ps.push_back(golds[(i + d) % m]);
      spans.emplace_back();
    }
    const size_t at = i % (n_distract + 1);
    ps.insert(ps.begin() + static_cast<long>(at), golds[i]);
    spans.insert(spans.begin() + static_cast<long>(at), chosen[i].gold_spans[0]);
    chosen[i].passages = std::move(ps);
    chosen[i].gold_spans = std::move(spans);
  }
  return chosen;
}

std::vector<CalibrationExample> read_hotpot_calibration(const std::string& path, size_t limit) {
  const std::vector<std::string> lines = read_lines(path);
  std::vector<CalibrationExample> chosen;
  for (size_t li = lines.size(); li-- > 0 && chosen.size() < limit;) {
    const auto j = nlohmann::json::parse(lines[li]);
    CalibrationExample ex;
    ex.dataset = "hotpotqa";
    ex.index = li;
    ex.question = j.value("question", "");
    size_t n_gold = 0;
    for (const auto& c : j.at("context")) {
      Passage p{c.at(0).get<std::string>(), ""};
      std::vector<std::pair<size_t, size_t>> sent_spans;
      for (const auto& s : c.at(1)) {
        const size_t b = p.text.size();
        p.text += s.get<std::string>();
        sent_spans.emplace_back(b, p.text.size());
      }
      const size_t off = body_offset(p);
      std::vector<std::pair<size_t, size_t>> spans;
      for (const auto& f : j.at("supporting_facts")) {
        if (f.at(0).get<std::string>() != p.title) continue;
        const auto sid = f.at(1).get<size_t>();
        if (sid < sent_spans.size() && sent_spans[sid].second > sent_spans[sid].first)
          spans.emplace_back(off + sent_spans[sid].first, off + sent_spans[sid].second);
      }
      n_gold += spans.size();
      ex.passages.push_back(std::move(p));
      ex.gold_spans.push_back(std::move(spans));
    }
    if (n_gold == 0) continue;
    chosen.push_back(std::move(ex));
  }
  return chosen;
}

CalibrationExample answer_span_calibration(std::string dataset, size_t index, std::vector<Passage> passages,
                                           std::string question, const std::vector<std::string>& answers) {
  CalibrationExample ex;
  ex.dataset = std::move(dataset);
  ex.index = index;
  ex.question = std::move(question);
  for (const Passage& p : passages) ex.gold_spans.push_back(answer_spans(p, answers));
  ex.passages = std::move(passages);
  return ex;
}

bool gold_token_positions(const Tokenizer& tok, std::span<const TokenId> tokens, const std::string& text,
                          const std::vector<std::pair<size_t, size_t>>& spans, std::vector<size_t>& gold) {
  gold.clear();
  std::vector<size_t> begin(tokens.size() + 1, 0);
  std::string spelled;
  for (size_t t = 0; t < tokens.size(); ++t) {
    begin[t] = spelled.size();
    spelled += tok.token_to_piece(tokens[t], false);
  }
  begin[tokens.size()] = spelled.size();
  if (spelled != text) return false;
  for (size_t t = 0; t < tokens.size(); ++t)
    for (auto [b, e] : spans)
      if (begin[t] < e && begin[t + 1] > b) {
        gold.push_back(t);
        break;
      }
  return true;
}

namespace {

// One calibration example's probe, scored: each layer's recall of the target set, and what the
// critical set's recall (Eq. 20) needs once L* is known.
struct ScoredExample {
  std::string dataset;
  std::vector<double> recall;  // per layer
  double all = 0;              // of the scores summed over all layers
  std::vector<std::vector<double>> scores;  // per layer, per context token
  std::vector<size_t> target;               // the slots to find (gold evidence or ProphetKV's set)
  size_t k = 0, context_begin = 0;
  size_t context_tokens = 0;  // the prompt length it was calibrated on
};

// The fraction of `target` (sorted) among the top k of `score`.
double recall_at(const std::vector<double>& score, size_t context_begin, size_t k, const std::vector<size_t>& target) {
  const auto top = top_k_slots(score, context_begin, k);
  size_t hit = 0;
  for (size_t g : target) hit += std::binary_search(top.begin(), top.end(), g) ? 1 : 0;
  return static_cast<double>(hit) / static_cast<double>(target.size());
}

// The request slots of the example's gold evidence tokens; false when a span cannot be found.
bool gold_slots(const Model& m, const RagRequest& req, const CalibrationExample& ex, const RagPromptOptions& prompt_opt,
                std::vector<size_t>& gold) {
  bool ok = ex.gold_spans.size() == ex.passages.size();
  size_t slot = req.system.size();
  for (size_t i = 0; ok && i < req.chunks.size(); ++i) {
    std::vector<size_t> g;
    ok = gold_token_positions(m.tokenizer(), req.chunks[i], passage_text(ex.passages[i], prompt_opt), ex.gold_spans[i], g);
    for (size_t t : g) gold.push_back(slot + t);
    slot += req.chunks[i].size();
  }
  return ok;
}

// Offline work of the profile, reported with it.
struct ProfileCosts {
  double pic_ms = 0, anchors_ms = 0;
  size_t anchors_chunks = 0;
};

// S (exact, computed once per distinct S), then every chunk's PIC cache with its anchors,
// stitched; `view` gets the anchors at their request slots.
KvCache stitch_with_anchors(Forward& fwd, ChunkStore& store, const RagRequest& req, const ProfileOptions& opt,
                            std::map<std::vector<TokenId>, KvCache>& prefixes, ProbeView& view, ProfileCosts& costs) {
  const Model& m = fwd.model();
  const ModelHparams& h = m.hparams();
  const int L = h.n_layers;
  auto pit = prefixes.find(req.system);
  if (pit == prefixes.end()) {
    KvCache kv(h, req.system.size());
    std::vector<int32_t> pos(req.system.size());
    std::iota(pos.begin(), pos.end(), 0);
    fwd.run(kv, {req.system, pos, {}, {}});
    pit = prefixes.emplace(req.system, std::move(kv)).first;
  }
  KvCache stitched(h, req.flatten().size());
  stitched.append_from(pit->second, 0, pit->second.size(), 0);
  view.anchors.resize(opt.anchor_rule.per_layer ? static_cast<size_t>(L) : 1);
  for (const auto& toks : req.chunks) {
    ChunkKey key(m.fingerprint(), toks);
    const auto tc = SteadyClock::now();
    auto c = store.get_or_compute(key, [&] { return compute_chunk_cache(fwd, key); });
    costs.pic_ms += ms_since(tc);
    if (opt.anchor_ratio > 0 && !stored_anchors(*c, opt.anchor_ratio, opt.anchor_rule, 0)) {
      const auto ta = SteadyClock::now();
      ChunkCache prepared = *c;
      prepare_anchors(fwd, prepared, opt.anchor_rule);
      costs.anchors_ms += ms_since(ta);
      ++costs.anchors_chunks;
      c = store.put(std::move(prepared));
    }
    const size_t begin = stitched.size();
    stitched.append_from(c->kv, 0, c->kv.size(), static_cast<int32_t>(begin) - c->kv.position(0));
    const auto sets = chunk_anchor_sets(fwd, *c, opt.anchor_ratio, opt.anchor_rule, L, nullptr);
    for (size_t l = 0; l < view.anchors.size(); ++l)
      for (uint32_t a : sets[l]) view.anchors[l].push_back(begin + a);
  }
  return stitched;
}

// Probes one example at every layer and scores each layer's recall of the target; nullopt when
// the example cannot be used (no budget, too long, or no gold evidence under the evidence target).
std::optional<ScoredExample> score_example(Forward& fwd, ChunkStore& store, const CalibrationExample& ex,
                                           const ProfileOptions& opt, std::map<std::vector<TokenId>, KvCache>& prefixes,
                                           ProfileCosts& costs, size_t& context_tokens) {
  const Model& m = fwd.model();
  const int L = m.hparams().n_layers;
  std::vector<int> all_layers(L);
  std::iota(all_layers.begin(), all_layers.end(), 0);
  const RagPromptOptions prompt_opt;
  const RagRequest req = build_rag_request(m, ex.passages, ex.question, prompt_opt);
  std::vector<size_t> gold;
  const bool ok = gold_slots(m, req, ex, prompt_opt, gold);
  const size_t n = context_tokens = req.context_tokens();
  const size_t k = recompute_budget(kProfileBudget, n);
  const bool by_evidence = opt.target == ProfileTarget::evidence;
  if ((by_evidence && (!ok || gold.empty())) || k == 0 ||
      static_cast<int>(req.flatten().size()) > m.hparams().context_length)
    return std::nullopt;

  ProbeView view;
  KvCache stitched = stitch_with_anchors(fwd, store, req, opt, prefixes, view, costs);
  const size_t cb = req.system.size(), ce = cb + n;
  const auto [rb, re] = probe_row_range(req, opt.probe_rows);
  ProbeResult pr = query_probe(fwd, stitched, cb, ce, view, req.suffix, rb, re, all_layers);
  if (!by_evidence) {  // the target: ProphetKV's top-10% set (full view, all layers, same rows)
    ProbeView full;
    full.full = true;
    gold = top_k_slots(sum_layers(query_probe(fwd, stitched, cb, ce, full, req.suffix, rb, re, all_layers)), cb, k);
  }
  std::sort(gold.begin(), gold.end());

  ScoredExample s{ex.dataset, std::vector<double>(L), 0, {}, {}, k, cb, n};
  std::vector<double> sum(n, 0.0);
  for (int l = 0; l < L; ++l) {
    s.recall[l] = recall_at(pr.scores[l], cb, k, gold);
    for (size_t i = 0; i < n; ++i) sum[i] += pr.scores[l][i];
  }
  s.all = recall_at(sum, cb, k, gold);
  s.scores = std::move(pr.scores);
  s.target = std::move(gold);
  return s;
}

// Min, median and max context length of the rows `idx` (all rows when empty): a profile ranks
// layers for prompts of about these lengths (measured on the 1.5B: layers fitted on ~1.4K-token
// prompts lose to ones fitted on ~6K-token prompts there, docs/benchmarks-history.md).
nlohmann::json context_lengths(const std::vector<ScoredExample>& rows, const std::vector<size_t>& idx) {
  std::vector<size_t> n;
  if (idx.empty())
    for (const ScoredExample& r : rows) n.push_back(r.context_tokens);
  else
    for (size_t i : idx) n.push_back(rows[i].context_tokens);
  std::sort(n.begin(), n.end());
  return {{"min", n.front()}, {"median", n[n.size() / 2]}, {"max", n.back()}};
}

// Per dataset means of each layer's recall, then the mean over datasets, into p.recall and
// p.all_layers_recall; per_dataset gets each dataset's figures.
void mean_layer_recall(const std::vector<ScoredExample>& rows, const std::vector<CalibrationExample>& examples, int L,
                       LayerProfile& p, nlohmann::json& per_dataset) {
  std::map<std::string, std::vector<size_t>> by_dataset;
  for (size_t i = 0; i < rows.size(); ++i) by_dataset[rows[i].dataset].push_back(i);
  p.recall.assign(L, 0.0);
  for (const auto& [name, idx] : by_dataset) {
    std::vector<double> r(L, 0.0);
    double all = 0;
    std::vector<size_t> lines;
    for (size_t i : idx) {
      for (int l = 0; l < L; ++l) r[l] += rows[i].recall[l] / static_cast<double>(idx.size());
      all += rows[i].all / static_cast<double>(idx.size());
    }
    for (const auto& ex : examples)
      if (ex.dataset == name) lines.push_back(ex.index);
    for (int l = 0; l < L; ++l) p.recall[l] += r[l] / static_cast<double>(by_dataset.size());
    p.all_layers_recall += all / static_cast<double>(by_dataset.size());
    per_dataset[name] = {{"examples", idx.size()},   {"lines", lines},
                         {"recall_at_10pct", r},     {"all_layers_recall", all},
                         {"context_tokens", context_lengths(rows, idx)}};
  }
}

// Recall of the summed critical set (Eq. 20), averaged the same way, into
// p.critical_set_recall and per_dataset.
void mean_critical_set_recall(const std::vector<ScoredExample>& rows, LayerProfile& p, nlohmann::json& per_dataset) {
  std::map<std::string, std::pair<double, size_t>> set_recall;
  for (const ScoredExample& s : rows) {
    const size_t n = s.scores[0].size();
    std::vector<double> sum(n, 0.0);
    for (int l : p.critical_layers)
      for (size_t t = 0; t < n; ++t) sum[t] += s.scores[l][t];
    auto& [acc, cnt] = set_recall[s.dataset];
    acc += recall_at(sum, s.context_begin, s.k, s.target);
    ++cnt;
  }
  for (const auto& [name, rc] : set_recall) {
    per_dataset[name]["critical_set_recall"] = rc.first / static_cast<double>(rc.second);
    p.critical_set_recall += rc.first / static_cast<double>(rc.second) / static_cast<double>(set_recall.size());
  }
}

}  // namespace

LayerProfile profile_critical_layers(Forward& fwd, ChunkStore& store, const std::vector<CalibrationExample>& examples,
                                     const ProfileOptions& opt) {
  const auto t0 = SteadyClock::now();
  const Model& m = fwd.model();
  const ModelHparams& h = m.hparams();
  const int L = h.n_layers;

  std::vector<ScoredExample> rows;
  size_t skipped = 0, done = 0;
  ProfileCosts costs;
  std::map<std::vector<TokenId>, KvCache> prefixes;
  for (const CalibrationExample& ex : examples) {
    size_t n = 0;
    if (auto s = score_example(fwd, store, ex, opt, prefixes, costs, n))
      rows.push_back(std::move(*s));
    else
      ++skipped;
    ++done;
    if (opt.progress) opt.progress(done, examples.size(), ex, n);
  }
  if (rows.empty()) throw std::runtime_error("QCFuse profiling: no usable calibration example");

  LayerProfile p;
  p.model_fingerprint = m.fingerprint_hex();
  p.anchor_ratio = opt.anchor_ratio;
  p.target = opt.target == ProfileTarget::evidence ? "evidence" : "prophet";
  nlohmann::json per_dataset = nlohmann::json::object();
  mean_layer_recall(rows, examples, L, p, per_dataset);
  // Every layer's recall is kept (and printed); L* is the top-k of the candidates.
  std::vector<int> order = candidate_layers(opt.candidates, h);
  const std::vector<int> candidates = order;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p.recall[a] > p.recall[b]; });
  order.resize(std::min(static_cast<size_t>(opt.critical_layers), order.size()));
  p.critical_layers = order;
  mean_critical_set_recall(rows, p, per_dataset);

  p.seconds = ms_since(t0) / 1000;
  p.data = {{"datasets", per_dataset},
            {"skipped", skipped},
            {"context_tokens", context_lengths(rows, {})},
            {"budget", kProfileBudget},
            {"softmax_denominator", "S + context + U keys (causal), as the artifact's kernel"},
            {"probe_rows", probe_rows_name(opt.probe_rows)},
            {"candidate_layers", candidates},
            {"anchor_rule", opt.anchor_rule.name() + (opt.anchor_rule.per_layer ? "_per_layer" : "_shared")},
            {"pic_ms", costs.pic_ms},
            {"anchor_ms", costs.anchors_ms},
            {"anchor_chunks", costs.anchors_chunks}};
  return p;
}

}  // namespace cf::qcfuse
