#include "model/pretokenizer.h"

#include <cstdint>

#include "model/unicode.h"

namespace cf {

namespace {

using unicode::kLetter;
using unicode::kNumber;
using unicode::kPunctuation;
using unicode::kWhitespace;

// A span [begin, end) of code points that later stages may split but never merge.
struct Segment {
  size_t begin;
  size_t end;
};

// Code points of the current segment with their flags; positions outside it read as
// "nothing" (flags 0, kNone), which is how lookaheads stop at segment edges.
class Cursor {
 public:
  static constexpr uint32_t kNone = 0xFFFFFFFF;
  Cursor(const std::vector<uint32_t>& cps, const std::vector<uint16_t>& fl, Segment s)
      : cps_(cps), flags_(fl), seg_(s) {}
  uint32_t cp(size_t i) const { return inside(i) ? cps_[i] : kNone; }
  uint16_t flags(size_t i) const { return inside(i) ? flags_[i] : 0; }
  bool inside(size_t i) const { return i >= seg_.begin && i < seg_.end; }
  bool letter(size_t i) const { return flags(i) & kLetter; }
  bool number(size_t i) const { return flags(i) & kNumber; }
  bool space(size_t i) const { return flags(i) & kWhitespace; }
  // [^\s\p{L}\p{N}] for a position inside the segment.
  bool other(size_t i) const {
    const uint16_t f = flags(i);
    return f != 0 && !(f & (kWhitespace | kLetter | kNumber));
  }

