// The fused-prefill invariants of docs/ARCHITECTURE.md, checked the same way on every model the tests
// load: rho = 1 reproduces full prefill and rho = 0 is pure reuse, for every selector, on
// either chunk-cache variant (alone: PIC caches; prefixed: computed after S).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "fusion/executor.h"
#include "fusion/methods.h"
#include "fusion_rig.h"
#include "kv/chunk_store.h"
#include "model/model.h"
#include "runtime/sampler.h"

namespace cf::test {

inline float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

inline FusionOptions run_options(const std::string& method, double ratio, ChunkContext variant) {
  FusionOptions o{method, ratio, 0};
  o.chunk_context = variant;
  return o;
}

inline void expect_ratio_one_is_full_prefill(FusionExecutor& ex, const RagRequest& req,
                                             ChunkContext variant = ChunkContext::alone) {
  const FusionResult full = ex.prefill(req, {"full", 1.0, 0});
  for (const std::string& method : selector_names()) {
    if (method == "reuse") continue;  // defined at rho = 0 only
    const FusionResult r = ex.prefill(req, run_options(method, 1.0, variant));
    EXPECT_EQ(r.recomputed.size(), req.context_tokens()) << method;
    EXPECT_LE(max_diff(r.logits, full.logits), 1e-4f) << method;
    EXPECT_EQ(argmax(r.logits.data(), r.logits.size()), argmax(full.logits.data(), full.logits.size())) << method;
    EXPECT_EQ(r.cache.size(), full.cache.size()) << method;
  }
}

inline void expect_ratio_zero_is_reuse(FusionExecutor& ex, const RagRequest& req,
                                       ChunkContext variant = ChunkContext::alone) {
  const FusionResult reuse = ex.prefill(req, run_options("reuse", 0.0, variant));
  EXPECT_TRUE(reuse.recomputed.empty());
  const FusionResult full = ex.prefill(req, {"full", 1.0, 0});
  EXPECT_GT(max_diff(reuse.logits, full.logits), 1e-3f) << "reuse should differ from full prefill";
  for (const std::string& method : selector_names()) {
    const FusionResult r = ex.prefill(req, run_options(method, 0.0, variant));
    EXPECT_TRUE(r.recomputed.empty()) << method;
    if (method == "cacheblend") continue;  // refreshes its first layers for every token by design
    EXPECT_LE(max_diff(r.logits, reuse.logits), 1e-5f) << method;
  }
}

}  // namespace cf::test
