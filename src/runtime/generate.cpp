#include "runtime/generate.h"

#include <chrono>
#include <stdexcept>

#include "base/clock.h"

namespace cf {
namespace {

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

}  // namespace

// Holds back text that could still turn into a stop string or is an incomplete character.
class DecodeSession::StopMatcher {
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

DecodeSession::DecodeSession(const Tokenizer& tok, const GenerateOptions& opt, std::vector<TokenId> history)
    : tok_(tok), opt_(opt), sampler_(opt.sampling), seen_(std::move(history)), stop_(std::make_unique<StopMatcher>(opt.stop)) {
  if (opt.max_tokens <= 0) stop_reason_ = "length";
}
DecodeSession::~DecodeSession() = default;
DecodeSession::DecodeSession(DecodeSession&&) noexcept = default;

std::string DecodeSession::text() const { return stop_->text(); }

void DecodeSession::finish(std::string reason) {
  stop_reason_ = std::move(reason);
  // "length" already flushed with the last token.
  if (stop_reason_ != "length" && opt_.on_text) {
    std::string_view rest = stop_->ready(true);
    if (!rest.empty()) opt_.on_text(rest);
  }
}

bool DecodeSession::step(const float* logits, size_t vocab) {
  if (finished()) throw std::logic_error("decode session: step after the end");
  const TokenId next = sampler_.sample(logits, vocab, seen_);
  if (tok_.is_end_of_generation(next)) {
    finish("eos");
    return false;
  }
  tokens_.push_back(next);
  seen_.push_back(next);
  const bool hit = stop_->add(tok_.token_to_piece(next, false));
  const bool last = hit || tokens_.size() >= static_cast<size_t>(opt_.max_tokens);
  std::string_view piece = stop_->ready(last);
  if (opt_.on_text && !piece.empty() && !opt_.on_text(piece)) {
    finish("callback");
    return false;
  }
  if (hit) {
    finish("stop");
    return false;
  }
  if (last) {
    finish("length");
    return false;
  }
  return true;
}

GenerateResult Generator::generate(KvCache& cache, const std::vector<TokenId>& prompt, const GenerateOptions& opt,
                                   int32_t start_pos) {
  if (prompt.empty()) throw std::invalid_argument("generate: empty prompt");
  const auto t0 = SteadyClock::now();
  std::vector<int32_t> pos(prompt.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = start_pos + static_cast<int32_t>(i);
  const size_t last = prompt.size() - 1;
  // The whole prompt in one pass, in llama.cpp's own order for it (also below 8 tokens).
  ForwardInput in{prompt, pos, {}, std::span<const size_t>(&last, 1), WeightMatrix::KQuantOrder::ByRowCount};
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
  const auto t0 = SteadyClock::now();
  const size_t vocab = fwd_.model().hparams().vocab_size;
  if (logits.size() != vocab) throw std::invalid_argument("generate: logits of the wrong size");
  DecodeSession session(fwd_.model().tokenizer(), opt, history);
  GenerateResult r;
  SteadyClock::time_point decode_start;
  bool first = true;
  while (!session.finished()) {
    const bool more = session.step(logits.data(), vocab);
    if (first) {
      r.ttft_ms = ms_since(t0);
      decode_start = SteadyClock::now();
      first = false;
    }
    if (!more) break;
    const size_t row = 0;
    const TokenId t = session.last_token();
    const int32_t p = next_pos++;
    ForwardInput in{std::span<const TokenId>(&t, 1), std::span<const int32_t>(&p, 1), {},
                    std::span<const size_t>(&row, 1), WeightMatrix::KQuantOrder::PerRow};
    logits = std::move(fwd_.run(cache, in).logits);
  }
  r.stop_reason = session.stop_reason();
  r.tokens = session.tokens();
  if (!r.tokens.empty()) r.decode_ms = ms_since(decode_start);
  r.text = session.text();
  return r;
}

}  // namespace cf
