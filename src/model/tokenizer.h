// Tokenizer built from a GGUF file's `tokenizer.ggml.*` metadata:
//  - model "gpt2": byte-level BPE, split first by the pre-tokenizer named in
//    `tokenizer.ggml.pre` (smollm, llama3/llama-bpe, qwen2, gpt2 and others);
//  - model "llama": SentencePiece-style BPE over scores, with byte fallback.
// Special/control tokens (token_type 3/4, e.g. "<|im_start|>") are matched whole in the
// input when `parse_special` is set, otherwise they are treated as plain text.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace cf {

class GgufFile;

using TokenId = int32_t;

class Tokenizer {
 public:
  static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& file);  // throws on bad data
  virtual ~Tokenizer() = default;

  // add_special: prepend BOS / append EOS as the file's add_bos/add_eos flags say
  // (llama.cpp's `add_special`). parse_special: recognise special-token text.
  virtual std::vector<TokenId> encode(std::string_view text, bool add_special,
                                      bool parse_special) const = 0;
  // The bytes a token stands for (special tokens render as their text when
  // `render_special`, else as nothing). Bytes may be a partial UTF-8 sequence.
  virtual std::string token_to_piece(TokenId id, bool render_special = true) const = 0;
  std::string decode(const std::vector<TokenId>& ids, bool render_special = true) const;

  virtual size_t vocab_size() const = 0;
  virtual TokenId bos() const = 0;  // -1 when none
  virtual TokenId eos() const = 0;
  // End of generation: EOS, EOT, <|im_end|> and the like.
  virtual bool is_end_of_generation(TokenId id) const = 0;
  virtual bool is_special(TokenId id) const = 0;  // control or user-defined special token
  virtual std::string_view token_text(TokenId id) const = 0;  // raw vocab entry
  virtual std::string_view model_name() const = 0;  // "gpt2" / "llama"
  virtual std::string_view pre_tokenizer() const = 0;
  // Bytes held by the tokenizer's cache of encoded words (0 without one), bounded whatever
  // the input (issue 59).
  virtual size_t word_cache_bytes() const { return 0; }
};

}  // namespace cf
