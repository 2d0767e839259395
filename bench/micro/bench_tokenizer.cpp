// Tokenizer speed on the default model's vocabulary (the real GGUF: $CHUNKFUSE_MODEL or the
// setup.sh cache): a ~2,000-token MuSiQue passage from the golden fixture, encoded by a fresh
// tokenizer (cold: empty word cache, what a chunk's first precompute pays) and by a warm one.
// Reports tokens/s. A speed number belongs here, not in a unit test (the CI machine is noisy).
#include <benchmark/benchmark.h>

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "base/paths.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

namespace {

std::string musique_passage() {
  const std::string path = std::string(CHUNKFUSE_SOURCE_DIR) + "/tests/golden/smollm2_q4_1.json";
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot open " + path);
  const nlohmann::json fixture = nlohmann::json::parse(f);
  for (const auto& c : fixture.at("tokenize"))
    if (c.at("name") == "musique_passage") return c.at("text");
  throw std::runtime_error(path + " has no musique_passage case");
}

struct Setup {
  std::unique_ptr<cf::GgufFile> file = cf::GgufFile::open(cf::default_model_path());
  std::string text = musique_passage();
};

Setup& setup() {
  static Setup s;
  return s;
}

void cold(benchmark::State& state) {
  size_t n = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto tok = cf::Tokenizer::from_gguf(*setup().file);
    state.ResumeTiming();
    n = tok->encode(setup().text, false, false).size();
    benchmark::DoNotOptimize(n);
  }
  state.counters["tokens/s"] = benchmark::Counter(double(n) * state.iterations(), benchmark::Counter::kIsRate);
}

void warm(benchmark::State& state) {
  auto tok = cf::Tokenizer::from_gguf(*setup().file);
  size_t n = tok->encode(setup().text, false, false).size();
  for (auto _ : state) {
    n = tok->encode(setup().text, false, false).size();
    benchmark::DoNotOptimize(n);
  }
  state.counters["tokens/s"] = benchmark::Counter(double(n) * state.iterations(), benchmark::Counter::kIsRate);
}

BENCHMARK(cold)->Unit(benchmark::kMillisecond);
BENCHMARK(warm)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
