#include "runtime/generate.h"

#include <chrono>
#include <stdexcept>

namespace cf {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Length of the longest prefix of `s` that ends on a UTF-8 character boundary.
size_t complete_utf8_prefix(std::string_view s) {
  size_t i = s.size();
  size_t back = 0;
  while (i > 0 && back < 4) {
    const unsigned char c = s[i - 1];
    if ((c & 0xC0) != 0x80) {  // lead byte or ASCII
      size_t need = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
      return back + 1 >= need ? s.size() : i - 1;
    }
    --i;
    ++back;
  }
  return s.size();
}

// Holds back text that could still turn into a stop string or is an incomplete character.
class StopMatcher {
 public:
  explicit StopMatcher(const std::vector<std::string>& stops) : stops_(stops) {}
  // Adds text; returns true when a stop string completed (text is then cut before it).
  bool add(std::string_view piece) {
    text_.append(piece);
    for (const auto& s : stops_) {
      if (s.empty()) continue;
      auto at = text_.find(s, emitted_ > s.size() ? emitted_ - s.size() : 0);
      if (at != std::string::npos) {
        text_.resize(at);
        return true;
      }
    }
    return false;
  }
  // Text that can be shown now.
  std::string_view ready(bool final) {
    size_t safe = final ? text_.size() : complete_utf8_prefix(text_);
    if (!final) {
      for (const auto& s : stops_)
        for (size_t k = std::min(s.size() - (s.empty() ? 0 : 1), safe); k > 0; --k)
          if (safe >= k && text_.compare(safe - k, k, s, 0, k) == 0) {
            safe -= k;
            break;
          }
    }
    if (safe < emitted_) safe = emitted_;
    std::string_view out(text_.data() + emitted_, safe - emitted_);
    emitted_ = safe;
    return out;
  }
  const std::string& text() const { return text_; }

 private:
  const std::vector<std::string>& stops_;
  std::string text_;
  size_t emitted_ = 0;
};

}  // namespace

GenerateResult Generator::generate(KvCache& cache, const std::vector<TokenId>& prompt, const GenerateOptions& opt,
                                   int32_t start_pos) {
  if (prompt.empty()) throw std::invalid_argument("generate: empty prompt");
  const auto t0 = Clock::now();
  std::vector<int32_t> pos(prompt.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = start_pos + static_cast<int32_t>(i);
  const size_t last = prompt.size() - 1;
  ForwardInput in{prompt, pos, {}, std::span<const size_t>(&last, 1)};
  ForwardOutput fo = fwd_.run(cache, in);
  const double prefill = ms_since(t0);
  GenerateResult r = continue_from(cache, std::move(fo.logits), start_pos + static_cast<int32_t>(prompt.size()),
                                   prompt, opt);
  r.prefill_ms = prefill;
  r.ttft_ms += prefill;
  r.prompt_tokens = prompt.size();
  return r;
}

GenerateResult Generator::continue_from(KvCache& cache, std::vector<float> logits, int32_t next_pos,
                                        const std::vector<TokenId>& history, const GenerateOptions& opt) {
  const auto t0 = Clock::now();
  const Tokenizer& tok = fwd_.model().tokenizer();
  const size_t vocab = fwd_.model().hparams().vocab_size;
  if (logits.size() != vocab) throw std::invalid_argument("generate: logits of the wrong size");
  Sampler sampler(opt.sampling);
  std::vector<TokenId> seen = history;
  StopMatcher stop(opt.stop);
  GenerateResult r;
  r.stop_reason = "length";
  Clock::time_point decode_start;
  for (int i = 0; i < opt.max_tokens; ++i) {
    if (i > 0) {
      const size_t row = 0;
      const TokenId t = r.tokens.back();
      const int32_t p = next_pos++;
      ForwardInput in{std::span<const TokenId>(&t, 1), std::span<const int32_t>(&p, 1), {},
                      std::span<const size_t>(&row, 1)};
      logits = std::move(fwd_.run(cache, in).logits);
    }
    const TokenId next = sampler.sample(logits.data(), vocab, seen);
    if (i == 0) {
      r.ttft_ms = ms_since(t0);
      decode_start = Clock::now();
    }
    if (tok.is_end_of_generation(next)) {
      r.stop_reason = "eos";
      break;
    }
    r.tokens.push_back(next);
    seen.push_back(next);
    const bool hit = stop.add(tok.token_to_piece(next, false));
    const bool last = hit || i + 1 == opt.max_tokens;
    std::string_view piece = stop.ready(last);
    if (opt.on_text && !piece.empty() && !opt.on_text(piece)) {
      r.stop_reason = "callback";
      break;
    }
    if (hit) {
      r.stop_reason = "stop";
      break;
    }
  }
  if (r.stop_reason != "length" && opt.on_text) {
    std::string_view rest = stop.ready(true);
    if (!rest.empty()) opt.on_text(rest);
  }
  if (!r.tokens.empty()) r.decode_ms = ms_since(decode_start);
  r.text = stop.text();
  return r;
}

}  // namespace cf
