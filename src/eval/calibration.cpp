#include "eval/calibration.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <stdexcept>
#include <tuple>

#include "base/bounded_json.h"
#include "base/progress.h"
#include "eval/bench_request.h"
#include "eval/deviation.h"
#include "eval/metrics.h"
#include "eval/runner.h"
#include "fusion/executor.h"
#include "fusion/methods.h"
#include "kv/chunk_store.h"
#include "model/model.h"

namespace cf::eval {
namespace {

using nlohmann::json;

// A signal recorded for issue 26 (is it worth adding to the predictor?): how far a step's
// recomputation moved the request's K/V from the cached chunks', free once a reuse step has
// run. Relative L2 per layer (eval/deviation.h) against the reuse step's cache, whose context
// slots hold the stitched chunk caches as every step starts from them: over the context
// (only the recomputed rows differ, so the norm counts them against all of it) and over the
// question's rows (computed fresh in both, seeing the old or the recomputed context).
json recompute_change(const KvCache& stitched, const KvCache& after, const RagRequest& req) {
  const size_t begin = req.system.size(), end = begin + req.context_tokens(), u_end = end + req.suffix.size();
  json out = json::object();
  for (const auto& [part, lo, hi] : {std::tuple{"context", begin, end}, std::tuple{"question", end, u_end}}) {
    json k = json::array(), v = json::array();
    for (const LayerDeviation& d : kv_deviation(stitched, after, lo, hi)) {
      k.push_back(d.k_rel);
      v.push_back(d.v_rel);
    }
    out[part] = {{"k", std::move(k)}, {"v", std::move(v)}};
  }
  return out;
}

// Another signal for issue 26: what the selector's own scores say (ProphetKV's and QCFuse's are
// the probe's attention from the question to each context token): their sum over the context
// and the share of it the recomputed tokens hold.
json score_mass(const std::vector<double>& scores, const std::vector<size_t>& recomputed, size_t context_begin) {
  double total = 0, chosen = 0;
  for (double v : scores) total += v;
  for (size_t slot : recomputed)
    if (slot >= context_begin && slot - context_begin < scores.size()) chosen += scores[slot - context_begin];
  return {{"sum", total}, {"selected_share", total > 0 ? chosen / total : 0.0}};
}

// The ids already in a records file; refuses a file whose records were made another way: other
// RAG words, chunk caches or chunking (a request of the 20 x 512 setting has the id of the same
// example cut into passages, so resuming across settings would skip the wrong examples). Records
// written before a field was recorded are not checked on it.
std::set<std::string> recorded_ids(const std::string& path, const json& setting) {
  std::set<std::string> ids;
  if (!std::filesystem::exists(path)) return ids;
  for (const auto& r : read_records(path)) {
    for (const auto& [key, want] : setting.items())
      if (r.contains(key) && r[key] != want)
        throw std::invalid_argument(path + " holds records made " +
                                    (key == "prompt_layout" ? std::string("with other RAG prompt words") : "another way") + " (" +
                                    key + " " + r[key].dump() + ", this run " + want.dump() + "): use another --records file");
    ids.insert(r.at("id").get<std::string>());
  }
  return ids;
}

// One request: the dataset example and how it was cut and cached (the same example in the
// 20 x 512 setting is another request than cut into passages).
std::string request_key(const json& r) {
  return r.at("id").get<std::string>() + "|" + r.value("chunk_context", r.value("chunk_variant", "alone")) + "|" +
         std::to_string(r.value("chunks", size_t{0})) + "|" + std::to_string(r.value("context_tokens", size_t{0}));
}

// Wilson score interval (95%) of a binomial share.
std::pair<double, double> wilson(double successes, double n) {
  if (n <= 0) return {0, 1};
  const double z = 1.959964, p = successes / n, z2n = z * z / n;
  const double centre = (p + z2n / 2) / (1 + z2n), half = z * std::sqrt(p * (1 - p) / n + z2n / (4 * n)) / (1 + z2n);
  return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

autoq::FirstTokenSignals signals_of(const json& step) {
  autoq::FirstTokenSignals s;
  s.margin = step.at("margin").get<double>();
  s.entropy = step.at("entropy").get<double>();
  s.top1 = step.at("top1").get<int32_t>();
  return s;
}

// Whether a record's step ran `step` (the same selector at the same ratio), for joining and
// selecting steps across runs of different ladders.
bool is_step(const json& recorded, const LadderStep& step) {
  return recorded.at("method") == step.method && std::abs(recorded.at("ratio").get<double>() - step.ratio) < 1e-9;
}

// A record as the planner and the replay see it: each step's prediction under `cal`.
autoq::PlanCase plan_case(const json& r, const autoq::AutoCalibration& cal) {
  autoq::PlanCase c;
  for (size_t k = 0; k < cal.steps.size(); ++k) {
    const json& st = r["steps"][k];
    c.predicted.push_back(cal.predict(k, signals_of(st)));
    c.identical.push_back(st.at("identical").get<bool>());
    c.step_ms.push_back(st.at("ttft_ms").get<double>());
  }
  c.full_ms = r["full"].at("ttft_ms").get<double>();
  return c;
}

// What no predictor can beat on these records (share 1 by construction): "ladder" tries the
// steps in order and stops at the first whose answer is identical (a perfect accept/reject at
// every step, the failed steps still paid); "clairvoyant" pays only the cheapest identical
// step; "single_step" is the ladder of step k alone. All fall back to full prefill. If even
// these are not well below full prefill's TTFT, no signal can make the auto policy fast on
// this model and ladder.
json perfect_predictor_bounds(const std::vector<json>& records) {
  std::vector<double> ladder, clairvoyant;
  std::vector<std::vector<double>> single(records.front()["steps"].size());
  for (const auto& r : records) {
    const double full = r["full"]["ttft_ms"].get<double>();
    for (size_t k = 0; k < single.size(); ++k) {
      const json& st = r["steps"][k];
      single[k].push_back(st["ttft_ms"].get<double>() + (st["identical"].get<bool>() ? 0 : full));
    }
    double spent = 0, cheapest = full;
    bool found = false;
    for (const auto& st : r["steps"]) {
      const double t = st["ttft_ms"].get<double>();
      if (!found) spent += t;
      if (st["identical"].get<bool>()) {
        found = true;
        cheapest = std::min(cheapest, t);
      }
    }
    ladder.push_back(found ? spent : spent + full);
    clairvoyant.push_back(cheapest);
  }
  auto row = [](const std::vector<double>& t) { return json{{"mean_ttft_ms", mean(t)}, {"p90_ttft_ms", percentile(t, 0.9)}}; };
  json out = {{"ladder", row(ladder)}, {"clairvoyant", row(clairvoyant)}, {"single_step", json::array()}};
  for (size_t k = 0; k < single.size(); ++k) {
    json one = row(single[k]);
    one["method"] = records.front()["steps"][k]["method"];
    one["ratio"] = records.front()["steps"][k]["ratio"];
    out["single_step"].push_back(one);
  }
  return out;
}

}  // namespace

std::vector<LadderStep> parse_ladder(const std::string& text) {
  std::vector<LadderStep> steps;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    std::string item = text.substr(at, comma - at);
    at = comma + 1;
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) continue;
    const size_t colon = item.rfind(':');
    if (colon == std::string::npos) throw std::invalid_argument("ladder step '" + item + "': expected <method>:<ratio>");
    LadderStep s{item.substr(0, colon), 0};
    if (const MethodEntry* m = find_method(s.method); !m || m->kind != MethodKind::selector)
      throw std::invalid_argument("ladder step '" + item + "': unknown method '" + s.method + "' (full prefill is always the last step)");
    try {
      size_t used = 0;
      s.ratio = std::stod(item.substr(colon + 1), &used);
      if (used != item.size() - colon - 1) throw std::invalid_argument("trailing text");
    } catch (const std::exception&) {
      throw std::invalid_argument("ladder step '" + item + "': the ratio is not a number");
    }
    if (!(s.ratio >= 0 && s.ratio <= 1)) throw std::invalid_argument("ladder step '" + item + "': the ratio must be in [0, 1]");
    steps.push_back(s);
  }
  if (steps.empty()) throw std::invalid_argument("the ladder has no steps");
  if (steps.size() > autoq::kMaxLadderSteps)  // the planner tries every subset: refuse before hours of recording
    throw std::invalid_argument("the ladder has " + std::to_string(steps.size()) + " steps; at most " +
                                std::to_string(autoq::kMaxLadderSteps) + " can be planned");
  return steps;
}

