// The runtime's hot loops (attention tiles, norms, activations, f16 conversions), one table
// per instruction set (runtime_kernels_<isa>.cpp: runtime_kernels_table.h over that ISA's
// hooks) chosen at run time by the same ISA switch as the matmul kernels (CHUNKFUSE_ISA
// caps both).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "model/kernels.h"  // Isa
#include "runtime/attention.h"

namespace cf::rk {

inline constexpr size_t kBlock = 64;       // cache entries per attention block
inline constexpr size_t kMaxQueries = 48;  // query vectors (rows x heads of a group) per task

struct TileArgs {
  const AttentionShape* s;
  const float* q;
  const int32_t* row_pos;
  size_t row_begin, row_end;
  int kv_head;
  const uint16_t* K;  // f16 bits, as KvCache stores them
  const uint16_t* V;
  const int32_t* entry_pos;
  size_t n_entries;
  float* out;
  // llama.cpp multiplies Q.K and P.V with tinyBLAS when a batch has two or more tokens and
  // with ggml_vec_dot_f16 for a single token; the two sum in different orders. True when
  // the whole attention call has one row, to follow the latter (decode steps).
  bool single_row_order;
};

struct RuntimeKernels {
  void (*attend_tile)(const TileArgs&, std::vector<float>& scratch);
  void (*attention_probs_row)(const AttentionShape&, const float* q_row, int32_t row_pos, const uint16_t* K,
                              const int32_t* entry_pos, size_t n_entries, float* probs);
  void (*rms_norm)(const float* x, const float* w, float* y, size_t n, float eps);
  void (*silu_mul)(float* gate, const float* up, size_t n);
  void (*add_inplace)(float* y, const float* x, size_t n);
  void (*round_to_f16)(float* x, size_t n);
  void (*f16_to_f32)(const uint16_t* x, float* y, size_t n);
  void (*f32_to_f16)(const float* x, uint16_t* y, size_t n);
  float (*exp)(float x);
  // Query vectors per task of a batched call (rows x the heads of a KV group): kMaxQueries,
  // or more where the batched tile takes any count and each task's per-block K/V conversion
  // is worth sharing among more queries (AMX).
  size_t batched_task_queries = kMaxQueries;
};

// A block of cache entries [b0, b0 + bn) for a batched tile: their positions into
// epos[0, n) (n >= bn; the padding INT32_MAX, never visible) and the lowest and highest
// position, so that a block no query of a task sees is skipped.
inline std::pair<int32_t, int32_t> block_entry_positions(const int32_t* entry_pos, size_t b0, size_t bn, int32_t* epos,
                                                         size_t n) {
  int32_t lo = std::numeric_limits<int32_t>::max(), hi = std::numeric_limits<int32_t>::min();
  for (size_t e = 0; e < n; ++e) {
    epos[e] = e < bn ? entry_pos[b0 + e] : std::numeric_limits<int32_t>::max();
    if (e < bn) {
      lo = std::min(lo, epos[e]);
      hi = std::max(hi, epos[e]);
    }
  }
  return {lo, hi};
}

// The batched attention tiles of AVX-512 and AVX2 machines (attention_flash.h, one
// algorithm per ISA file): online softmax, in an order of its own, held to the numerics
// contract by tolerance. Those ISAs' attend_tile takes it for every batched call
// (TileArgs::single_row_order false) of a head dim it covers (16, 32, ..., 256); false
// where it does not, and the llama.cpp order runs.
bool attend_tile_flash_avx512(const TileArgs& a, std::vector<float>& scratch);
bool attend_tile_flash_avx2(const TileArgs& a, std::vector<float>& scratch);
// The same on AMX BF16 tiles (attention_flash_amx.cpp), for head dims that are a multiple of
// 32 up to 256; false for the others (AMX's table then takes the AVX-512 kernel).
bool attend_tile_flash_amx(const TileArgs& a, std::vector<float>& scratch);

const RuntimeKernels& runtime_kernels_portable();
const RuntimeKernels& runtime_kernels_avx2();
const RuntimeKernels& runtime_kernels_avx512();
const RuntimeKernels& runtime_kernels_amx();  // AVX-512's, with batched attention on AMX tiles
// The table an ISA runs, as model/kernels_impl.h's isa_kernels_for: one
// dispatch scheme, <table>_<isa>() per ISA file and <table>_for(Isa) to pick.
const RuntimeKernels& runtime_kernels_for(Isa isa);
const RuntimeKernels& active();  // runtime_kernels_for(cf::active_isa())

}  // namespace cf::rk
