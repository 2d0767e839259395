// SentencePiece-style BPE (tokenizer.ggml.model = "llama"), as llama.cpp runs it: spaces
// become U+2581, a space is prefixed to text at the start or after a special token when
// add_space_prefix is set, then adjacent symbols are merged best score first (leftmost on
// ties) while the concatenation is a vocabulary entry; leftovers become <0xXX> byte tokens.
#include <queue>
#include <stdexcept>

#include "model/tokenizer_common.h"
#include "model/unicode.h"

namespace cf::detail {

namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581

// llama.cpp's sequence length by the lead byte's high nibble (0xF8..0xFF count as 4).
size_t lead_length(uint8_t b) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[b >> 4];
}

class SpmTokenizer final : public VocabTokenizer {
 public:
  explicit SpmTokenizer(TokenizerVocab&& v) : VocabTokenizer(std::move(v)) {}

  void init(std::vector<float>&& scores) {
    if (!scores.empty() && scores.size() != tokens_.size()) {
      throw std::runtime_error("tokenizer: tokenizer.ggml.scores has " + std::to_string(scores.size()) +
                               " entries for " + std::to_string(tokens_.size()) + " tokens");
    }
    scores_ = std::move(scores);
    scores_.resize(tokens_.size(), 0.0f);
    static const char* hex = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) {
      const char name[] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
      TokenId id = find(std::string_view(name, sizeof(name)));
      if (id < 0) id = find(std::string_view(reinterpret_cast<const char*>(&b), 1));
      byte_tokens_[static_cast<size_t>(b)] = id >= 0 ? id : unk_;
    }
    finish_setup();
  }

 protected:
  void encode_text(std::string_view raw, bool first_after_special, std::vector<TokenId>& out) const override {
    std::string text;
    text.reserve(raw.size() + 8);
    if (add_space_prefix_ && first_after_special) text += kSpaceMark;
    for (char c : raw) {
      if (c == ' ') {
        text += kSpaceMark;
      } else {
        text.push_back(c);
      }
    }

    struct Symbol {
      size_t begin;
      size_t len;
      int prev;
      int next;
    };
    std::vector<Symbol> syms;
    for (size_t pos = 0; pos < text.size();) {
      const size_t len = std::min(lead_length(static_cast<uint8_t>(text[pos])), text.size() - pos);
      const int index = static_cast<int>(syms.size());
      syms.push_back({pos, len, index - 1, index + 1});
      pos += len;
    }
    if (syms.empty()) return;
    syms.back().next = -1;

    struct Candidate {
      float score;
      int left;
      int right;
      size_t size;
      bool operator<(const Candidate& o) const {  // max-heap: best score, then leftmost
        return score != o.score ? score < o.score : left > o.left;
      }
    };
    std::priority_queue<Candidate> queue;
    auto consider = [&](int left, int right) {
      if (left < 0 || right < 0) return;
      const Symbol& a = syms[static_cast<size_t>(left)];
      const Symbol& b = syms[static_cast<size_t>(right)];
      const TokenId id = find(std::string_view(text).substr(a.begin, a.len + b.len));
      if (id < 0) return;
      queue.push({scores_[static_cast<size_t>(id)], left, right, a.len + b.len});
    };
    for (size_t i = 1; i < syms.size(); ++i) consider(static_cast<int>(i - 1), static_cast<int>(i));

    while (!queue.empty()) {
      const Candidate c = queue.top();
      queue.pop();
      Symbol& left = syms[static_cast<size_t>(c.left)];
      Symbol& right = syms[static_cast<size_t>(c.right)];
      if (left.len == 0 || right.len == 0 || left.len + right.len != c.size) continue;  // stale
      left.len += right.len;
      right.len = 0;
      left.next = right.next;
      if (right.next >= 0) syms[static_cast<size_t>(right.next)].prev = c.left;
      consider(left.prev, c.left);
      consider(c.left, left.next);
    }

    for (int i = 0; i >= 0; i = syms[static_cast<size_t>(i)].next) {
      const Symbol& s = syms[static_cast<size_t>(i)];
      const std::string_view piece = std::string_view(text).substr(s.begin, s.len);
      if (TokenId id = find(piece); id >= 0) {
        out.push_back(id);
        continue;
      }
      // Merged symbols are always tokens, so this is one character the vocabulary lacks.
      for (char c : piece) {
        const TokenId id = byte_tokens_[static_cast<uint8_t>(c)];
        if (id < 0) {
          throw std::runtime_error("tokenizer: no byte token <0x..> and no unknown token for byte fallback");
        }
        out.push_back(id);
      }
    }
  }

  std::string decode_piece(TokenId id) const override {
    const std::string& text = tokens_[static_cast<size_t>(id)];
    if (type_of(id) == TokenType::Byte) {
      // "<0xXX>"
      if (text.size() == 6 && text.compare(0, 3, "<0x") == 0) {
        return std::string(1, static_cast<char>(std::stoi(text.substr(3, 2), nullptr, 16)));
      }
      return text;
    }
    std::string out;
    for (size_t pos = 0; pos < text.size();) {
      if (text.compare(pos, kSpaceMark.size(), kSpaceMark) == 0) {
        out.push_back(' ');
        pos += kSpaceMark.size();
      } else {
        out.push_back(text[pos++]);
      }
    }
    return out;
  }

 private:
  std::vector<float> scores_;
  TokenId byte_tokens_[256] = {};
};

}  // namespace

std::unique_ptr<Tokenizer> make_spm_tokenizer(TokenizerVocab&& v) {
  // SentencePiece defaults (llama.cpp): BOS 1, EOS 2, UNK 0 when the file names none;
  // add BOS, no EOS, prefix a space.
  const size_t n = v.tokens.size();
  if (v.bos < 0 && n > 1) v.bos = 1;
  if (v.eos < 0 && n > 2) v.eos = 2;
  if (v.unk < 0 && n > 0) v.unk = 0;
  const bool add_bos = v.add_bos.value_or(true);
  const bool add_eos = v.add_eos.value_or(false);
  const bool add_space_prefix = v.add_space_prefix.value_or(true);
  std::vector<float> scores = std::move(v.scores);
  auto tok = std::make_unique<SpmTokenizer>(std::move(v));
  tok->init(std::move(scores));
  tok->set_flags(add_bos, add_eos, add_space_prefix);
  return tok;
}

}  // namespace cf::detail
