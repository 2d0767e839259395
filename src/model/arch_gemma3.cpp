// Gemma 3 (general.architecture = "gemma3"; Gemma 3 270M / 1B / 4B / 12B / 27B text
// models). The block, as llama.cpp's llm_build_gemma3_iswa runs it:
//   x = embed(token) * sqrt(d_model)
//   per layer: a = attn(qk_norm(rope(...)), window of the layer); x += post_attn_norm(a)
//              f = down(gelu_tanh(gate(n)) * up(n)), n = ffn_norm(x); x += post_ffw_norm(f)
//   logits = tied_embedding(out_norm(x)), soft-capped when the file says so.
// Facts read from the file (what is not in it follows llama.cpp, as noted):
//  - RMSNorm weights are used as stored: llama.cpp's HF->GGUF converter already adds the 1
//    of Gemma's (1 + w) convention, so the file holds the multiplier itself.
//  - attention.sliding_window (512 for 270M): local layers see the last `window` positions.
//  - Which layers are local: attention.sliding_window_pattern when present (a per-layer bool
//    array, or a period n whose last layer is global); absent, llama.cpp's gemma3 default
//    period 6: layer l is local iff l % 6 < 5 (so 5, 11, 17 are global in 270M).
//  - RoPE bases: rope.freq_base on global layers, rope.freq_base_swa on local layers
//    (absent: 10000, llama.cpp's default). NeoX pairing.
//  - Attention scale 1/sqrt(key_length), except the 62-layer (27B) model which uses
//    1/sqrt(d_model / n_heads): Gemma's query_pre_attn_scalar is not in GGUF, llama.cpp
//    derives it this way.
//  - final_logit_softcapping when present (Gemma 3 files normally have none).
// Unsupported: RoPE scaling on any layer (rope.scaling.type other than none/linear with
// factor 1), partial RoPE, and separate value head size; each gives one error naming it.
#include <cmath>
#include <stdexcept>
#include <string>

#include "model/arch.h"
#include "model/gguf.h"

namespace cf {
namespace {

void read_gemma3(const GgufFile& f, ModelHparams& h) {
  const std::string p = "gemma3.";
  auto bad = [&](const std::string& what) { throw std::runtime_error(f.path() + ": gemma3: " + what); };

  if (auto vl = f.get_int(p + "attention.value_length"); vl && *vl != h.head_dim)
    bad("attention.value_length (" + std::to_string(*vl) + ") != key_length (" + std::to_string(h.head_dim) +
        ") is not supported");
  if (auto type = f.get_string(p + "rope.scaling.type"); type && *type != "none" && *type != "linear")
    bad("rope.scaling.type '" + std::string(*type) + "' is not supported");
  if (auto factor = f.get_float(p + "rope.scaling.factor"); factor && *factor != 0.0 && *factor != 1.0)
    bad("rope.scaling.factor " + std::to_string(*factor) + " (RoPE scaling) is not supported");

  h.post_norms = true;
  h.embed_scale = std::sqrt(static_cast<float>(h.d_model));
  h.attn_scale = h.n_layers == 62 ? 1.0f / std::sqrt(static_cast<float>(h.d_model / h.n_heads))
                                  : 1.0f / std::sqrt(static_cast<float>(h.head_dim));
  if (auto cap = f.get_float(p + "final_logit_softcapping")) {
    if (!(*cap >= 0.0) || !std::isfinite(*cap)) bad("final_logit_softcapping must be a non-negative number");
    h.final_logit_softcap = static_cast<float>(*cap);
  }

  const auto window = f.get_int(p + "attention.sliding_window");
  if (!window || *window == 0) return;  // no sliding window: every layer global (llama.cpp does the same)
  if (*window < 0 || *window > (1 << 24)) bad("attention.sliding_window out of range: " + std::to_string(*window));
  h.sliding_window = static_cast<int>(*window);
  h.rope_base_local = static_cast<float>(f.get_float(p + "rope.freq_base_swa").value_or(10000.0));
  if (!(h.rope_base_local > 0)) bad("non-positive rope.freq_base_swa");

  h.layer_is_local.assign(static_cast<size_t>(h.n_layers), 0);
  const std::string pattern_key = p + "attention.sliding_window_pattern";
  const GgufValue* pattern = f.find(pattern_key);
  if (pattern && pattern->type == GgufValueType::ARRAY) {
    if (pattern->array->elem_type != GgufValueType::BOOL || pattern->array->items.size() != h.layer_is_local.size())
      bad(pattern_key + " must be an array of " + std::to_string(h.n_layers) + " booleans");
    for (size_t l = 0; l < h.layer_is_local.size(); ++l)
      if (const bool* b = std::get_if<bool>(&pattern->array->items[l])) h.layer_is_local[l] = *b ? 1 : 0;
    return;
  }
  int period = 6;  // llama.cpp's gemma3 default
  if (pattern) {
    const auto n = f.get_int(pattern_key);
    if (!n || *n < 0 || *n > h.n_layers) bad(pattern_key + " out of range");
    period = static_cast<int>(*n);
  }
  // llama.cpp's set_swa_pattern: period 0 means all layers local; otherwise the last of each
  // period is global.
  for (int l = 0; l < h.n_layers; ++l) h.layer_is_local[static_cast<size_t>(l)] = period == 0 || l % period < period - 1;
}

}  // namespace

extern const ArchDefinition kArchGemma3{"gemma3", RopeStyle::Neox, FfnActivation::GeLU, false, true, read_gemma3};

}  // namespace cf
