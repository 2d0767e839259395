// Text generation on top of the forward pass: prefill a prompt (or continue from logits a
// caller already has, e.g. after a fused prefill), then decode one token at a time with a
// Sampler until EOS/end-of-generation, a stop string, the token limit, or the callback
// says stop. Streamed text never splits a UTF-8 character and never shows a stop string.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/forward.h"
#include "runtime/sampler.h"

namespace cf {

struct GenerateOptions {
  int max_tokens = 128;
  SamplingParams sampling;
  std::vector<std::string> stop;  // stop strings (not included in the output)
  // Streaming: called with each piece of text as it becomes final; return false to stop.
  std::function<bool(std::string_view text)> on_text;
};

struct GenerateResult {
  std::vector<TokenId> tokens;     // generated ids (the stopping token excluded)
  std::string text;
  std::string stop_reason;         // "eos", "stop", "length", "callback"
  size_t prompt_tokens = 0;
  double prefill_ms = 0;           // prompt forward pass (0 when continuing)
  double ttft_ms = 0;              // until the first token is chosen
  double decode_ms = 0;            // all decode steps
  double decode_tokens_per_s() const { return decode_ms > 0 ? (tokens.size() > 1 ? (tokens.size() - 1) * 1000.0 / decode_ms : 0) : 0; }
};

// One generation's per-token logic, whatever runs the forward pass (the Generator runs one
// sequence; the server's scheduler batches many): sampling, end of generation, stop
// strings, the token limit and UTF-8-safe streaming through GenerateOptions::on_text.
class DecodeSession {
 public:
  // `history`: the prompt (for the repetition penalty). `opt` must outlive the session.
  DecodeSession(const Tokenizer& tok, const GenerateOptions& opt, std::vector<TokenId> history);
  ~DecodeSession();
  DecodeSession(DecodeSession&&) noexcept;
  // Chooses the next token from the logits of the latest position. true: generation goes
  // on, and last_token() must be run through the model (at the next position) to give the
  // next logits; false: finished, stop_reason() says why ("eos", "stop", "length",
  // "callback") and all text has been streamed.
  bool step(const float* logits, size_t vocab);
  bool finished() const { return !stop_reason_.empty(); }
  const std::string& stop_reason() const { return stop_reason_; }
  TokenId last_token() const { return tokens_.back(); }
  const std::vector<TokenId>& tokens() const { return tokens_; }  // the stopping token excluded
  std::string text() const;                                       // stop string cut off

 private:
  void finish(std::string reason);
  class StopMatcher;
  const Tokenizer& tok_;
  const GenerateOptions& opt_;
  Sampler sampler_;
  std::vector<TokenId> seen_;
  std::vector<TokenId> tokens_;
  std::unique_ptr<StopMatcher> stop_;
  std::string stop_reason_;
};

class Generator {
 public:
  explicit Generator(Forward& fwd) : fwd_(fwd) {}
  // Appends the prompt at positions start_pos.. to `cache` and generates.
  GenerateResult generate(KvCache& cache, const std::vector<TokenId>& prompt, const GenerateOptions& opt,
                          int32_t start_pos = 0);
  // Continues from the logits of the last prompt row; the next token goes at `next_pos`.
  // `history` is the prompt (for the repetition penalty).
  GenerateResult continue_from(KvCache& cache, std::vector<float> logits, int32_t next_pos,
                               const std::vector<TokenId>& history, const GenerateOptions& opt);

 private:
  Forward& fwd_;
};

}  // namespace cf
