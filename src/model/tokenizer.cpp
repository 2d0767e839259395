#include <algorithm>
#include <stdexcept>

#include "model/tokenizer.h"
#include "model/tokenizer_common.h"

namespace cf {

std::string Tokenizer::decode(const std::vector<TokenId>& ids, bool render_special) const {
  std::string out;
  for (TokenId id : ids) out += token_to_piece(id, render_special);
  return out;
}

std::unique_ptr<Tokenizer> make_tokenizer(TokenizerVocab vocab) {
  if (vocab.model == "gpt2") return detail::make_bpe_tokenizer(std::move(vocab));
  if (vocab.model == "llama") return detail::make_spm_tokenizer(std::move(vocab));
  throw std::runtime_error("tokenizer: unsupported tokenizer.ggml.model '" + vocab.model +
                           "' (supported: gpt2, llama)");
}

namespace detail {

namespace {

// Texts llama.cpp treats as ending generation when the vocabulary has them.
constexpr std::string_view kEndOfGenerationTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>",
};

}  // namespace

VocabTokenizer::VocabTokenizer(TokenizerVocab&& v) : model_(std::move(v.model)), pre_(std::move(v.pre)) {
  if (v.tokens.empty()) throw std::runtime_error("tokenizer: the vocabulary (tokenizer.ggml.tokens) is empty");
  const size_t n = v.tokens.size();
  if (!v.token_types.empty() && v.token_types.size() != n) {
    throw std::runtime_error("tokenizer: tokenizer.ggml.token_type has " +
                             std::to_string(v.token_types.size()) + " entries for " +
                             std::to_string(n) + " tokens");
  }
  tokens_ = std::move(v.tokens);
  types_.resize(n, TokenType::Normal);
  for (size_t i = 0; i < n; ++i) {
    // An empty entry could never be matched; llama.cpp gives it a placeholder text.
    if (tokens_[i].empty()) tokens_[i] = "[EMPTY_" + std::to_string(i) + "]";
    if (!v.token_types.empty()) {
      const int32_t t = v.token_types[i];
      types_[i] = (t >= 0 && t <= 6) ? static_cast<TokenType>(t) : TokenType::Undefined;
    }
  }
  // Duplicate texts: the last id wins, as in llama.cpp.
  text_to_id_.reserve(n);
  for (size_t i = 0; i < n; ++i) text_to_id_[tokens_[i]] = static_cast<TokenId>(i);

  auto checked = [&](TokenId id, const char* what) -> TokenId {
    if (id < 0) return -1;
    if (static_cast<size_t>(id) >= n) {
      throw std::runtime_error(std::string("tokenizer: ") + what + " id " + std::to_string(id) +
                               " is outside the vocabulary of " + std::to_string(n) + " tokens");
    }
    return id;
  };
  bos_ = checked(v.bos, "bos");
  eos_ = checked(v.eos, "eos");
  unk_ = checked(v.unk, "unknown");
  eot_ = checked(v.eot, "eot");
  eom_ = checked(v.eom, "eom");
  checked(v.pad, "padding");

  for (std::string_view t : kEndOfGenerationTexts) {
    if (TokenId id = find(t); id >= 0) {
      eog_.insert(id);
      types_[static_cast<size_t>(id)] = TokenType::Control;  // llama.cpp forces these to control
    }
  }
  for (TokenId id : {eos_, eot_, eom_}) {
    if (id >= 0) eog_.insert(id);
  }
}

void VocabTokenizer::finish_setup() {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const TokenType t = types_[i];
    if (t == TokenType::Control || t == TokenType::UserDefined || t == TokenType::Unknown) {
      specials_.push_back(static_cast<TokenId>(i));
      has_user_defined_ |= (t == TokenType::UserDefined);
    }
  }
  // Longest text first, so that a special token containing another wins.
  std::stable_sort(specials_.begin(), specials_.end(), [&](TokenId a, TokenId b) {
    return tokens_[static_cast<size_t>(a)].size() > tokens_[static_cast<size_t>(b)].size();
  });
  pieces_.resize(tokens_.size());
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const TokenType t = types_[i];
    const auto id = static_cast<TokenId>(i);
    if (t == TokenType::Control || t == TokenType::Unknown || t == TokenType::UserDefined) {
      pieces_[i] = tokens_[i];
    } else if (t == TokenType::Normal || t == TokenType::Byte) {
      pieces_[i] = decode_piece(id);
    }  // unused/undefined tokens render as nothing
  }
}

TokenId VocabTokenizer::find(std::string_view text) const {
  auto it = text_to_id_.find(text);
  return it == text_to_id_.end() ? -1 : it->second;
}

bool VocabTokenizer::is_special(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= types_.size()) return false;
  return type_of(id) == TokenType::Control || type_of(id) == TokenType::UserDefined;
}

std::string_view VocabTokenizer::token_text(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= tokens_.size()) {
    throw std::out_of_range("tokenizer: token id " + std::to_string(id) + " out of range");
  }
  return tokens_[static_cast<size_t>(id)];
}

std::string VocabTokenizer::token_to_piece(TokenId id, bool render_special) const {
  if (id < 0 || static_cast<size_t>(id) >= tokens_.size()) {
    throw std::out_of_range("tokenizer: token id " + std::to_string(id) + " out of range");
  }
  const TokenType t = type_of(id);
  if (!render_special && (t == TokenType::Control || t == TokenType::Unknown)) return {};
  return pieces_[static_cast<size_t>(id)];
}

// Cuts special-token text out of the input, one special token at a time, longest first
// (llama.cpp's order). User-defined tokens are cut even without parse_special.
std::vector<Fragment> VocabTokenizer::split_special(std::string_view text, bool parse_special) const {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back({text, -1});
  if (!parse_special && !has_user_defined_) return frags;
  std::vector<Fragment> next;
  for (TokenId id : specials_) {
    const TokenType t = type_of(id);
    if (!parse_special && t != TokenType::UserDefined) continue;
    const std::string& special = tokens_[static_cast<size_t>(id)];
    bool any = false;
    for (const Fragment& f : frags) {
      if (f.token < 0 && f.text.find(special) != std::string_view::npos) {
        any = true;
        break;
      }
    }
    if (!any) continue;
    next.clear();
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      std::string_view rest = f.text;
      for (size_t at; (at = rest.find(special)) != std::string_view::npos;) {
        if (at > 0) next.push_back({rest.substr(0, at), -1});
        next.push_back({{}, id});
        rest.remove_prefix(at + special.size());
      }
      if (!rest.empty()) next.push_back({rest, -1});
    }
    frags.swap(next);
  }
  return frags;
}

std::vector<TokenId> VocabTokenizer::encode(std::string_view text, bool add_special,
                                            bool parse_special) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special && add_bos_ && bos_ >= 0) out.push_back(bos_);
  bool first_after_special = true;
  for (const Fragment& f : split_special(text, parse_special)) {
    if (f.token >= 0) {
      out.push_back(f.token);
      first_after_special = true;
    } else {
      encode_text(f.text, first_after_special, out);
      first_after_special = false;
    }
  }
  if (add_special && add_eos_ && eos_ >= 0) out.push_back(eos_);
  return out;
}

}  // namespace detail
}  // namespace cf
