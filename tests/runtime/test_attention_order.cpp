// The attention kernel against a scalar model of llama.cpp's non-flash CPU attention on an
// AVX-512 build, bit for bit, under the portable kernels and for one row alone on
// every ISA: Q rounded to f16; Q.K and P.V as tinyBLAS
// sums them for a batch (16 lanes, fma chains, _mm512_reduce_add_ps's tree) or as
// ggml_vec_dot_f16 does for one token (64 lanes folded to 16, then the tree); the softmax
// of ggml_vec_soft_max_f32 (ggml_v_expf, per-16 sums in double, float of 1/sum); P rounded
// to f16. The model is written from that description, independently of the kernel code.
// Batched rows on AVX-512 take the online-softmax kernel (attention_flash_avx512.cpp), held
// to the numerics contract by tolerance against the same attention in double
// (AttentionContract.*).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <algorithm>
#include <random>
#include <utility>
#include <vector>

#include "base/thread_pool.h"
#include "model/kernels.h"
#include "runtime/attention.h"
#include "runtime/vector_math.h"

namespace cf {
namespace {

float f16(float x) { return fp16_to_fp32(fp32_to_fp16(x)); }

// ggml_v_expf, lane by lane; scalef as ldexp (one rounding).
float ggml_expf(float x) {
  const float r = 0x1.8p23f;
  const float z = std::fma(x, 0x1.715476p+0f, r);
  const float n = z - r;
  const float b = std::fma(-n, 0x1.7f7d1cp-20f, std::fma(-n, 0x1.62e4p-1f, x));
  const float u = b * b;
  const float j = std::fma(std::fma(std::fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                                    std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                           u, std::fma(0x1.ffffecp-1f, b, 1.0f));
  if (std::fabs(n) > 192) return n <= 0 ? 0.0f : std::numeric_limits<float>::infinity();
  return std::ldexp(j, static_cast<int>(n));
}

// _mm512_reduce_add_ps on 16 values.
float tree16(const float* v) {
  float b[8], c[4];
  for (int i = 0; i < 8; ++i) b[i] = v[i + 8] + v[i];
  for (int i = 0; i < 4; ++i) c[i] = b[i + 4] + b[i];
  return (c[0] + c[2]) + (c[1] + c[3]);
}

// tinyBLAS (batch) or ggml_vec_dot_f16 (single token) over n f16-exact values.
float llama_dot(const std::vector<float>& x, const std::vector<float>& y, bool single) {
  const size_t n = x.size();
  if (!single) {
    float lane[16] = {};
    for (size_t i = 0; i < n; ++i) lane[i % 16] = std::fma(x[i], y[i], lane[i % 16]);
    return tree16(lane);
  }
  const size_t np = n & ~size_t{63};
  float acc[4][16] = {};
  for (size_t i = 0; i < np; ++i) acc[(i % 64) / 16][i % 16] = std::fma(x[i], y[i], acc[(i % 64) / 16][i % 16]);
  float f[16];
  for (int t = 0; t < 16; ++t) f[t] = (acc[0][t] + acc[2][t]) + (acc[1][t] + acc[3][t]);
  double sum = tree16(f);
  for (size_t i = np; i < n; ++i) sum += static_cast<double>(x[i] * y[i]);
  return static_cast<float>(sum);
}

struct Case {
  AttentionShape s{9, 3, 64};
  size_t n_entries = 0;
  std::vector<float> K, V;       // [entries][kv_dim], f16-exact
  std::vector<uint16_t> K16, V16;  // the same as f16 bits, as the kernel reads them
  std::vector<int32_t> entry_pos;
};

Case make_case(size_t n_entries, std::mt19937& rng, AttentionShape shape = {9, 3, 64}) {
  Case c;
  c.s = shape;
  c.n_entries = n_entries;
  const size_t kvd = static_cast<size_t>(c.s.n_kv_heads) * c.s.head_dim;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  c.K.resize(n_entries * kvd);
  c.V.resize(n_entries * kvd);
  for (auto& v : c.K) v = f16(2.0f * nd(rng));
  for (auto& v : c.V) v = f16(nd(rng));
  for (float v : c.K) c.K16.push_back(fp32_to_fp16(v));
  for (float v : c.V) c.V16.push_back(fp32_to_fp16(v));
  for (size_t e = 0; e < n_entries; ++e) c.entry_pos.push_back(static_cast<int32_t>(e));
  return c;
}

// One query row of llama.cpp's attention; the cache padded with masked entries to 256.
std::vector<float> llama_attention_row(const Case& c, const float* q_row, int32_t pos, bool single) {
  const int hd = c.s.head_dim, group = c.s.n_heads / c.s.n_kv_heads;
  const size_t kvd = static_cast<size_t>(c.s.n_kv_heads) * hd;
  const size_t n_kv = (c.n_entries + 255) / 256 * 256;
  std::vector<float> out(static_cast<size_t>(c.s.n_heads) * hd);
  for (int h = 0; h < c.s.n_heads; ++h) {
    const int g = h / group;
    std::vector<float> q(hd);
    for (int d = 0; d < hd; ++d) q[d] = f16(q_row[h * hd + d]);
    std::vector<float> w(n_kv, -std::numeric_limits<float>::infinity());
    for (size_t e = 0; e < c.n_entries; ++e) {
      if (c.entry_pos[e] > pos) continue;
      std::vector<float> k(c.K.begin() + e * kvd + g * hd, c.K.begin() + e * kvd + (g + 1) * hd);
      w[e] = llama_dot(k, q, single) * (1.0f / std::sqrt(static_cast<float>(hd)));
    }
    float mx = -std::numeric_limits<float>::infinity();
    for (float v : w) mx = std::max(mx, v);
    double sum = 0;
    for (size_t e = 0; e < n_kv; e += 16) {
      for (size_t t = 0; t < 16; ++t) w[e + t] = ggml_expf(w[e + t] - mx);
      sum += static_cast<double>(tree16(&w[e]));
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (auto& v : w) v = f16(v * inv);
    for (int d = 0; d < hd; ++d) {
      std::vector<float> vcol(n_kv, 0.0f);
      for (size_t e = 0; e < c.n_entries; ++e) vcol[e] = c.V[e * kvd + g * hd + d];
      out[h * hd + d] = llama_dot(vcol, w, single);
    }
  }
  return out;
}

std::vector<Isa> isas() {
  std::vector<Isa> v{Isa::Portable};
  if (detect_isa() >= Isa::Avx2) v.push_back(Isa::Avx2);
  if (detect_isa() >= Isa::Avx512) v.push_back(Isa::Avx512);
  if (detect_isa() >= Isa::Amx) v.push_back(Isa::Amx);  // its own batched attention (AMX tiles)
  return v;
}

struct IsaGuard {
  explicit IsaGuard(Isa isa) { force_isa(isa); }
  ~IsaGuard() { force_isa(detect_isa()); }
};

void expect_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& label) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
        << label << " at " << i << ": " << got[i] << " vs " << want[i];
}


// The attention in double from the same f16 K, V and f16-rounded Q (masked by position and
// window; a row that sees nothing: zeros).
std::vector<double> exact_attention_row(const Case& c, const float* q_row, int32_t pos) {
  const int hd = c.s.head_dim, group = c.s.n_heads / c.s.n_kv_heads;
  const size_t kvd = static_cast<size_t>(c.s.n_kv_heads) * hd;
  std::vector<double> out(static_cast<size_t>(c.s.n_heads) * hd, 0.0);
  for (int h = 0; h < c.s.n_heads; ++h) {
    const int g = h / group;
    std::vector<double> w(c.n_entries, 0.0);
    double mx = -std::numeric_limits<double>::infinity();
    for (size_t e = 0; e < c.n_entries; ++e) {
      if (!c.s.visible(c.entry_pos[e], pos)) continue;
      double dot = 0;
      for (int d = 0; d < hd; ++d)
        dot += static_cast<double>(f16(q_row[h * hd + d] * c.s.q_prescale())) * c.K[e * kvd + g * hd + d];
      w[e] = dot * c.s.score_scale();
      mx = std::max(mx, w[e]);
    }
    if (mx == -std::numeric_limits<double>::infinity()) continue;
    double sum = 0;
    for (size_t e = 0; e < c.n_entries; ++e) {
      w[e] = c.s.visible(c.entry_pos[e], pos) ? std::exp(w[e] - mx) : 0.0;
      sum += w[e];
    }
    for (size_t e = 0; e < c.n_entries; ++e)
      for (int d = 0; d < hd; ++d) out[h * hd + d] += w[e] / sum * c.V[e * kvd + g * hd + d];
  }
  return out;
}

// Rows prefix..prefix+rows-1 after `prefix` cached entries.
struct Batch {
  std::vector<float> q;
  std::vector<int32_t> row_pos;
};
Batch make_batch(const Case& c, size_t prefix, size_t rows, std::mt19937& rng) {
  Batch b;
  const size_t qd = static_cast<size_t>(c.s.n_heads) * c.s.head_dim;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  b.q.resize(rows * qd);
  for (auto& v : b.q) v = 1.5f * nd(rng);
  for (size_t r = 0; r < rows; ++r) b.row_pos.push_back(static_cast<int32_t>(prefix + r));
  return b;
}

// A prefill of 33 rows after 170 cached entries: tiles of 16 rows (transposed score path,
// or for heads of 128 and more the row-major one) and a last tile of one row (direct path),
// every row in the batched order; SmolLM2's heads (64), 128 (Llama 3 8B, Qwen3) and Gemma
// 3's 256 with one KV head. Portable only: AVX2's and AVX-512's are AttentionContract's.
class AttentionOrderShapes : public ::testing::TestWithParam<AttentionShape> {};

TEST_P(AttentionOrderShapes, BatchMatchesLlamaCppBitForBitOnPortable) {
  std::mt19937 rng(21);
  const size_t prefix = 170, rows = 33;
  Case c = make_case(prefix + rows, rng, GetParam());
  const size_t qd = static_cast<size_t>(c.s.n_heads) * c.s.head_dim;
  const Batch b = make_batch(c, prefix, rows, rng);
  std::vector<float> want;
  for (size_t r = 0; r < rows; ++r) {
    const auto o = llama_attention_row(c, &b.q[r * qd], b.row_pos[r], false);
    want.insert(want.end(), o.begin(), o.end());
  }
  ThreadPool pool(2);
  for (Isa isa : isas()) {
    if (isa >= Isa::Avx2) continue;
    IsaGuard g(isa);
    std::vector<float> got(rows * qd);
    attention(c.s, b.q.data(), b.row_pos.data(), rows, c.K16.data(), c.V16.data(), c.entry_pos.data(), c.n_entries,
              got.data(), pool);
    expect_bits(got, want, std::string("batch ") + isa_name(isa));
  }
}

// The AVX2 and AVX-512 batched kernels against the attention in double: every output
// within 2e-5 of it (V ~ N(0, 1); float sums over <= 256 values), and closer to it than
// llama.cpp's order (whose P rounded to f16 costs ~1e-4), over the shapes above, with
// unordered cache positions (a shuffled cache), rows that see nothing (positions before
// every entry), a sliding window, and a whole prompt with no cached prefix.
void expect_contract(Isa isa, const AttentionShape& param) {
  std::mt19937 rng(24);
  // After a cached prefix, and a whole prompt (row i sees entries 0..i: blocks half seen).
  for (auto [window, prefix] : {std::pair{0, 170}, std::pair{50, 170}, std::pair{0, 0}}) {
    const size_t rows = 49;
    AttentionShape shape = param;
    shape.window = window;
    Case c = make_case(prefix + rows, rng, shape);
    std::shuffle(c.entry_pos.begin(), c.entry_pos.end(), rng);  // K/V rows stay: entries in any order
    const size_t qd = static_cast<size_t>(c.s.n_heads) * c.s.head_dim;
    Batch b = make_batch(c, prefix, rows, rng);
    b.row_pos[3] = -1;  // sees no entry: zeros
    IsaGuard g(isa);
    ThreadPool pool(2);
    std::vector<float> got(rows * qd);
    attention(c.s, b.q.data(), b.row_pos.data(), rows, c.K16.data(), c.V16.data(), c.entry_pos.data(), c.n_entries,
              got.data(), pool);
    double sq_ours = 0, sq_llama = 0;
    for (size_t r = 0; r < rows; ++r) {
      const auto exact = exact_attention_row(c, &b.q[r * qd], b.row_pos[r]);
      for (size_t i = 0; i < qd; ++i) {
        ASSERT_NEAR(got[r * qd + i], exact[i], 2e-5) << isa_name(isa) << " window " << window << " row " << r << " at " << i;
        sq_ours += std::pow(got[r * qd + i] - exact[i], 2);
      }
      if (r == 3) {
        for (size_t i = 0; i < qd; ++i) ASSERT_EQ(got[r * qd + i], 0.0f) << "a row that sees nothing";
        continue;
      }
      if (window == 0) {  // the llama.cpp model has no window
        const auto llama = llama_attention_row(c, &b.q[r * qd], b.row_pos[r], false);
        for (size_t i = 0; i < qd; ++i) sq_llama += std::pow(llama[i] - exact[i], 2);
      }
    }
    if (window == 0) {
      EXPECT_LT(sq_ours, sq_llama) << "the online softmax in float is closer to exact than llama.cpp's order";
    }
  }
}

TEST_P(AttentionOrderShapes, AttentionContractBatchWithinToleranceOnAvx2) {
  if (detect_isa() < Isa::Avx2) GTEST_SKIP() << "AVX2 absent on this CPU: its attention kernel was not compared";
  expect_contract(Isa::Avx2, GetParam());
}

TEST_P(AttentionOrderShapes, AttentionContractBatchWithinToleranceOnAvx512) {
  if (detect_isa() < Isa::Avx512) GTEST_SKIP() << "AVX-512 absent on this CPU: its attention kernel was not compared";
  expect_contract(Isa::Avx512, GetParam());
}

TEST_P(AttentionOrderShapes, AttentionContractBatchWithinToleranceOnAmx) {
  if (detect_isa() < Isa::Amx) GTEST_SKIP() << "AMX absent on this CPU (or its tile state not granted): its attention kernel was not compared";
  expect_contract(Isa::Amx, GetParam());
}

// A batched row's result does not depend on the other rows of its call (tiles of other
// sizes, other neighbours): rows 10..48 of a 49-row call equal the same rows called alone
// (39 rows: other tile boundaries), bit for bit, on every ISA.
TEST_P(AttentionOrderShapes, BatchedRowIndependentOfItsBatch) {
  std::mt19937 rng(25);
  const size_t prefix = 170, rows = 49, skip = 10;
  Case c = make_case(prefix + rows, rng, GetParam());
  const size_t qd = static_cast<size_t>(c.s.n_heads) * c.s.head_dim;
  const Batch b = make_batch(c, prefix, rows, rng);
  ThreadPool pool(2);
  for (Isa isa : isas()) {
    IsaGuard g(isa);
    std::vector<float> all(rows * qd), part((rows - skip) * qd);
    attention(c.s, b.q.data(), b.row_pos.data(), rows, c.K16.data(), c.V16.data(), c.entry_pos.data(), c.n_entries,
              all.data(), pool);
    attention(c.s, b.q.data() + skip * qd, b.row_pos.data() + skip, rows - skip, c.K16.data(), c.V16.data(),
              c.entry_pos.data(), c.n_entries, part.data(), pool);
    expect_bits(part, std::vector<float>(all.begin() + skip * qd, all.end()), std::string("rows ") + isa_name(isa));
  }
}

INSTANTIATE_TEST_SUITE_P(AttentionOrder, AttentionOrderShapes,
                         ::testing::Values(AttentionShape{9, 3, 64}, AttentionShape{8, 2, 128}, AttentionShape{4, 1, 256}),
                         [](const ::testing::TestParamInfo<AttentionShape>& i) {
                           return "heads" + std::to_string(i.param.n_heads) + "_kv" + std::to_string(i.param.n_kv_heads) +
                                  "_hd" + std::to_string(i.param.head_dim);
                         });

// One row alone (a decode step) follows ggml_vec_dot_f16's order instead: with few query
// heads per KV head (direct score path), with many (transposed path), and with a head size
// that leaves a tail after the 64-lane loop.
TEST(AttentionOrder, SingleRowMatchesLlamaCppDecodeOrder) {
  std::mt19937 rng(22);
  for (const AttentionShape shape : {AttentionShape{9, 3, 64}, AttentionShape{16, 2, 64}, AttentionShape{4, 2, 80}}) {
    Case c = make_case(300, rng, shape);
    const size_t qd = static_cast<size_t>(c.s.n_heads) * c.s.head_dim;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> q(qd);
    for (auto& v : q) v = 1.5f * nd(rng);
    const int32_t pos = 299;
    const auto want = llama_attention_row(c, q.data(), pos, true);
    const auto batched = llama_attention_row(c, q.data(), pos, false);
    ThreadPool pool(1);
    for (Isa isa : isas()) {
      IsaGuard g(isa);
      std::vector<float> got(qd);
      attention(c.s, q.data(), &pos, 1, c.K16.data(), c.V16.data(), c.entry_pos.data(), c.n_entries, got.data(), pool);
      expect_bits(got, want, std::string("single ") + isa_name(isa) + " heads " + std::to_string(shape.n_heads) +
                                 " hd " + std::to_string(shape.head_dim));
    }
    EXPECT_NE(want, batched) << "the two orders should differ somewhere on this case";
  }
}

TEST(AttentionOrder, ExpIsGgmlExpBitForBit) {
  std::vector<float> xs;
  for (float x = -110.0f; x < 90.0f; x += 0.0137f) xs.push_back(x);
  for (float x : {0.0f, -0.0f, -87.5f, -103.9f, -104.0f, 88.3f, 88.4f, 89.0f, -1e-30f, 1e-30f}) xs.push_back(x);
  for (Isa isa : isas()) {
    IsaGuard g(isa);
    for (float x : xs) {
      const float got = exp_approx(x), want = ggml_expf(x);
      ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want)) << isa_name(isa) << " x=" << x;
    }
  }
}

TEST(AttentionOrder, SiluIsGgmlSwiglu) {
  std::mt19937 rng(23);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> gate(1539), up(1539);  // not a multiple of 8 or 16: the vector loops' tails too
  for (auto& v : gate) v = nd(rng);
  for (auto& v : up) v = nd(rng);
  gate[0] = 0.0f;
  gate[1] = -95.0f;
  gate[2] = 95.0f;
  gate[3] = -200.0f;  // exp's |n| > 192 edges (inf, 0), in the vector loops as well
  gate[4] = 200.0f;
  gate[5] = -0.0f;
  gate[1537] = -200.0f;
  for (Isa isa : isas()) {
    IsaGuard g(isa);
    std::vector<float> got = gate;
    silu_mul(got.data(), up.data(), got.size());
    for (size_t i = 0; i < got.size(); ++i) {
      const float want = gate[i] / (1.0f + ggml_expf(0.0f - gate[i])) * up[i];
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want)) << isa_name(isa) << " i=" << i;
    }
  }
}

}  // namespace
}  // namespace cf
