// Internal: what the BPE and SentencePiece tokenizers share: the vocabulary, special
// token handling (splitting the input at special-token text), end-of-generation ids and
// the piece cache. Not part of the public interface.
#pragma once
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "model/tokenizer_vocab.h"

namespace cf::detail {

// One piece of the input after special tokens are cut out: either raw text or a token.
struct Fragment {
  std::string_view text;  // empty when token >= 0
  TokenId token = -1;
};

class VocabTokenizer : public Tokenizer {
 public:
  explicit VocabTokenizer(TokenizerVocab&& vocab);

  std::vector<TokenId> encode(std::string_view text, bool add_special,
                              bool parse_special) const override;
  std::string token_to_piece(TokenId id, bool render_special = true) const override;
  size_t vocab_size() const override { return tokens_.size(); }
  TokenId bos() const override { return bos_; }
  TokenId eos() const override { return eos_; }
  bool is_end_of_generation(TokenId id) const override { return eog_.count(id) != 0; }
  bool is_special(TokenId id) const override;
  std::string_view token_text(TokenId id) const override;
  std::string_view model_name() const override { return model_; }
  std::string_view pre_tokenizer() const override { return pre_; }

  void set_flags(bool add_bos, bool add_eos, bool add_space_prefix) {
    add_bos_ = add_bos;
    add_eos_ = add_eos;
    add_space_prefix_ = add_space_prefix;
  }

 protected:
  // Call at the end of the derived constructor, once decode_piece() works.
  void finish_setup();
  // Tokenizes one raw-text fragment (special tokens already cut out), appending ids.
  // `first_after_special`: the fragment starts the text or follows a special token.
  virtual void encode_text(std::string_view text, bool first_after_special,
                           std::vector<TokenId>& out) const = 0;
  // The bytes a Normal/Byte token stands for.
  virtual std::string decode_piece(TokenId id) const = 0;

  TokenId find(std::string_view text) const;  // -1 when absent
  TokenType type_of(TokenId id) const { return types_[static_cast<size_t>(id)]; }

  std::string model_;
  std::string pre_;
  std::vector<std::string> tokens_;
  std::vector<TokenType> types_;
  std::unordered_map<std::string_view, TokenId> text_to_id_;
  TokenId bos_ = -1, eos_ = -1, unk_ = -1, eot_ = -1, eom_ = -1;
  bool add_bos_ = false, add_eos_ = false, add_space_prefix_ = false;

 private:
  std::vector<Fragment> split_special(std::string_view text, bool parse_special) const;

  std::vector<TokenId> specials_;        // control/user-defined/unknown, longest text first
  bool has_user_defined_ = false;
  std::unordered_set<TokenId> eog_;
  std::vector<std::string> pieces_;      // token_to_piece(id, true) for every id
};

std::unique_ptr<Tokenizer> make_bpe_tokenizer(TokenizerVocab&& vocab);
std::unique_ptr<Tokenizer> make_spm_tokenizer(TokenizerVocab&& vocab);

}  // namespace cf::detail
