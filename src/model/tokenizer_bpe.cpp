// Byte-level BPE (tokenizer.ggml.model = "gpt2"): text is split by the pre-tokenizer,
// each word's bytes are mapped to GPT-2's printable alphabet, then adjacent symbols are
// merged by merge rank (lowest rank first, leftmost on ties) until no merge applies.
#include <algorithm>
#include <cstdio>
#include <mutex>
#include <queue>
#include <shared_mutex>
#include <stdexcept>
#include <unordered_map>

#include "model/pretokenizer.h"
#include "model/tokenizer_common.h"
#include "model/unicode.h"

namespace cf::detail {

namespace {

struct Merge {
  int32_t rank;
  TokenId result;  // -1 when the merged text is not itself a token
};

uint64_t pair_key(TokenId left, TokenId right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

class BpeTokenizer final : public VocabTokenizer {
 public:
  explicit BpeTokenizer(TokenizerVocab&& v) : VocabTokenizer(std::move(v)) {}

  void init(const std::vector<std::string>& merges, std::string_view pre_name) {
    const PreTokenizerInfo info = pre_tokenizer_from_name(pre_name);
    if (!info.known) {
      // Documented choice: an unknown pre-tokenizer falls back to llama.cpp's default
      // pattern (llama.cpp itself refuses such files); ids may then differ from the
      // model's training tokenizer, so say so once.
      static std::once_flag warned;
      std::call_once(warned, [&] {
        std::fprintf(stderr, "chunkfuse: warning: unknown tokenizer.ggml.pre '%.*s', using the default pre-tokenizer\n",
                     static_cast<int>(pre_name.size()), pre_name.data());
      });
    }
    pre_kind_ = info.kind;
    ignore_merges_ = info.ignore_merges;

    merges_.reserve(merges.size());
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      const std::string& m = merges[rank];
      // "left right"; the separator is the first space after the first character, so a
      // left side may itself be a space.
      const size_t sep = m.find(' ', 1);
      if (sep == std::string::npos) {
        throw std::runtime_error("tokenizer: merge #" + std::to_string(rank) + " '" + m +
                                 "' has no space separating its two parts");
      }
      const std::string_view left(m.data(), sep);
      const std::string_view right(m.data() + sep + 1, m.size() - sep - 1);
      const TokenId l = find(left);
      const TokenId r = find(right);
      if (l < 0 || r < 0) {
        throw std::runtime_error("tokenizer: merge #" + std::to_string(rank) + " '" + m +
                                 "' references '" + std::string(l < 0 ? left : right) +
                                 "', which is not in the vocabulary");
      }
      const TokenId result = find(std::string(left) + std::string(right));
      // A pair listed twice keeps its first (best) rank.
      merges_.try_emplace(pair_key(l, r), Merge{static_cast<int32_t>(rank), result});
    }
    finish_setup();
  }

 protected:
  void encode_text(std::string_view text, bool, std::vector<TokenId>& out) const override {
    for (const std::string& word : pre_tokenize(pre_kind_, text)) {
      const std::string encoded = unicode::bytes_to_bpe_text(word);
      {
        std::shared_lock lock(cache_mutex_);
        if (auto it = cache_.find(encoded); it != cache_.end()) {
          out.insert(out.end(), it->second.begin(), it->second.end());
          continue;
        }
      }
      std::vector<TokenId> ids;
      encode_word(encoded, ids);
      out.insert(out.end(), ids.begin(), ids.end());
      // Bounded in entries and in bytes (issue 59: 2 MB random "words" kept 425 MB after the
      // requests that sent them were refused): a word longer than kMaxCachedWordBytes is not
      // kept, and the cache starts over when either bound would be passed.
      if (encoded.size() > kMaxCachedWordBytes) continue;
      const size_t bytes = entry_bytes(encoded, ids);
      std::unique_lock lock(cache_mutex_);
      if (cache_.size() >= kMaxCacheEntries || cache_bytes_ + bytes > kMaxCacheBytes) {
        cache_.clear();
        cache_bytes_ = 0;
      }
      if (cache_.emplace(encoded, std::move(ids)).second) cache_bytes_ += bytes;
    }
  }

  std::string decode_piece(TokenId id) const override {
    std::string bytes;
    for (uint32_t cp : unicode::decode_utf8(tokens_[static_cast<size_t>(id)])) {
      const int b = unicode::codepoint_to_byte(cp);
      if (b >= 0) {
        bytes.push_back(static_cast<char>(b));
      } else {
        unicode::append_utf8(bytes, cp);  // not in the byte alphabet: keep the character
      }
    }
    return bytes;
  }

 private:
  static constexpr size_t kMaxCacheEntries = 1 << 16;
  static constexpr size_t kMaxCachedWordBytes = 256;     // longer words are encoded, not kept
  static constexpr size_t kMaxCacheBytes = 16u << 20;    // keys, ids and node overhead together
  // What one entry costs: its key, its ids, and the hash node and allocation headers.
  static size_t entry_bytes(const std::string& key, const std::vector<TokenId>& ids) {
    return key.size() + ids.size() * sizeof(TokenId) + 96;
  }

 public:
  size_t word_cache_bytes() const override {
    std::shared_lock lock(cache_mutex_);
    return cache_bytes_;
  }

 private:

  struct Symbol {
    uint32_t begin;
    uint32_t len;
    TokenId id;  // -1 when the text is not a token
    int prev;
    int next;
  };
  struct Candidate {
    int32_t rank;
    int left;
    uint32_t left_len;
    uint32_t right_len;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };

  void encode_word(const std::string& word, std::vector<TokenId>& out) const {
    if (ignore_merges_) {
      if (TokenId id = find(word); id >= 0) {
        out.push_back(id);
        return;
      }
    }
    std::vector<Symbol> syms;
    syms.reserve(word.size());
    for (size_t pos = 0; pos < word.size();) {
      const size_t len = std::min(unicode::utf8_sequence_length(static_cast<uint8_t>(word[pos])),
                                  word.size() - pos);
      const int index = static_cast<int>(syms.size());
      syms.push_back({static_cast<uint32_t>(pos), static_cast<uint32_t>(len),
                      find(std::string_view(word).substr(pos, len)), index - 1, index + 1});
      pos += len;
    }
    if (syms.empty()) return;
    syms.back().next = -1;

    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
    auto consider = [&](int left, int right) {
      if (left < 0 || right < 0) return;
      const Symbol& a = syms[static_cast<size_t>(left)];
      const Symbol& b = syms[static_cast<size_t>(right)];
      if (a.id < 0 || b.id < 0) return;
      auto it = merges_.find(pair_key(a.id, b.id));
      if (it == merges_.end()) return;
      queue.push({it->second.rank, left, a.len, b.len});
    };
    for (size_t i = 1; i < syms.size(); ++i) consider(static_cast<int>(i - 1), static_cast<int>(i));

    while (!queue.empty()) {
      const Candidate c = queue.top();
      queue.pop();
      Symbol& left = syms[static_cast<size_t>(c.left)];
      if (left.len != c.left_len || left.next < 0) continue;  // stale: the left one grew or died
      Symbol& right = syms[static_cast<size_t>(left.next)];
      if (right.len != c.right_len) continue;
      // Sizes unchanged means both symbols still hold the texts the candidate was made from.
      left.id = merges_.at(pair_key(left.id, right.id)).result;
      left.len += right.len;
      right.len = 0;
      left.next = right.next;
      if (right.next >= 0) syms[static_cast<size_t>(right.next)].prev = c.left;
      consider(left.prev, c.left);
      consider(c.left, left.next);
    }

    for (int i = 0; i >= 0; i = syms[static_cast<size_t>(i)].next) {
      const Symbol& s = syms[static_cast<size_t>(i)];
      if (s.id >= 0) {
        out.push_back(s.id);
        continue;
      }
      // Not a token: fall back to single-byte entries where the vocabulary has them.
      for (size_t k = 0; k < s.len; ++k) {
        if (TokenId id = find(std::string_view(word).substr(s.begin + k, 1)); id >= 0) out.push_back(id);
      }
    }
  }

  PreTokenizer pre_kind_ = PreTokenizer::Default;
  bool ignore_merges_ = false;
  std::unordered_map<uint64_t, Merge> merges_;
  mutable std::shared_mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<TokenId>> cache_;
  mutable size_t cache_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(TokenizerVocab&& v) {
  if (v.merges.empty()) {
    throw std::runtime_error("tokenizer: gpt2 (BPE) vocabulary has no merges (tokenizer.ggml.merges)");
  }
  const PreTokenizerInfo info = pre_tokenizer_from_name(v.pre);
  // Llama 3 style vocabularies add BOS unless the file says otherwise (llama.cpp).
  const bool add_bos = v.add_bos.value_or(info.kind == PreTokenizer::Llama3 && info.ignore_merges);
  const bool add_eos = v.add_eos.value_or(false);
  std::vector<std::string> merges = std::move(v.merges);
  std::string pre = v.pre;
  auto tok = std::make_unique<BpeTokenizer>(std::move(v));
  tok->init(merges, pre);
  tok->set_flags(add_bos, add_eos, false);
  return tok;
}

}  // namespace cf::detail