std::vector<json> read_records(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot read the records file");
  std::vector<json> out;
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    try {
      out.push_back(parse_json_bounded(line));
    } catch (const std::exception& e) {
      throw std::runtime_error(path + ":" + std::to_string(n) + ": not a record: " + e.what());
    }
  }
  return out;
}

size_t record_examples(const Model& model, Forward& fwd, const Dataset& dataset, const CalibrationRunOptions& o) {
  const size_t end = o.limit ? std::min(dataset.examples.size(), o.first + o.limit) : dataset.examples.size();
  if (o.first >= end) throw std::invalid_argument("no examples in that range of " + dataset.name);
  const std::string layout = prompt_layout_id(o.prompt);
  const json setting = {{"prompt_layout", layout},
                        {"chunk_context", chunk_context_name(o.chunk_context)},
                        {"chunk_tokens", o.chunk_tokens},
                        {"chunks_per_request", o.chunks_per_request}};
  const std::set<std::string> done = recorded_ids(o.records_path, setting);
  ChunkStoreOptions so;  // memory only: the chunks of a calibration run are not worth keeping
  so.memory_budget_bytes = size_t{1} << 30;
  so.model = StoreModel{model.fingerprint(), model.hparams()};
  ChunkStore store(so);
  FusionExecutor executor(fwd, store);
  std::ofstream out(o.records_path, std::ios::app);
  if (!out) throw std::runtime_error(o.records_path + ": cannot write the records file");
  ProgressBar bar(end - o.first, "examples", o.progress);
  size_t ran = 0;
  for (size_t e = o.first; e < end; ++e) {
    const QaExample& ex = dataset.examples[e];
    const std::string id = dataset.name + ":" + ex.id;
    bar.update(e - o.first, id);
    if (done.count(id)) continue;
    const RagRequest req = o.chunks_per_request
                               ? build_example_request_filled(model, dataset, e, o.prompt, o.chunk_tokens, o.chunks_per_request)
                               : build_example_request(model, ex, o.prompt, o.chunk_tokens);
    const std::vector<TokenId> prompt = req.flatten();
    FusionOptions full_opt;
    full_opt.method = full_method_name();
    full_opt.chunk_context = o.chunk_context;
    FusionResult full = executor.prefill(req, full_opt);
    const std::vector<float> full_logits = full.logits;
    const double full_ttft = full.timings.ttft_ms;
    const std::string full_answer = decode_answer(fwd, full, prompt, o.max_tokens).answer;
    json steps = json::array();
    std::vector<float> prev_logits;
    std::optional<KvCache> stitched;  // the reuse step's cache: every chunk's cached K/V, unchanged
    for (const LadderStep& s : o.ladder) {
      FusionOptions opt;
      opt.method = s.method;
      opt.ratio = s.ratio;
      opt.chunk_context = o.chunk_context;
      FusionResult r = executor.prefill(req, opt);
      const autoq::FirstTokenSignals sig = autoq::first_token_signals(r.logits);
      json row = {{"method", s.method},
                  {"ratio", s.ratio},
                  {"ttft_ms", r.timings.ttft_ms},
                  {"margin", sig.margin},
                  {"entropy", sig.entropy},
                  {"top1", sig.top1},
                  {"first_token_equal", first_token_agrees(full_logits, r.logits)},
                  {"kl_to_full", kl_divergence_from_logits(full_logits, r.logits)},
                  {"kl_to_prev", prev_logits.empty() ? 0.0 : kl_divergence_from_logits(prev_logits, r.logits)}};
      prev_logits = r.logits;
      if (s.ratio == 0 && !selector_entry(s.method).takes_ratio() && !stitched) stitched = r.cache;
      if (stitched && s.ratio > 0) row["kv_change"] = recompute_change(*stitched, r.cache, req);
      if (!r.token_scores.empty()) row["scores"] = score_mass(r.token_scores, r.recomputed, req.system.size());
      const DecodedAnswer dec = decode_answer(fwd, r, prompt, o.max_tokens);
      row["answer"] = dec.answer;
      row["identical"] = dec.answer == full_answer;
      row["answer_tokens"] = dec.tokens;  // with the rate: what a signal that decodes the answer would cost
      row["decode_tok_s"] = dec.decode_tok_s;
      steps.push_back(std::move(row));
    }
    const json record = {{"id", id},
                         {"dataset", dataset.name},
                         {"index", e},
                         {"fingerprint", model.fingerprint_hex()},
                         {"prompt_layout", layout},
                         {"chunk_context", chunk_context_name(o.chunk_context)},
                         {"chunk_tokens", o.chunk_tokens},
                         {"chunks_per_request", o.chunks_per_request},
                         {"context_tokens", req.context_tokens()},
                         {"question_tokens", req.suffix.size()},
                         {"chunks", req.chunks.size()},
                         {"full", {{"ttft_ms", full_ttft}, {"answer", full_answer}, {"gold_f1", qa_f1(full_answer, ex.answers)}}},
                         {"steps", steps}};
    out << results_line(record) << "\n";  // an answer cut mid-character is not valid UTF-8
    out.flush();
    ++ran;
  }
  bar.update(end - o.first);
  return ran;
}

