// The tokenizer's view of a model file's `tokenizer.ggml.*` metadata, and the factory
// that builds a Tokenizer from it. Tokenizer::from_gguf reads the metadata into a
// TokenizerVocab; tests build one directly (synthetic vocabularies, defective data).
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/tokenizer.h"

namespace cf {

// tokenizer.ggml.token_type values.
enum class TokenType : int32_t {
  Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6,
};

struct TokenizerVocab {
  std::string model;                   // "gpt2" (byte-level BPE) or "llama" (SentencePiece)
  std::string pre;                     // pre-tokenizer name (gpt2 only); empty: default
  std::vector<std::string> tokens;
  std::vector<int32_t> token_types;    // empty: all Normal
  std::vector<float> scores;           // llama: merge priority (higher merges first)
  std::vector<std::string> merges;     // gpt2: "left right", earlier = higher priority
  TokenId bos = -1, eos = -1, unk = -1, pad = -1, eot = -1, eom = -1;  // -1: not given
  std::optional<bool> add_bos, add_eos, add_space_prefix;  // unset: the model's default
};

// Throws std::runtime_error naming what is wrong (unknown model, size mismatches, merges
// that reference strings missing from the vocabulary, ...).
std::unique_ptr<Tokenizer> make_tokenizer(TokenizerVocab vocab);

// Reads the metadata; throws std::runtime_error when required keys are missing.
TokenizerVocab read_tokenizer_vocab(const GgufFile& file);

}  // namespace cf
