// Llama family (SmolLM2, Llama 2/3, Mistral share the "llama" GGUF architecture) and
// Qwen2, which differs only by biases on the Q/K/V projections and NeoX-style RoPE.
#include "model/arch.h"

namespace cf {
extern const ArchDefinition kArchLlama{"llama", RopeStyle::Normal, FfnActivation::SiLU, false, false};
extern const ArchDefinition kArchQwen2{"qwen2", RopeStyle::Neox, FfnActivation::SiLU, true, false};
// Qwen3: no biases, per-head RMSNorm of Q and K before RoPE.
extern const ArchDefinition kArchQwen3{"qwen3", RopeStyle::Neox, FfnActivation::SiLU, false, true};
}  // namespace cf
