#include "eval/deviation.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <tuple>

#include "base/progress.h"
#include "eval/bench_request.h"
#include "eval/runner.h"
#include "fusion/executor.h"
#include "fusion/fusionrag_enrich.h"
#include "fusion/methods.h"
#include "kv/chunk_store.h"

namespace cf::eval {

std::vector<LayerDeviation> kv_deviation(const KvCache& reference, const KvCache& other, size_t begin, size_t end) {
  if (reference.n_layers() != other.n_layers() || reference.kv_dim() != other.kv_dim())
    throw std::invalid_argument("kv_deviation: the caches have different shapes");
  if (begin > end || end > reference.size() || end > other.size())
    throw std::invalid_argument("kv_deviation: slots [" + std::to_string(begin) + ", " + std::to_string(end) +
                                ") outside the caches");
  const size_t n = end - begin, width = n * static_cast<size_t>(reference.kv_dim());
  std::vector<float> a(width), b(width);
  auto rel = [&](double diff2, double ref2) { return ref2 > 0 ? std::sqrt(diff2 / ref2) : (diff2 > 0 ? INFINITY : 0.0); };
  auto dist = [&]() {
    double d2 = 0, r2 = 0;
    for (size_t i = 0; i < width; ++i) {
      const double d = static_cast<double>(b[i]) - a[i];
      d2 += d * d;
      r2 += static_cast<double>(a[i]) * a[i];
    }
    return rel(d2, r2);
  };
  std::vector<LayerDeviation> out;
  for (int l = 0; l < reference.n_layers(); ++l) {
    LayerDeviation d;
    d.layer = l;
    if (n) {
      reference.read_k(l, begin, n, a.data());
      other.read_k(l, begin, n, b.data());
      d.k_rel = dist();
      reference.read_v(l, begin, n, a.data());
      other.read_v(l, begin, n, b.data());
      d.v_rel = dist();
    }
    out.push_back(d);
  }
  return out;
}

std::string run_deviation(Forward& fwd, const Dataset& dataset, const DeviationConfig& cfg) {
  namespace fs = std::filesystem;
  if (cfg.out_dir.empty()) throw std::invalid_argument("deviation: an output folder is required");
  if (cfg.methods.empty() || cfg.chunk_contexts.empty()) throw std::invalid_argument("deviation: nothing to run");
  for (double r : cfg.ratios)
    if (!(r >= 0.0 && r <= 1.0)) throw std::invalid_argument("deviation: ratio outside [0, 1]");
  for (const auto& m : cfg.methods) {
    try {
      selector_entry(m);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string("deviation: ") + e.what());
    }
  }
  const Model& model = fwd.model();
  fs::create_directories(cfg.out_dir);
  const std::string path = (fs::path(cfg.out_dir) / "deviation.csv").string();
  std::ofstream csv(path, std::ios::trunc);
  if (!csv) throw std::runtime_error("cannot write " + path);
  csv << "dataset,example,chunk_context,method,ratio,part,layer,k_rel,v_rel\n";

  ChunkStoreOptions so;
  so.dir = cfg.store_dir;
  so.durable = false;
  so.memory_budget_bytes = cfg.memory_budget_bytes;
  so.model = StoreModel{model.fingerprint(), model.hparams()};
  ChunkStore store(so);
  FusionExecutor executor(fwd, store);

  const bool wants_fusionrag = std::any_of(cfg.methods.begin(), cfg.methods.end(), [](const std::string& m) { return enriches_from_corpus(m); });
  const std::vector<CorpusChunk> kb =
      wants_fusionrag ? dataset_knowledge_base(model, dataset, cfg.prompt) : std::vector<CorpusChunk>{};
  const size_t n = std::min(cfg.limit ? cfg.limit : dataset.examples.size(), dataset.examples.size());
  size_t runs_per_example = 0;
  for (const auto& m : cfg.methods) runs_per_example += selector_entry(m).takes_ratio() ? cfg.ratios.size() : 1;
  runs_per_example *= cfg.chunk_contexts.size();
  ProgressBar progress(n * runs_per_example, "runs", cfg.progress);
  size_t done = 0;
  for (size_t e = 0; e < n; ++e) {
    const QaExample& ex = dataset.examples[e];
    const RagRequest req = build_example_request(model, ex, cfg.prompt);
    if (static_cast<long>(req.flatten().size()) >= model.hparams().context_length) {
      std::fprintf(stderr, "\ndeviation: example %s is too long for the context; skipped\n", ex.id.c_str());
      done += runs_per_example;
      continue;
    }
    const FusionResult full = executor.prefill(req, {full_method_name(), 1.0, 0});
    const size_t cb = req.system.size(), ce = cb + req.context_tokens(), qe = ce + req.suffix.size();
    for (const ChunkContext v : cfg.chunk_contexts) {
      if (wants_fusionrag) enrich_request_chunks(fwd, store, req, kb, v);
      for (const auto& m : cfg.methods)
        for (double ratio : cfg.ratios) {
          const MethodEntry& entry = selector_entry(m);
          if (!entry.takes_ratio() && ratio != cfg.ratios.front()) continue;
          const double r = entry.takes_ratio() ? ratio : entry.fixed_ratio;
          progress.update(done, ex.id + " " + m + "@" + std::to_string(r).substr(0, 4) + " " + chunk_context_name(v));
          FusionOptions opt{m, r, 0};
          opt.chunk_context = v;
          opt.method_options =
              cfg.method_options.contains(m) ? cfg.method_options.at(m) : bench_default_method_options(m);
          const FusionResult got = executor.prefill(req, opt);
          for (const auto& [part, b, end] : {std::tuple{"context", cb, ce}, std::tuple{"question", ce, qe}})
            for (const LayerDeviation& d : kv_deviation(full.cache, got.cache, b, end)) {
              char line[256];
              std::snprintf(line, sizeof(line), ",%s,%s,%g,%s,%d,%.6g,%.6g\n", chunk_context_name(v), m.c_str(), r,
                            part, d.layer, d.k_rel, d.v_rel);
              csv << dataset.name << "," << ex.id << line;
            }
          ++done;
        }
    }
    csv.flush();
    if (!csv) throw std::runtime_error("write to " + path + " failed");
  }
  progress.update(done, "done");
  return path;
}

}  // namespace cf::eval
