// Token sampling from logits, in llama.cpp's default order: repetition penalty, top-k,
// top-p, min-p, temperature, then a draw. temperature <= 0 is greedy (argmax, lowest id
// on ties) and ignores the other filters except the repetition penalty.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "model/tokenizer.h"

namespace cf {

struct SamplingParams {
  float temperature = 0.0f;
  int top_k = 40;            // <= 0: off
  float top_p = 0.95f;       // >= 1: off
  float min_p = 0.05f;       // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off
  int repeat_last_n = 64;    // window of recent tokens the penalty looks at
  uint64_t seed = 0;
  // Throws std::invalid_argument with a message naming the bad field.
  void validate() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // `history`: tokens so far (prompt and generated), for the repetition penalty.
  TokenId sample(const float* logits, size_t vocab, std::span<const TokenId> history);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
};

TokenId argmax(const float* logits, size_t n);
// log(softmax(logits)) in double (the whole vocabulary's tail counts for KL and entropy).
std::vector<double> log_softmax(std::span<const float> logits);

}  // namespace cf