 private:
  const std::vector<uint32_t>& cps_;
  const std::vector<uint16_t>& flags_;
  Segment seg_;
};

inline uint32_t ascii_lower(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

// Length of a contraction ('s 't 're 've 'm 'll 'd) at `pos`, 0 when none.
size_t contraction_length(const Cursor& c, size_t pos, bool ignore_case) {
  if (c.cp(pos) != '\'') return 0;
  auto at = [&](size_t i) { return ignore_case ? ascii_lower(c.cp(i)) : c.cp(i); };
  const uint32_t a = at(pos + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  const uint32_t b = at(pos + 2);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
// (with a lone \s+ where the lookahead leaves a single whitespace unmatched).
void split_gpt2(const Cursor& c, Segment s, std::vector<Segment>& out) {
  size_t pos = s.begin;
  while (pos < s.end) {
    const size_t start = pos;
    if (size_t n = contraction_length(c, pos, false)) {
      out.push_back({start, pos + n});
      pos += n;
      continue;
    }
    // Optional leading space, then a run of one class.
    const size_t body = (c.cp(pos) == ' ') ? pos + 1 : pos;
    if (c.letter(body) || c.number(body) || c.other(body)) {
      size_t end = body;
      if (c.letter(body)) {
        while (c.letter(end)) ++end;
      } else if (c.number(body)) {
        while (c.number(end)) ++end;
      } else {
        while (c.other(end)) ++end;
      }
      out.push_back({start, end});
      pos = end;
      continue;
    }
    size_t n_space = 0;
    while (c.space(pos + n_space)) ++n_space;
    if (n_space > 1 && c.inside(pos + n_space)) {
      // \s+(?!\S): leave the last whitespace to lead the next word.
      out.push_back({start, pos + n_space - 1});
      pos += n_space - 1;
    } else if (n_space > 0) {
      out.push_back({start, pos + n_space});
      pos += n_space;
    } else {
      out.push_back({start, pos + 1});
      ++pos;
    }
  }
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
//  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
void split_llama3(const Cursor& c, Segment s, size_t max_digits, std::vector<Segment>& out) {
  auto is_crlf = [](uint32_t cp) { return cp == '\r' || cp == '\n'; };
  size_t pos = s.begin;
  while (pos < s.end) {
    const size_t start = pos;
    const uint32_t cp = c.cp(pos);
    if (size_t n = contraction_length(c, pos, true)) {
      out.push_back({start, pos + n});
      pos += n;
      continue;
    }
    if (!is_crlf(cp) && !c.number(pos) && (c.letter(pos) || c.letter(pos + 1))) {
      size_t end = pos + 1;  // the optional prefix, or the first letter
      while (c.letter(end)) ++end;
      out.push_back({start, end});
      pos = end;
      continue;
    }
    if (c.number(pos)) {
      size_t end = pos;
      while (c.number(end) && end - pos < max_digits) ++end;
      out.push_back({start, end});
      pos = end;
      continue;
    }
    const size_t body = (cp == ' ') ? pos + 1 : pos;
    if (c.other(body)) {
      size_t end = body;
      while (c.other(end)) ++end;
      while (is_crlf(c.cp(end))) ++end;
      out.push_back({start, end});
      pos = end;
      continue;
    }
    size_t n_space = 0;
    size_t last_newline_end = 0;
    while (c.space(pos + n_space)) {
      if (is_crlf(c.cp(pos + n_space))) last_newline_end = pos + n_space + 1;
      ++n_space;
    }
    if (last_newline_end > 0) {  // \s*[\r\n]+
      out.push_back({start, last_newline_end});
      pos = last_newline_end;
    } else if (n_space > 1 && c.inside(pos + n_space)) {  // \s+(?!\S)
      out.push_back({start, pos + n_space - 1});
      pos += n_space - 1;
    } else if (n_space > 0) {  // \s+
      out.push_back({start, pos + n_space});
      pos += n_space;
    } else {
      out.push_back({start, pos + 1});
      ++pos;
    }
  }
}

// A regex `X` whose matches and the text between them all become pieces. `match_len`
// returns the length of a match starting at a position (0 when none).
template <typename MatchLen>
void split_by_matches(Segment s, MatchLen match_len, std::vector<Segment>& out) {
  size_t gap_start = s.begin;
  size_t pos = s.begin;
  while (pos < s.end) {
    size_t n = match_len(pos);
    if (n == 0) {
      ++pos;
      continue;
    }
    if (gap_start < pos) out.push_back({gap_start, pos});
    out.push_back({pos, pos + n});
    pos += n;
    gap_start = pos;
  }
  if (gap_start < s.end) out.push_back({gap_start, s.end});
}

enum class Stage { Digits1, Gpt2, Llama3, Qwen2, PunctuationRuns, NumberRuns, AsciiDigits3 };

std::vector<Stage> stages_of(PreTokenizer kind) {
  switch (kind) {
    case PreTokenizer::Gpt2: return {Stage::Gpt2};
    case PreTokenizer::StarCoder: return {Stage::Digits1, Stage::Gpt2};
    case PreTokenizer::Llama3: return {Stage::Llama3};
    case PreTokenizer::Qwen2: return {Stage::Qwen2};
    case PreTokenizer::Default: break;
  }
  return {Stage::PunctuationRuns, Stage::Gpt2, Stage::NumberRuns, Stage::AsciiDigits3};
}

}  // namespace

PreTokenizerInfo pre_tokenizer_from_name(std::string_view name) {
  // Names as llama.cpp groups them (llama-vocab.cpp, "tokenizer.ggml.pre").
  if (name.empty() || name == "default") return {PreTokenizer::Default, false, true};
  for (std::string_view n : {"llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe"}) {
    if (name == n) return {PreTokenizer::Llama3, name != "dbrx" && name != "smaug-bpe", true};
  }
  for (std::string_view n : {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
                             "minerva-7b"}) {
    if (name == n) return {PreTokenizer::StarCoder, false, true};
  }
  for (std::string_view n : {"gpt2", "gpt-2", "phi-2", "mpt", "olmo", "jais", "roberta-bpe"}) {
    if (name == n) return {PreTokenizer::Gpt2, false, true};
  }
  for (std::string_view n : {"qwen2", "stablelm2", "megrez"}) {
    if (name == n) return {PreTokenizer::Qwen2, false, true};
  }
  return {PreTokenizer::Default, false, false};
}

std::vector<std::string> pre_tokenize(PreTokenizer kind, std::string_view text) {
  const std::vector<uint32_t> cps = unicode::decode_utf8(text);
  std::vector<uint16_t> fl(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) fl[i] = unicode::flags(cps[i]);

  std::vector<Segment> segments;
  if (!cps.empty()) segments.push_back({0, cps.size()});
  std::vector<Segment> next;
  for (Stage stage : stages_of(kind)) {
    next.clear();
    next.reserve(segments.size() * 2);
    for (const Segment& s : segments) {
      const Cursor c(cps, fl, s);
      switch (stage) {
        case Stage::Gpt2: split_gpt2(c, s, next); break;
        case Stage::Llama3: split_llama3(c, s, 3, next); break;
        case Stage::Qwen2: split_llama3(c, s, 1, next); break;
        case Stage::Digits1:  // \p{N}
          split_by_matches(s, [&](size_t i) -> size_t { return c.number(i) ? 1 : 0; }, next);
          break;
        case Stage::NumberRuns:  // \p{N}+
          split_by_matches(s, [&](size_t i) {
            size_t e = i;
            while (c.number(e)) ++e;
            return e - i;
          }, next);
          break;
        case Stage::PunctuationRuns:  // [\p{P}\$\+<=>\^~\|]+
          split_by_matches(s, [&](size_t i) {
            auto hit = [&](size_t k) {
              const uint32_t cp = c.cp(k);
              return (c.flags(k) & kPunctuation) || cp == '$' || cp == '+' || cp == '<' ||
                     cp == '=' || cp == '>' || cp == '^' || cp == '~' || cp == '|';
            };
            size_t e = i;
            while (hit(e)) ++e;
            return e - i;
          }, next);
          break;
        case Stage::AsciiDigits3:  // [0-9][0-9][0-9]
          split_by_matches(s, [&](size_t i) -> size_t {
            for (size_t k = 0; k < 3; ++k) {
              const uint32_t cp = c.cp(i + k);
              if (cp < '0' || cp > '9') return 0;
            }
            return 3;
          }, next);
          break;
      }
    }
    segments.swap(next);
  }

  std::vector<std::string> words;
  words.reserve(segments.size());
  for (const Segment& s : segments) words.push_back(unicode::encode_utf8(cps.data() + s.begin, s.end - s.begin));
  return words;
}

}  // namespace cf