std::vector<json> join_records(const std::vector<std::string>& paths) {
  std::vector<json> out;
  std::map<std::string, size_t> at;  // request_key -> index in out
  for (const auto& path : paths)
    for (auto& r : read_records(path)) {
      const std::string id = r.at("id").get<std::string>();
      const std::string key = request_key(r);
      const auto seen = at.find(key);
      if (seen == at.end()) {
        at.emplace(key, out.size());
        out.push_back(std::move(r));
        continue;
      }
      json& into = out[seen->second];
      for (const char* key : {"fingerprint", "prompt_layout"})
        if (r.value(key, "") != into.value(key, ""))
          throw std::invalid_argument(path + ": record " + id + " differs in " + key + " from the same request's record before it");
      if (r["full"].at("answer") != into["full"].at("answer"))
        throw std::invalid_argument(path + ": record " + id + " has another full prefill answer than the same request's record before it");
      for (auto& st : r.at("steps")) {
        const LadderStep step{st.at("method").get<std::string>(), st.at("ratio").get<double>()};
        const bool known = std::any_of(into["steps"].begin(), into["steps"].end(), [&](const json& have) { return is_step(have, step); });
        if (!known) into["steps"].push_back(std::move(st));
      }
    }
  return out;
}

std::vector<json> select_steps(const std::vector<json>& records, const std::vector<LadderStep>& ladder) {
  std::vector<json> out;
  out.reserve(records.size());
  for (const auto& r : records) {
    json steps = json::array();
    for (const LadderStep& want : ladder) {
      const json* found = nullptr;
      for (const auto& st : r.at("steps"))
        if (is_step(st, want)) found = &st;
      if (!found)
        throw std::invalid_argument("record " + r.at("id").get<std::string>() + " has no step " + want.method + ":" +
                                    json(want.ratio).dump() + " (it ran another ladder)");
      steps.push_back(*found);
    }
    json copy = r;
    copy["steps"] = std::move(steps);
    out.push_back(std::move(copy));
  }
  return out;
}

