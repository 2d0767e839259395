// Architecture definitions: how a GGUF file's hyperparameters and tensor names map onto
// the one transformer block the runtime executes. An architecture is one file
// (arch_<name>.cpp) defining an ArchDefinition, listed once in arch_registry.cpp.
#pragma once
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace cf {

class GgufFile;

// How RoPE pairs dimensions: Normal rotates (x[2i], x[2i+1]) (llama.cpp's LLAMA_ROPE_TYPE_NORM,
// the HF->GGUF conversion permutes Q/K rows for it); Neox rotates (x[i], x[i + d/2]).
enum class RopeStyle { Normal, Neox };
enum class FfnActivation { SiLU, GeLU };

struct ModelHparams {
  std::string arch;
  int n_layers = 0;
  int d_model = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int d_ff = 0;
  int vocab_size = 0;
  int context_length = 0;
  float rms_eps = 1e-5f;
  float rope_base = 10000.f;
  int rope_dims = 0;  // rotated dimensions per head (== head_dim for the supported archs)
  RopeStyle rope_style = RopeStyle::Normal;
  FfnActivation activation = FfnActivation::SiLU;
  bool qkv_bias = false;  // qwen2
  bool qk_norm = false;   // qwen3: RMSNorm over each head of Q and K before RoPE
  // Llama 3 RoPE scaling: the file's rope_freqs.weight, one divisor per rotated pair
  // (angle_i = pos * base^(-2i/d) / factor_i, as ggml_rope_ext's freq_factors). Empty: none.
  std::vector<float> rope_freq_factors;

  const float* rope_factors() const { return rope_freq_factors.empty() ? nullptr : rope_freq_factors.data(); }

  int q_dim() const { return n_heads * head_dim; }
  int kv_dim() const { return n_kv_heads * head_dim; }
};

struct ArchDefinition {
  std::string_view name;  // value of general.architecture
  RopeStyle rope_style;
  FfnActivation activation;
  bool qkv_bias;
  bool qk_norm;
};

// nullptr when the architecture is not supported.
const ArchDefinition* find_arch(std::string_view name);
std::vector<std::string_view> supported_archs();
// Reads "<arch>.block_count" etc.; throws std::runtime_error naming a missing/bad key.
ModelHparams read_hparams(const GgufFile& file, const ArchDefinition& arch);

}  // namespace cf
