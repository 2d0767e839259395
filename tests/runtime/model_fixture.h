// The default model, loaded once per test binary (loading and repacking takes a moment).
#pragma once
#include <memory>

#include "base/thread_pool.h"
#include "model/model.h"
#include "test_support.h"

namespace cf::test {

inline const Model& shared_model() {
  static std::unique_ptr<Model> m = Model::load(default_model_path());
  return *m;
}

// Gemma 3 270M (sliding-window attention), loaded once per test binary.
inline const Model& shared_gemma3() {
  static std::unique_ptr<Model> m = Model::load(gemma3_model_path());
  return *m;
}

// Qwen2.5-Coder-0.5B / 1.5B-Instruct Q4_K_M (qwen2), loaded once per test binary.
inline const Model& shared_qwen05() {
  static std::unique_ptr<Model> m = Model::load(qwen05_model_path());
  return *m;
}

inline const Model& shared_qwen15() {
  static std::unique_ptr<Model> m = Model::load(qwen15_model_path());
  return *m;
}

inline ThreadPool& shared_pool() {
  static ThreadPool pool(2);
  return pool;
}

inline std::vector<int32_t> iota_positions(size_t n, int32_t start = 0) {
  std::vector<int32_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = start + static_cast<int32_t>(i);
  return p;
}

}  // namespace cf::test
