// `chunkfuse perf`: prefill and decode speed on given token ids (bench/runtime_bench.py
// drives it side by side with llama.cpp).
#include <sys/resource.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "apps/app_common.h"
#include "base/clock.h"
#include "model/int8_peak.h"
#include "runtime/forward.h"
#include "runtime/sampler.h"

namespace cf::apps {
namespace {

struct PerfArgs {
  ModelOptions model;
  std::string tokens_file;
  std::vector<int> prompt_tokens{512, 2048};
  int gen_tokens = 64;
  int decode_context = 512;
  int reps = 1;
  bool json = false;
  bool peak = false;
  int peak_rows = 512;
};

// Multiply-adds of the layer matrices per token (the prefill GEMM's work; attention and the
// output matrix, which a prefill runs for its last row only, are left out).
// Bytes of weights a decode step streams: every layer matrix and the output matrix, at the
// file's width (the repacked tiles keep it).
double decode_weight_bytes(const Model& m) {
  double bytes = 0;
  auto add = [&](const WeightMatrix& w) { bytes += static_cast<double>(ggml_row_bytes(w.type(), w.cols())) * w.rows(); };
  for (const LayerWeights& l : m.layers())
    for (const WeightMatrix* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) add(*w);
  add(m.output());
  return bytes;
}

double layer_macs_per_token(const Model& m) {
  double macs = 0;
  for (const LayerWeights& l : m.layers())
    for (const WeightMatrix* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
      macs += static_cast<double>(w->rows()) * w->cols();
  return macs;
}

// --peak: each ISA's int8 peak, then the GEMM's rate on the model's own layer matrices, one
// line per weight type (every matrix of that type in the first layer that has one).
nlohmann::json measure_peaks(const Model& m, ThreadPool& pool, int rows, bool quiet) {
  nlohmann::json out;
  for (Isa isa : {Isa::Avx2, Isa::Avx512, Isa::Amx}) {
    if (isa > active_isa()) continue;
    const double peak = int8_peak_macs_per_s(isa, pool.size());
    out["int8_peak_gmacs"][isa_name(isa)] = peak / 1e9;
    if (!quiet) std::fprintf(stderr, "int8 peak %-7s %8.1f G MAC/s (%zu threads)\n", isa_name(isa), peak / 1e9, pool.size());
  }
  // The AMX GEMM runs BF16 tiles (kernels_panel_amx.cpp): its own ceiling, half the int8 one.
  const double bf16_peak = active_isa() >= Isa::Amx ? amx_bf16_peak_macs_per_s(pool.size()) : 0.0;
  if (bf16_peak > 0) {
    out["bf16_peak_gmacs"]["amx"] = bf16_peak / 1e9;
    if (!quiet) std::fprintf(stderr, "bf16 peak amx     %8.1f G MAC/s (%zu threads)\n", bf16_peak / 1e9, pool.size());
  }
  const double bw = read_bandwidth_bytes_per_s(pool.size());
  out["read_gb_per_s"] = bw / 1e9;
  if (!quiet) std::fprintf(stderr, "memory read %8.1f GB/s (%zu threads)\n", bw / 1e9, pool.size());
  const double peak = out["int8_peak_gmacs"].value(isa_name(active_isa()), 0.0) * 1e9;
  std::map<GgmlType, std::pair<const LayerWeights*, std::vector<const WeightMatrix*>>> by_type;
  for (const LayerWeights& l : m.layers())
    for (const WeightMatrix* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      auto& [first, mats] = by_type[w->type()];
      if (!first) first = &l;
      if (first == &l) mats.push_back(w);
    }
  for (auto& [type, entry] : by_type) {
    const auto& mats = entry.second;
    size_t cols = 0;
    for (const WeightMatrix* w : mats) cols = std::max(cols, w->cols());
    size_t out_rows = 0;
    for (const WeightMatrix* w : mats) out_rows = std::max(out_rows, w->rows());
    std::vector<float> x(static_cast<size_t>(rows) * cols), y(static_cast<size_t>(rows) * out_rows);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    double macs = 0, best = 1e30;
    for (const WeightMatrix* w : mats) macs += static_cast<double>(w->rows()) * w->cols() * rows;
    for (int rep = 0; rep < 3; ++rep) {
      const double t0 = now_ms();
      for (const WeightMatrix* w : mats) w->multiply(x.data(), rows, w->cols(), y.data(), w->rows(), pool);
      best = std::min(best, (now_ms() - t0) / 1000.0);
    }
    const double rate = macs / best;
    out["gemm"].push_back({{"type", std::string(ggml_type_name(type))}, {"matrices", mats.size()}, {"rows", rows},
                           {"gmacs", rate / 1e9}, {"fraction_of_peak", peak > 0 ? rate / peak : 0.0}});
    if (bf16_peak > 0) out["gemm"].back()["fraction_of_bf16_peak"] = rate / bf16_peak;
    if (!quiet) {
      std::fprintf(stderr, "gemm %-5s x %d rows: %8.1f G MAC/s, %5.1f%% of the %s int8 peak",
                   std::string(ggml_type_name(type)).c_str(), rows, rate / 1e9, peak > 0 ? 100 * rate / peak : 0.0,
                   isa_name(active_isa()));
      if (bf16_peak > 0) std::fprintf(stderr, ", %.0f%% of its bf16 peak", 100 * rate / bf16_peak);
      std::fprintf(stderr, " (%zu matrices)\n", mats.size());
    }
  }
  return out;
}

std::vector<TokenId> read_ids(const std::string& path, const Model& m, size_t need) {
  std::vector<TokenId> ids;
  if (!path.empty()) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot read " + path);
    nlohmann::json j;
    try {
      in >> j;
      ids = j.get<std::vector<TokenId>>();
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(path + ": expected a JSON list of token ids (" + e.what() + ")");
    }
  } else {
    // A deterministic prose-like prompt when no ids are given.
    std::string text;
    while (ids.size() < need) {
      text += "The quick brown fox jumps over the lazy dog while the river keeps flowing to the sea. ";
      ids = m.tokenizer().encode(text, false, false);
    }
  }
  if (ids.size() < need)
    throw std::runtime_error("need " + std::to_string(need) + " token ids, the file has " + std::to_string(ids.size()));
  for (TokenId t : ids)
    if (t < 0 || t >= m.hparams().vocab_size) throw std::runtime_error("token id out of range: " + std::to_string(t));
  return ids;
}

int run_perf(const PerfArgs& a) {
  auto model = load_model(a.model, a.json);
  ThreadPool pool(a.model.threads);
  Forward fwd(*model, pool);
  int need = a.decode_context;
  for (int n : a.prompt_tokens) {
    if (n < 1) throw std::runtime_error("--prompt-tokens values must be >= 1");
    need = std::max(need, n);
  }
  const auto ids = read_ids(a.tokens_file, *model, need);

  nlohmann::json out;
  out["threads"] = pool.size();
  out["isa"] = isa_name(active_isa());
  double peak = 0;
  if (a.peak) {
    out["peak"] = measure_peaks(*model, pool, a.peak_rows, a.json);
    peak = out["peak"]["int8_peak_gmacs"].value(isa_name(active_isa()), 0.0) * 1e9;
  }
  const double macs_per_token = layer_macs_per_token(*model);
  out["prefill"] = nlohmann::json::array();
  auto prefill = [&](KvCache& cache, int n) {
    std::vector<int32_t> pos(n);
    for (int i = 0; i < n; ++i) pos[i] = i;
    const size_t last = n - 1;
    ForwardInput in{std::span<const TokenId>(ids.data(), n), pos, {}, std::span<const size_t>(&last, 1)};
    return fwd.run(cache, in);
  };
  for (int n : a.prompt_tokens) {
    for (int rep = 0; rep < a.reps; ++rep) {
      KvCache cache(model->hparams(), n);
      const double t0 = now_ms();
      prefill(cache, n);
      const double s = (now_ms() - t0) / 1000.0;
      const double rate = macs_per_token * n / s;
      out["prefill"].push_back({{"n_tokens", n}, {"seconds", s}, {"tok_per_s", n / s}, {"layer_gmacs", rate / 1e9}});
      if (peak > 0) out["prefill"].back()["fraction_of_peak"] = rate / peak;
      if (!a.json)
        std::fprintf(stderr, "prefill %5d tokens: %8.1f ms  %7.1f tok/s  %6.1f G MAC/s in the layer matrices%s\n", n,
                     s * 1000, n / s, rate / 1e9,
                     peak > 0 ? (" (" + std::to_string(static_cast<int>(100 * rate / peak + 0.5)) + "% of peak)").c_str() : "");
    }
  }
  for (int rep = 0; rep < a.reps && a.gen_tokens > 0; ++rep) {
    KvCache cache(model->hparams(), a.decode_context + a.gen_tokens);
    auto fo = prefill(cache, a.decode_context);
    TokenId t = argmax(fo.logits.data(), fo.vocab);
    const double t0 = now_ms();
    for (int i = 0; i < a.gen_tokens; ++i) {
      const int32_t p = a.decode_context + i;
      const size_t row = 0;
      ForwardInput in{std::span<const TokenId>(&t, 1), std::span<const int32_t>(&p, 1), {},
                      std::span<const size_t>(&row, 1), WeightMatrix::KQuantOrder::PerRow};
      auto o = fwd.run(cache, in);
      t = argmax(o.logits.data(), o.vocab);
    }
    const double s = (now_ms() - t0) / 1000.0;
    const double gbs = decode_weight_bytes(*model) * a.gen_tokens / s / 1e9;
    out["decode"] = {{"n_tokens", a.gen_tokens}, {"context", a.decode_context}, {"seconds", s},
                     {"tok_per_s", a.gen_tokens / s}, {"weight_gb_per_s", gbs}};
    const double bw = a.peak ? out["peak"].value("read_gb_per_s", 0.0) : 0.0;
    if (bw > 0) out["decode"]["fraction_of_read_bandwidth"] = gbs / bw;
    if (!a.json)
      std::fprintf(stderr, "decode  %5d tokens: %8.1f ms  %7.1f tok/s  %6.1f GB/s of weights%s\n", a.gen_tokens, s * 1000,
                   a.gen_tokens / s, gbs,
                   bw > 0 ? (" (" + std::to_string(static_cast<int>(100 * gbs / bw + 0.5)) + "% of the read bandwidth)").c_str() : "");
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  out["rss_peak_bytes"] = static_cast<int64_t>(ru.ru_maxrss) * 1024;
  if (a.json) std::printf("%s\n", out.dump().c_str());
  else std::fprintf(stderr, "peak resident memory: %.1f MiB\n", ru.ru_maxrss / 1024.0);
  return 0;
}

}  // namespace

void add_perf_command(CLI::App& app, CommandRunner& run) {
  auto [a, cmd] = add_model_command<PerfArgs>(app, run, "perf", "measure prefill and decode speed", run_perf);
  cmd->add_option("--tokens-file", a->tokens_file, "JSON list of token ids to use as the prompt (default: built-in text)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--prompt-tokens", a->prompt_tokens, "prefill lengths to time")->delimiter(',')->capture_default_str();
  cmd->add_option("--gen-tokens", a->gen_tokens, "tokens to decode (0: skip decode)")->check(CLI::Range(0, 100000))->capture_default_str();
  cmd->add_option("--decode-context", a->decode_context, "prompt tokens before decoding")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  cmd->add_option("--reps", a->reps, "repetitions")->check(CLI::Range(1, 1000))->capture_default_str();
  cmd->add_flag("--json", a->json, "print one JSON object to standard output");
  cmd->add_flag("--peak", a->peak,
                "also measure the CPU's int8 multiply-add peak per ISA and the GEMM's rate on the model's layer "
                "matrices per weight type, as a fraction of it");
  cmd->add_option("--peak-rows", a->peak_rows, "activation rows of the --peak GEMM runs")
      ->check(CLI::Range(1, 8192))->capture_default_str();
}

}  // namespace cf::apps
