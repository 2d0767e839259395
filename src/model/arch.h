// Architecture definitions: how a GGUF file's hyperparameters and tensor names map onto
// the one transformer block the runtime executes. An architecture is one file
// (arch_<name>.cpp) defining an ArchDefinition, listed once in arch_registry.cpp.
#pragma once
#include <cstdint>
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

  // Gemma 3 style interleaved sliding-window attention (all off for the other archs).
  // A local layer's token sees only keys at positions p with q_pos - window < p <= q_pos
  // (llama.cpp's LLAMA_SWA_TYPE_STANDARD); a global layer sees all earlier positions.
  int sliding_window = 0;                 // 0: every layer is global
  std::vector<uint8_t> layer_is_local;    // [n_layers]; empty: none local
  float rope_base_local = 10000.f;        // RoPE base of the local layers
  float attn_scale = 0.f;                 // Q.K scale; 0: 1/sqrt(head_dim)
  float embed_scale = 1.f;                // token embeddings are multiplied by this (gemma: sqrt(d_model))
  bool post_norms = false;                // RMSNorm on the attention and FFN outputs before each residual add
  float final_logit_softcap = 0.f;        // > 0: logits = cap * tanh(logits / cap)

  int q_dim() const { return n_heads * head_dim; }
  int kv_dim() const { return n_kv_heads * head_dim; }
  bool is_local(int layer) const { return !layer_is_local.empty() && layer_is_local[static_cast<size_t>(layer)]; }
  // Attention window of a layer in positions (0: unlimited).
  int window_of(int layer) const { return is_local(layer) ? sliding_window : 0; }
  float rope_base_of(int layer) const { return is_local(layer) ? rope_base_local : rope_base; }
  bool has_local_layers() const { return sliding_window > 0 && !layer_is_local.empty(); }
};

struct ArchDefinition {
  std::string_view name;  // value of general.architecture
  RopeStyle rope_style;
  FfnActivation activation;
  bool qkv_bias;
  bool qk_norm;
  // Reads the architecture's own keys (and rejects combinations it cannot run) after the
  // common ones; nullptr when there are none.
  void (*read_extra)(const GgufFile& file, ModelHparams& h) = nullptr;
};

// nullptr when the architecture is not supported.
const ArchDefinition* find_arch(std::string_view name);
std::vector<std::string_view> supported_archs();
// Reads "<arch>.block_count" etc.; throws std::runtime_error naming a missing/bad key.
ModelHparams read_hparams(const GgufFile& file, const ArchDefinition& arch);

}  // namespace cf