autoq::AutoCalibration fit_calibration(const std::vector<json>& records, double l2, const std::vector<size_t>& size_bounds) {
  if (records.empty()) throw std::invalid_argument("no records to calibrate on");
  const json& first = records.front();
  autoq::AutoCalibration cal;
  cal.fingerprint = first.at("fingerprint").get<std::string>();
  const size_t n_steps = first.at("steps").size();
  for (const auto& r : records) {
    if (r.at("fingerprint") != first.at("fingerprint"))
      throw std::invalid_argument("records of two models (" + cal.fingerprint + ", " + r.at("fingerprint").get<std::string>() + ")");
    if (r.at("steps").size() != n_steps) throw std::invalid_argument("records of two ladders (" + r.at("id").get<std::string>() + ")");
    if (r.value("prompt_layout", "") != first.value("prompt_layout", ""))
      throw std::invalid_argument("records of two RAG prompt layouts (" + r.at("id").get<std::string>() + ")");
    for (size_t k = 0; k < n_steps; ++k)
      if (r["steps"][k].at("method") != first["steps"][k].at("method") || r["steps"][k].at("ratio") != first["steps"][k].at("ratio"))
        throw std::invalid_argument("records of two ladders (" + r.at("id").get<std::string>() + ")");
  }
  json fit = json::array();
  for (size_t k = 0; k < n_steps; ++k) {
    std::vector<std::vector<double>> x;
    std::vector<int> y;
    for (const auto& r : records) {
      x.push_back(autoq::predictor_features(signals_of(r["steps"][k])));
      y.push_back(r["steps"][k].at("identical").get<bool>() ? 1 : 0);
    }
    autoq::AutoStep st;
    st.method = first["steps"][k]["method"].get<std::string>();
    st.ratio = first["steps"][k]["ratio"].get<double>();
    st.weights = autoq::fit_logistic(x, y, l2);
    double log_loss = 0;
    for (size_t n = 0; n < x.size(); ++n) {
      const double p = std::clamp(autoq::logistic(st.weights, x[n]), 1e-9, 1 - 1e-9);
      log_loss -= y[n] ? std::log(p) : std::log(1 - p);
    }
    fit.push_back({{"method", st.method}, {"ratio", st.ratio}, {"identical_share", mean(std::vector<double>(y.begin(), y.end()))},
                   {"log_loss", log_loss / static_cast<double>(x.size())}});
    cal.steps.push_back(std::move(st));
  }
  std::vector<size_t> lows = {0};
  for (size_t b : size_bounds) {
    if (b <= lows.back()) throw std::invalid_argument("size class bounds must be ascending context-token counts above 0");
    lows.push_back(b);
  }
  for (size_t c = 0; c < lows.size(); ++c) {
    const size_t lo = lows[c], hi = c + 1 < lows.size() ? lows[c + 1] : SIZE_MAX;
    std::vector<autoq::PlanCase> cases;
    for (const auto& r : records) {
      const size_t tokens = r.at("context_tokens").get<size_t>();
      if (tokens >= lo && tokens < hi) cases.push_back(plan_case(r, cal));
    }
    if (cases.empty() || (lows.size() > 1 && cases.size() < kMinClassExamples))
      throw std::invalid_argument("the size class of " + std::to_string(lo) + (hi == SIZE_MAX ? "+" : "-" + std::to_string(hi - 1)) +
                                  " context tokens has " + std::to_string(cases.size()) + " records; at least " +
                                  std::to_string(kMinClassExamples) + " are needed to plan it");
    cal.size_classes.push_back({lo, cases.size(), autoq::plan_policies(cases)});
  }
  std::set<std::string> datasets;
  for (const auto& r : records) datasets.insert(r.at("dataset").get<std::string>());
  size_t lowest = SIZE_MAX, highest = 0;
  for (const auto& r : records) {
    lowest = std::min(lowest, r.value("index", size_t{0}));
    highest = std::max(highest, r.value("index", size_t{0}));
  }
  cal.provenance = {{"examples", records.size()}, {"datasets", datasets}, {"indices", {lowest, highest}}, {"l2", l2}, {"fit", fit},
                    {"prompt_layout", first.value("prompt_layout", "")},
                    // records of before the renaming (issue 25 item 4) say chunk_variant
                    {"chunk_context", first.value("chunk_context", first.value("chunk_variant", "alone"))}};
  return cal;
}

