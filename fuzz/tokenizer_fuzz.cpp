// libFuzzer target for both tokenizers on arbitrary bytes (issue 24): the BPE one (SmolLM2,
// llama pre-tokenizer) and the SentencePiece one (Gemma 3), loaded from the models
// scripts/setup.sh fetches (CHUNKFUSE_FUZZ_BPE_MODEL / CHUNKFUSE_GEMMA3_MODEL override). Any input
// (invalid UTF-8 included) must encode without crashing or looping, every id must be in the
// vocabulary, and decoding must not crash. First byte: add_special / parse_special flags.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/paths.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

namespace {
struct Loaded {
  std::unique_ptr<cf::GgufFile> file;
  std::unique_ptr<cf::Tokenizer> tok;
};
Loaded load(const char* env, const char* name) {
  const char* e = std::getenv(env);
  const std::string path = e && *e ? std::string(e) : cf::cache_root() + "/models/" + name;
  Loaded l;
  l.file = cf::GgufFile::open(path);  // throws (a finding: the fuzz run fails loudly) when missing
  l.tok = cf::Tokenizer::from_gguf(*l.file);
  return l;
}
const std::vector<Loaded>& tokenizers() {
  static const std::vector<Loaded> all = [] {
    std::vector<Loaded> v;
    v.push_back(load("CHUNKFUSE_FUZZ_BPE_MODEL", cf::kTestModelFile));
    v.push_back(load("CHUNKFUSE_GEMMA3_MODEL", "gemma-3-270m-q4_k_m.gguf"));
    return v;
  }();
  return all;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > 4096) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  for (const Loaded& l : tokenizers()) {
    const std::vector<cf::TokenId> ids = l.tok->encode(text, data[0] & 1, data[0] & 2);
    const size_t vocab = l.tok->vocab_size();
    for (cf::TokenId id : ids)
      if (id < 0 || static_cast<size_t>(id) >= vocab) __builtin_trap();
    (void)l.tok->decode(ids, data[0] & 4);
  }
  return 0;
}
