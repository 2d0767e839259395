// A loaded model: the mapped GGUF file, its hyperparameters, tokenizer, chat template
// and weights ready for the kernels. Matrices stay in their quantized file types.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/arch.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/kernels.h"
#include "model/tokenizer.h"

namespace cf {

class ThreadPool;

struct LayerWeights {
  std::vector<float> attn_norm;
  WeightMatrix wq, wk, wv, wo;
  std::vector<float> bq, bk, bv;          // empty unless hparams.qkv_bias
  std::vector<float> q_norm, k_norm;      // empty unless hparams.qk_norm ([head_dim])
  std::vector<float> ffn_norm;
  WeightMatrix w_gate, w_up, w_down;
  // Gemma: RMSNorm of the attention output and of the FFN output before each residual add
  // (empty unless hparams.post_norms).
  std::vector<float> attn_post_norm = {}, ffn_post_norm = {};
};

class Model {
 public:
  // Throws std::runtime_error / GgufError with a message naming the file and the problem.
  static std::unique_ptr<Model> load(const std::string& path);

  const GgufFile& file() const { return *file_; }
  const ModelHparams& hparams() const { return hparams_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const ChatTemplate& chat_template() const { return *chat_template_; }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  const WeightMatrix& token_embedding() const { return *token_embd_; }  // [vocab][d_model]
  const WeightMatrix& output() const { return output_ ? *output_ : *token_embd_; }  // tied if absent
  const std::vector<float>& output_norm() const { return output_norm_; }
  // 64-bit content hash of the whole model file: identifies the model in cache keys.
  uint64_t fingerprint() const { return fingerprint_; }
  std::string fingerprint_hex() const;

 private:
  Model() = default;
  std::unique_ptr<GgufFile> file_;
  ModelHparams hparams_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::optional<ChatTemplate> chat_template_;
  std::vector<LayerWeights> layers_;
  std::optional<WeightMatrix> token_embd_;
  std::optional<WeightMatrix> output_;
  std::vector<float> output_norm_;
  uint64_t fingerprint_ = 0;
};

}  // namespace cf