namespace {

// A replay is measured against the calibration's model and prompt words only: a replay on
// prompts of other words measures another policy (their first tokens differ).
void check_replayable(const json& r, const autoq::AutoCalibration& cal) {
  const std::string layout = cal.provenance.value("prompt_layout", "");
  if (r.at("fingerprint").get<std::string>() != cal.fingerprint)
    throw std::invalid_argument("record " + r.at("id").get<std::string>() + " is of model " +
                                r.at("fingerprint").get<std::string>() + ", the calibration of " + cal.fingerprint);
  if (!layout.empty() && r.value("prompt_layout", layout) != layout)
    throw std::invalid_argument("record " + r.at("id").get<std::string>() + " was made with other RAG prompt words (layout " +
                                r["prompt_layout"].get<std::string>() + ") than the calibration's (" + layout + ")");
}

std::vector<LadderStep> ladder_of(const autoq::AutoCalibration& cal) {
  std::vector<LadderStep> ladder;
  for (const auto& s : cal.steps) ladder.push_back({s.method, s.ratio});
  return ladder;
}

// What a calibration plans for target q, per size class (for the report).
json plans_for(const autoq::AutoCalibration& cal, double q) {
  json plans = json::array();
  for (const auto& k : cal.size_classes) {
    const autoq::AutoPolicy& policy = cal.policy_for(q, k.min_context_tokens);
    json steps_run = json::array();
    for (size_t s : policy.steps) steps_run.push_back(cal.steps[s].method + ":" + std::to_string(cal.steps[s].ratio));
    plans.push_back({{"min_context_tokens", k.min_context_tokens}, {"steps", steps_run}, {"threshold", policy.threshold},
                     {"calibration_share", policy.observed_share}, {"calibration_ttft_share", policy.ttft_share}});
  }
  return plans;
}

// The policy replayed on `records` (their steps already the calibrations' ladder), record i
// with calibrations[fold_of[i]]: one calibration for all (evaluate_policy) or each fold's own
// (cross_validate); every calibration has the same ladder. The report's shares, TTFTs and
// reliability bins pool all records; the plans are per calibration.
json replay_report(const std::vector<json>& records, const std::vector<autoq::AutoCalibration>& calibrations,
                   const std::vector<size_t>& fold_of, const std::vector<double>& targets) {
  const std::vector<autoq::AutoStep>& ladder = calibrations.front().steps;
  auto cal_of = [&](size_t i) -> const autoq::AutoCalibration& { return calibrations[fold_of[i]]; };
  const double n = static_cast<double>(records.size());
  // Fixed policies: each step alone, and full prefill.
  json fixed = json::array();
  std::vector<double> full_ttft;
  for (const auto& r : records) full_ttft.push_back(r["full"]["ttft_ms"].get<double>());
  for (size_t k = 0; k < ladder.size(); ++k) {
    std::vector<double> ttft;
    double same = 0;
    for (const auto& r : records) {
      ttft.push_back(r["steps"][k]["ttft_ms"].get<double>());
      same += r["steps"][k]["identical"].get<bool>() ? 1 : 0;
    }
    const auto ci = wilson(same, n);
    fixed.push_back({{"method", ladder[k].method}, {"ratio", ladder[k].ratio}, {"share", same / n},
                     {"share_low", ci.first}, {"share_high", ci.second}, {"mean_ttft_ms", mean(ttft)},
                     {"p90_ttft_ms", percentile(ttft, 0.9)}});
  }
  fixed.push_back({{"method", "full"}, {"ratio", 1.0}, {"share", 1.0}, {"share_low", wilson(n, n).first}, {"share_high", 1.0},
                   {"mean_ttft_ms", mean(full_ttft)}, {"p90_ttft_ms", percentile(full_ttft, 0.9)}});
  json by_target = json::array();
  for (double q : targets) {
    autoq::check_quality(q);
    std::vector<double> ttft, wasted, saved;  // saved: full prefill's TTFT less the answering step's
    double same = 0;
    json chosen = json::object();
    auto count = [&chosen](const std::string& key) { chosen[key] = chosen.value(key, 0) + 1; };
    for (size_t i = 0; i < records.size(); ++i) {
      const json& r = records[i];
      const autoq::AutoCalibration& cal = cal_of(i);
      const autoq::PlanOutcome o = autoq::walk(cal.policy_for(q, r.at("context_tokens").get<size_t>()), plan_case(r, cal));
      if (o.answered < 0) {
        same += 1;
        count("full");
      } else {
        const json& st = r["steps"][o.answered];
        same += st["identical"].get<bool>() ? 1 : 0;
        count(ladder[o.answered].method + ":" + std::to_string(ladder[o.answered].ratio));
        saved.push_back(r["full"]["ttft_ms"].get<double>() - st["ttft_ms"].get<double>());
      }
      ttft.push_back(o.spent_ms);
      wasted.push_back(o.rejected_ms);
    }
    const auto ci = wilson(same, n);
    const double share = same / n, auto_mean = mean(ttft);
    // The cheapest fixed policy whose observed share reaches the auto policy's.
    json cheapest;
    for (const auto& f : fixed)
      if (f["share"].get<double>() >= share && (cheapest.is_null() || f["mean_ttft_ms"].get<double>() < cheapest["mean_ttft_ms"].get<double>()))
        cheapest = f;
    // Per request; null where no step answered (nothing saved to set the decision against).
    const double saved_ms = std::accumulate(saved.begin(), saved.end(), 0.0) / n;
    json row = {{"target", q},
                {"share", share},
                {"share_low", ci.first},
                {"share_high", ci.second},
                {"meets_target", share >= q},
                {"interval_reaches_target", ci.second >= q},  // the interval not below the target
                {"mean_ttft_ms", auto_mean},
                {"p90_ttft_ms", percentile(ttft, 0.9)},
                {"decision_ms", mean(wasted)},
                {"saved_ms", saved_ms},
                {"decision_share_of_saved", saved_ms > 0 ? json(mean(wasted) / saved_ms) : json(nullptr)},
                {"chosen", chosen},
                {"cheapest_fixed", cheapest},
                {"speedup_vs_cheapest_fixed", auto_mean > 0 ? cheapest["mean_ttft_ms"].get<double>() / auto_mean : 0.0}};
    if (calibrations.size() == 1) {
      const json plans = plans_for(calibrations.front(), q);
      row["policy"] = plans.front();  // the class of the shortest requests
      row["policies_by_size"] = plans;
    } else {
      row["fold_policies"] = json::array();  // per fold: its calibration's plans per size class
      for (const auto& cal : calibrations) row["fold_policies"].push_back(plans_for(cal, q));
    }
    by_target.push_back(std::move(row));
  }
  // Reliability: each step's predictions on these records, in bins of 0.1, against what happened.
  json reliability = json::array();
  for (size_t k = 0; k < ladder.size(); ++k) {
    std::vector<double> sum_p(10, 0), sum_y(10, 0), count(10, 0);
    for (size_t i = 0; i < records.size(); ++i) {
      const double p = cal_of(i).predict(k, signals_of(records[i]["steps"][k]));
      const size_t b = std::min<size_t>(9, static_cast<size_t>(p * 10));
      sum_p[b] += p;
      sum_y[b] += records[i]["steps"][k]["identical"].get<bool>() ? 1 : 0;
      count[b] += 1;
    }
    json bins = json::array();
    for (size_t b = 0; b < 10; ++b)
      if (count[b] > 0)
        bins.push_back({{"bin", b / 10.0}, {"n", count[b]}, {"predicted", sum_p[b] / count[b]}, {"observed", sum_y[b] / count[b]}});
    reliability.push_back({{"method", ladder[k].method}, {"ratio", ladder[k].ratio}, {"bins", bins}});
  }
  std::set<std::string> datasets;
  for (const auto& r : records) datasets.insert(r.at("dataset").get<std::string>());
  return {{"fingerprint", calibrations.front().fingerprint}, {"examples", records.size()}, {"datasets", datasets},
          {"fixed", fixed}, {"auto", by_target}, {"perfect_predictor", perfect_predictor_bounds(records)},
          {"reliability", reliability}};
}

}  // namespace

