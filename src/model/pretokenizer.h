// Pre-tokenizers of byte-level BPE models: split text into words before BPE merges run,
// following the regex sequence llama.cpp applies for each `tokenizer.ggml.pre` value.
// Each pattern is a hand-written matcher over code points with the same leftmost-first
// alternation semantics as the regex it stands for.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace cf {

enum class PreTokenizer {
  Default,    // llama.cpp's fallback: punctuation runs, GPT-2 pattern, numbers, 3-digit groups
  Gpt2,       // the GPT-2 pattern alone
  StarCoder,  // digits one by one, then the GPT-2 pattern (smollm, starcoder, refact, ...)
  Llama3,     // Llama 3 pattern (numbers in groups of up to three)
  Qwen2,      // Llama 3 pattern with single digits
};

struct PreTokenizerInfo {
  PreTokenizer kind;
  bool ignore_merges;  // whole words found in the vocab skip BPE (Llama 3)
  bool known;          // false: the name was not recognised and Default is used
};
PreTokenizerInfo pre_tokenizer_from_name(std::string_view name);

// Splits `text` (UTF-8; malformed bytes become U+FFFD) into words, returned as UTF-8.
std::vector<std::string> pre_tokenize(PreTokenizer kind, std::string_view text);

}  // namespace cf
