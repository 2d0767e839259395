// Reading `tokenizer.ggml.*` metadata from a GGUF file.
#include <cstdint>
#include <stdexcept>

#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/tokenizer_vocab.h"

namespace cf {

namespace {

std::vector<std::string> string_array(const GgufFile& file, std::string_view key) {
  std::vector<std::string> out;
  for (std::string_view s : file.get_string_array(key)) out.emplace_back(s);
  return out;
}

TokenId optional_id(const GgufFile& file, std::string_view key) {
  const auto v = file.get_int(key);
  if (!v) return -1;
  if (*v < 0 || *v > INT32_MAX) {
    throw std::runtime_error("tokenizer: " + std::string(key) + " = " + std::to_string(*v) + " is not a token id");
  }
  return static_cast<TokenId>(*v);
}

}  // namespace

TokenizerVocab read_tokenizer_vocab(const GgufFile& file) {
  auto fail = [&](const std::string& what) {
    return std::runtime_error("tokenizer: " + file.path() + ": " + what);
  };
  TokenizerVocab v;
  const auto model = file.get_string("tokenizer.ggml.model");
  if (!model) throw fail("missing tokenizer.ggml.model");
  v.model = std::string(*model);
  if (!file.find("tokenizer.ggml.tokens")) throw fail("missing tokenizer.ggml.tokens (the vocabulary)");
  v.tokens = string_array(file, "tokenizer.ggml.tokens");
  if (file.find("tokenizer.ggml.token_type")) {
    for (int64_t t : file.get_int_array("tokenizer.ggml.token_type")) v.token_types.push_back(static_cast<int32_t>(t));
  }
  if (file.find("tokenizer.ggml.scores")) {
    for (double s : file.get_float_array("tokenizer.ggml.scores")) v.scores.push_back(static_cast<float>(s));
  }
  if (file.find("tokenizer.ggml.merges")) {
    v.merges = string_array(file, "tokenizer.ggml.merges");
  } else if (v.model == "gpt2") {
    throw fail("missing tokenizer.ggml.merges (required for a gpt2 BPE vocabulary)");
  }
  if (auto pre = file.get_string("tokenizer.ggml.pre")) v.pre = std::string(*pre);
  v.bos = optional_id(file, "tokenizer.ggml.bos_token_id");
  v.eos = optional_id(file, "tokenizer.ggml.eos_token_id");
  v.unk = optional_id(file, "tokenizer.ggml.unknown_token_id");
  v.pad = optional_id(file, "tokenizer.ggml.padding_token_id");
  v.eot = optional_id(file, "tokenizer.ggml.eot_token_id");
  v.eom = optional_id(file, "tokenizer.ggml.eom_token_id");
  v.add_bos = file.get_bool("tokenizer.ggml.add_bos_token");
  v.add_eos = file.get_bool("tokenizer.ggml.add_eos_token");
  v.add_space_prefix = file.get_bool("tokenizer.ggml.add_space_prefix");
  return v;
}

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& file) {
  try {
    return make_tokenizer(read_tokenizer_vocab(file));
  } catch (const GgufError&) {
    throw;
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    if (msg.find(file.path()) != std::string::npos) throw;
    throw std::runtime_error(msg + " (in " + file.path() + ")");
  }
}

}  // namespace cf