json evaluate_policy(const std::vector<json>& all_steps, const autoq::AutoCalibration& cal, const std::vector<double>& targets) {
  if (all_steps.empty()) throw std::invalid_argument("no records to evaluate on");
  for (const auto& r : all_steps) check_replayable(r, cal);
  const std::vector<json> records = select_steps(all_steps, ladder_of(cal));
  return replay_report(records, {cal}, std::vector<size_t>(records.size(), 0), targets);
}

json cross_validate(const std::vector<json>& held_out, const std::vector<json>& fit_also, const CrossValidation& cv,
                    const std::vector<double>& targets) {
  if (cv.folds < 2 || cv.folds > held_out.size())
    throw std::invalid_argument("--cross-validate: " + std::to_string(cv.folds) + " folds of " + std::to_string(held_out.size()) +
                                " records (at least 2, at most one per record)");
  std::set<std::string> fitted_only;  // a request in both would be replayed by calibrations that saw it
  for (const auto& r : fit_also) fitted_only.insert(request_key(r));
  for (const auto& r : held_out)
    if (fitted_only.count(request_key(r)))
      throw std::invalid_argument("record " + r.at("id").get<std::string>() +
                                  " is both to be replayed and only fitted on (the --evaluate and --fit files overlap)");
  std::vector<json> records = cv.ladder.empty() ? held_out : select_steps(held_out, cv.ladder);
  const std::vector<json> extra = cv.ladder.empty() ? fit_also : select_steps(fit_also, cv.ladder);
  // Folds are contiguous runs of the records in (dataset, example index) order, whatever order
  // the files came in: the same folds for the same records.
  std::stable_sort(records.begin(), records.end(), [](const json& a, const json& b) {
    return std::pair(a.at("dataset").get<std::string>(), a.at("index").get<size_t>()) <
           std::pair(b.at("dataset").get<std::string>(), b.at("index").get<size_t>());
  });
  const size_t n = records.size();
  std::vector<autoq::AutoCalibration> calibrations;
  std::vector<size_t> fold_of(n);
  for (size_t k = 0; k < cv.folds; ++k) {
    const size_t lo = n * k / cv.folds, hi = n * (k + 1) / cv.folds;
    std::vector<json> train(extra);
    for (size_t i = 0; i < n; ++i)
      if (i < lo || i >= hi) train.push_back(records[i]);
      else fold_of[i] = k;
    calibrations.push_back(fit_calibration(train, cv.l2, cv.size_bounds));
  }
  for (size_t i = 0; i < n; ++i) check_replayable(records[i], calibrations[fold_of[i]]);
  records = select_steps(records, ladder_of(calibrations.front()));
  json report = replay_report(records, calibrations, fold_of, targets);
  report["cross_validation"] = {{"folds", cv.folds}, {"fitted_also_on", extra.size()}};
  return report;
}

}  // namespace cf::eval
