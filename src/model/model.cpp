#include "model/model.h"

#include <xxhash.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <optional>
#include <stdexcept>

#include "base/thread_pool.h"

namespace cf {
namespace {

std::runtime_error model_error(const GgufFile& f, const std::string& what) {
  return std::runtime_error(f.path() + ": " + what);
}

// A 1-D tensor (norm weight, bias) as floats, checked against the expected length.
std::vector<float> load_vector(const GgufFile& f, const std::string& name, size_t expect) {
  const GgufTensor& t = f.tensor(name);
  if (t.n_elements != expect)
    throw model_error(f, "tensor '" + name + "' has " + std::to_string(t.n_elements) +
                             " elements, expected " + std::to_string(expect));
  std::vector<float> v(expect);
  dequantize_row(t.type, t.data, v.data(), expect);
  return v;
}

WeightMatrix load_matrix(const GgufFile& f, const std::string& name, size_t rows, size_t cols) {
  const GgufTensor& t = f.tensor(name);
  if (t.dims.size() != 2 || t.dims[0] != cols || t.dims[1] != rows)
    throw model_error(f, "tensor '" + name + "' has an unexpected shape (expected " + std::to_string(cols) +
                             " x " + std::to_string(rows) + ")");
  if (!ggml_type_info(t.type).supported)
    throw model_error(f, "tensor '" + name + "' has unsupported type " + std::string(ggml_type_name(t.type)));
  return WeightMatrix(t.type, t.data, rows, cols);
}

LayerWeights load_layer(const GgufFile& f, const ModelHparams& h, int l) {
  const size_t d = h.d_model, qd = h.q_dim(), kvd = h.kv_dim(), ff = h.d_ff;
  const std::string p = "blk." + std::to_string(l) + ".";
  LayerWeights w{
      load_vector(f, p + "attn_norm.weight", d),
      load_matrix(f, p + "attn_q.weight", qd, d),
      load_matrix(f, p + "attn_k.weight", kvd, d),
      load_matrix(f, p + "attn_v.weight", kvd, d),
      load_matrix(f, p + "attn_output.weight", d, qd),
      {}, {}, {}, {}, {},
      load_vector(f, p + "ffn_norm.weight", d),
      load_matrix(f, p + "ffn_gate.weight", ff, d),
      load_matrix(f, p + "ffn_up.weight", ff, d),
      load_matrix(f, p + "ffn_down.weight", d, ff),
  };
  if (h.qkv_bias) {
    w.bq = load_vector(f, p + "attn_q.bias", qd);
    w.bk = load_vector(f, p + "attn_k.bias", kvd);
    w.bv = load_vector(f, p + "attn_v.bias", kvd);
  }
  if (h.qk_norm) {
    w.q_norm = load_vector(f, p + "attn_q_norm.weight", h.head_dim);
    w.k_norm = load_vector(f, p + "attn_k_norm.weight", h.head_dim);
  }
  if (h.post_norms) {
    w.attn_post_norm = load_vector(f, p + "post_attention_norm.weight", d);
    w.ffn_post_norm = load_vector(f, p + "post_ffw_norm.weight", d);
  }
  return w;
}

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& path) {
  std::unique_ptr<Model> m(new Model());
  m->file_ = GgufFile::open(path);
  const GgufFile& f = *m->file_;
  // Hash before the kernels repack (and release) the mapped pages.
  {
    // Names and payloads of all tensors: a changed weight or a renamed tensor is another model.
    XXH3_state_t* st = XXH3_createState();
    XXH3_64bits_reset(st);
    for (const auto& t : f.tensors()) {
      XXH3_64bits_update(st, t.name.data(), t.name.size());
      XXH3_64bits_update(st, t.data, t.n_bytes);
    }
    m->fingerprint_ = XXH3_64bits_digest(st);
    XXH3_freeState(st);
  }

  auto arch_name = f.get_string("general.architecture");
  if (!arch_name) throw model_error(f, "missing 'general.architecture'");
  const ArchDefinition* arch = find_arch(*arch_name);
  if (!arch) {
    std::string list;
    for (auto n : supported_archs()) list += (list.empty() ? "" : ", ") + std::string(n);
    throw model_error(f, "unsupported architecture '" + std::string(*arch_name) + "' (supported: " + list + ")");
  }
  m->hparams_ = read_hparams(f, *arch);
  // Llama 3.x files carry their RoPE scaling as this tensor (the converter bakes
  // rope_scaling {factor, low/high_freq_factor, original context} into per-pair divisors).
  if (f.find_tensor("rope_freqs.weight")) {
    m->hparams_.rope_freq_factors = load_vector(f, "rope_freqs.weight", m->hparams_.rope_dims / 2);
    for (float v : m->hparams_.rope_freq_factors)
      if (!(v > 0) || !std::isfinite(v)) throw model_error(f, "rope_freqs.weight holds a non-positive or non-finite factor");
  }
  const ModelHparams& h = m->hparams_;
  m->tokenizer_ = Tokenizer::from_gguf(f);
  if (static_cast<int>(m->tokenizer_->vocab_size()) != h.vocab_size)
    throw model_error(f, "tokenizer has " + std::to_string(m->tokenizer_->vocab_size()) +
                             " tokens but the model's vocabulary size is " + std::to_string(h.vocab_size));
  m->chat_template_ = ChatTemplate::from_gguf(f);

  m->output_norm_ = load_vector(f, "output_norm.weight", h.d_model);
  // The matrices are repacked in parallel (the largest first, the layers after it, handed
  // out one at a time): repacking is most of a load, and each matrix is independent.
  const int n_jobs = h.n_layers + 2;  // 0: token embedding, 1: output, 2..: layers
  std::vector<std::optional<LayerWeights>> layers(h.n_layers);
  std::vector<std::exception_ptr> errors(n_jobs);
  ThreadPool pool(0);
  pool.parallel_for(n_jobs, [&](size_t job, size_t) {
    try {
      if (job == 0) {
        m->token_embd_.emplace(load_matrix(f, "token_embd.weight", h.vocab_size, h.d_model));
      } else if (job == 1) {
        if (f.find_tensor("output.weight")) m->output_.emplace(load_matrix(f, "output.weight", h.vocab_size, h.d_model));
      } else {
        layers[job - 2].emplace(load_layer(f, h, static_cast<int>(job - 2)));
      }
    } catch (...) {
      errors[job] = std::current_exception();
    }
  });
  // The first failure in load order (embedding, output, layers), whichever thread met it first.
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  m->layers_.reserve(h.n_layers);
  for (auto& w : layers) m->layers_.push_back(std::move(*w));
  return m;
}

std::string Model::fingerprint_hex() const {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(fingerprint_));
  return buf;
}

}  // namespace cf
