#include <stdexcept>
#include <string>

#include "model/arch.h"
#include "model/gguf.h"

namespace cf {

extern const ArchDefinition kArchLlama;
extern const ArchDefinition kArchQwen2;
extern const ArchDefinition kArchQwen3;
extern const ArchDefinition kArchGemma3;

namespace {
const ArchDefinition* const kAll[] = {&kArchLlama, &kArchQwen2, &kArchQwen3, &kArchGemma3};
}

const ArchDefinition* find_arch(std::string_view name) {
  for (auto* a : kAll)
    if (a->name == name) return a;
  return nullptr;
}

std::vector<std::string_view> supported_archs() {
  std::vector<std::string_view> names;
  for (auto* a : kAll) names.push_back(a->name);
  return names;
}

ModelHparams read_hparams(const GgufFile& f, const ArchDefinition& arch) {
  const std::string p = std::string(arch.name) + ".";
  auto need_int = [&](const std::string& key) -> int {
    auto v = f.get_int(p + key);
    if (!v) throw std::runtime_error(f.path() + ": missing metadata key '" + p + key + "'");
    if (*v <= 0 || *v > (1 << 24))
      throw std::runtime_error(f.path() + ": metadata '" + p + key + "' out of range: " + std::to_string(*v));
    return static_cast<int>(*v);
  };
  ModelHparams h;
  h.arch = std::string(arch.name);
  h.n_layers = need_int("block_count");
  h.d_model = need_int("embedding_length");
  h.d_ff = need_int("feed_forward_length");
  h.n_heads = need_int("attention.head_count");
  h.n_kv_heads = f.get_int(p + "attention.head_count_kv") ? need_int("attention.head_count_kv") : h.n_heads;
  h.context_length = f.get_int(p + "context_length") ? need_int("context_length") : 2048;
  h.head_dim = f.get_int(p + "attention.key_length") ? need_int("attention.key_length") : h.d_model / h.n_heads;
  h.rope_dims = f.get_int(p + "rope.dimension_count") ? need_int("rope.dimension_count") : h.head_dim;
  h.rms_eps = static_cast<float>(f.get_float(p + "attention.layer_norm_rms_epsilon").value_or(1e-5));
  h.rope_base = static_cast<float>(f.get_float(p + "rope.freq_base").value_or(10000.0));
  if (auto tokens = f.find("tokenizer.ggml.tokens"); tokens && tokens->array)
    h.vocab_size = static_cast<int>(tokens->array->items.size());
  if (auto v = f.get_int(p + "vocab_size")) h.vocab_size = static_cast<int>(*v);
  h.rope_style = arch.rope_style;
  h.activation = arch.activation;
  h.qkv_bias = arch.qkv_bias;
  h.qk_norm = arch.qk_norm;
  if (arch.read_extra) arch.read_extra(f, h);

  auto bad = [&](const std::string& what) { throw std::runtime_error(f.path() + ": " + what); };
  if (h.n_heads % h.n_kv_heads != 0) bad("head_count is not a multiple of head_count_kv");
  if (h.head_dim % 2 != 0) bad("odd attention head size");
  if (h.rope_dims != h.head_dim) bad("partial RoPE (rope.dimension_count != head size) is not supported");
  if (h.vocab_size <= 0) bad("vocabulary size unknown");
  // Llama 3 scaling comes as the rope_freqs.weight tensor (Model::load); a metadata-declared
  // scaling (linear, YaRN, LongRoPE) would change every angle, so it is refused by name.
  if (auto t = f.get_string(p + "rope.scaling.type"); t && *t != "none")
    bad("RoPE scaling type '" + std::string(*t) + "' (" + p + "rope.scaling.type) is not supported");
  if (h.rms_eps <= 0 || h.rope_base <= 0) bad("non-positive rms epsilon or rope base");
  return h;
}

}  // namespace cf
