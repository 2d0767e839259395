// ISA dispatch and WeightMatrix: repacking at construction, activation quantization
// once per multiply, and the split of the work over the thread pool.
#include "model/kernels.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "base/sanitizer.h"
#include "base/thread_pool.h"
#include "model/kernels_impl.h"
#include "model/kernels_panel.h"

namespace cf {

// ---------------------------------------------------------------------------------------
// ISA selection

namespace {
#if defined(__x86_64__)
// AMX BF16 tiles usable by this process: the CPU has them (CPUID leaf 7: AMX-TILE, AMX-BF16;
// leaf 7.1: AVX512-BF16, which the B panel's conversion uses), the OS saves tile state
// (XCR0 bits 17 and 18), and Linux grants it to this process (arch_prctl
// ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA; without it the first tile instruction is a
// SIGILL). The grant holds for every thread of the process, also those already running.
bool amx_usable() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const bool tile = (edx >> 24) & 1, bf16 = (edx >> 22) & 1;
  unsigned eax1 = 0, ebx1 = 0, ecx1 = 0, edx1 = 0;
  const bool avx512_bf16 = __get_cpuid_count(7, 1, &eax1, &ebx1, &ecx1, &edx1) && ((eax1 >> 5) & 1);
  if (!tile || !bf16 || !avx512_bf16) return false;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  asm volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & (3u << 17)) != (3u << 17)) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}
#endif

Isa cpu_isa() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  // F16C straight from CPUID (leaf 1, ECX bit 29): clang's __builtin_cpu_supports does not
  // know the name, and the fuzz build compiles this file with clang.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vnni");
  if (avx512 && amx_usable()) return Isa::Amx;
  if (avx512) return Isa::Avx512;
  if (avx2) return Isa::Avx2;
#endif
  return Isa::Portable;
}

Isa env_capped(Isa best) {
  const char* env = std::getenv("CHUNKFUSE_ISA");
  if (!env || !*env) return best;
  const std::string v(env);
  Isa cap = best;
  if (v == "portable") cap = Isa::Portable;
  else if (v == "avx2") cap = Isa::Avx2;
  else if (v == "avx512") cap = Isa::Avx512;
  else if (v == "amx") cap = Isa::Amx;
  else std::fprintf(stderr, "chunkfuse: ignoring unknown CHUNKFUSE_ISA=%s\n", env);
  return std::min(best, cap);
}

std::atomic<int> g_forced_isa{-1};

const kern::PanelKernels& panel_kernels_for(Isa isa) {
  switch (isa) {
    case Isa::Amx: return kern::panel_kernels_amx();
    case Isa::Avx512: return kern::panel_kernels_avx512();
    case Isa::Avx2: return kern::panel_kernels_avx2();
    case Isa::Portable: break;
  }
  return kern::panel_kernels_portable();
}
}  // namespace

Isa detect_isa() {
  static const Isa isa = env_capped(cpu_isa());
  return isa;
}

Isa active_isa() {
  const int forced = g_forced_isa.load(std::memory_order_relaxed);
  return forced >= 0 ? static_cast<Isa>(forced) : detect_isa();
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Portable: return "portable";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
    case Isa::Amx: return "amx";
  }
  return "?";
}

void force_isa(Isa isa) {
  if (isa > cpu_isa()) throw std::invalid_argument(std::string("this CPU cannot run ") + isa_name(isa));
  g_forced_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
}

// ---------------------------------------------------------------------------------------
// WeightMatrix

namespace {

struct AlignedFree {
  void operator()(uint8_t* p) const { std::free(p); }
};
using AlignedBytes = std::unique_ptr<uint8_t[], AlignedFree>;

AlignedBytes aligned_bytes(size_t n) {
  const size_t rounded = (std::max<size_t>(n, 1) + 63) / 64 * 64;
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, rounded));
  if (!p) throw std::bad_alloc();
  return AlignedBytes(p);
}

// Whether [p, p+n) lies in one file-backed mapping (then dropping its pages only costs a
// re-read from the file; on anonymous or heap memory it would destroy the data).
bool in_file_mapping(const uint8_t* p, size_t n) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const auto begin = reinterpret_cast<uintptr_t>(p), end = begin + n;
  while (std::getline(maps, line)) {
    std::istringstream in(line);
    std::string range, perms, offset, dev;
    unsigned long inode = 0;
    in >> range >> perms >> offset >> dev >> inode;
    const auto dash = range.find('-');
    if (dash == std::string::npos) continue;
    const uintptr_t lo = std::stoull(range.substr(0, dash), nullptr, 16);
    const uintptr_t hi = std::stoull(range.substr(dash + 1), nullptr, 16);
    if (begin >= lo && begin < hi) return end <= hi && inode != 0 && perms.find('w') == std::string::npos;
  }
  return false;
}

// Drops the resident pages wholly inside [p, p+n) (never a page shared with a neighbour)
// of a file mapping (in_file_mapping: the caller checks).
void release_pages(const uint8_t* p, size_t n) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const auto end = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
  if (end <= begin) return;
  madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

const uint8_t* page_floor(const uint8_t* p) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  return reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(p) / page * page);
}

constexpr size_t kRepackSlabBytes = 8u << 20;  // file bytes repacked between two releases

// Scratch for quantized activations, owned by the calling thread (the pool is not
// reentrant, so one multiply at a time runs per caller).
uint8_t* act_scratch(size_t bytes) {
  thread_local AlignedBytes buf;
  thread_local size_t cap = 0;
  if (bytes > cap) {
    cap = bytes + bytes / 4;
    buf = aligned_bytes(cap);
  }
  return buf.get();
}

// The tile kernel of a repacked weight type (kernels_impl.h lists which type has which).
// batched: llama.cpp's GEMM order (K-quants: tiled GEMM; F16/BF16: tinyBLAS).
kern::TileKernelFn tile_kernel(const kern::IsaKernels& k, GgmlType t, bool batched) {
  switch (t) {
    case GgmlType::Q4_1: return k.q4_1;
    case GgmlType::Q4_0: return k.q4_0;
    case GgmlType::Q5_1: return k.q5_1;
    case GgmlType::Q5_0: return k.q5_0;
    case GgmlType::Q8_0: return k.q8_0;
    case GgmlType::Q4_K: return k.k4;  // batched: the panel GEMM
    case GgmlType::Q5_K: return k.k5;
    case GgmlType::Q6_K: return k.k6;
    case GgmlType::F16: return batched ? k.f16_gemm : k.f16;
    case GgmlType::BF16: return batched ? k.bf16_gemm : k.bf16;
    default: break;
  }
  throw std::logic_error("tile_kernel: " + std::string(ggml_type_name(t)) + " is not repacked");
}

// Below this many multiply-adds a job runs on the calling thread only: waking the pool
// costs more than the work (measured: ~3-4 us per dispatch; 576x576 at n = 1 takes ~5 us).
constexpr size_t kMinParallelMacs = 512 * 1024;
constexpr size_t kRowChunk = 64;  // activation rows per task for large n (panels: PanelKernels::row_chunk)

// The regions one multiply's ISA kernels touch (they are not instrumented in the sanitizer
// build; base/sanitizer.h): the tiles of outputs o_begin..o_end, the activation records,
// each input row and each output row's o_begin..o_end.
void check_isa_regions(const uint8_t* tiles, size_t tile_bytes, const uint8_t* acts, size_t act_bytes,
                       const float* x, size_t x_stride, size_t n, size_t cols, const float* y, size_t y_stride,
                       size_t o_begin, size_t o_end) {
#ifdef CF_ASAN
  check_kernel_region("matmul weight tiles", tiles, tile_bytes);
  check_kernel_region("matmul activation records", acts, act_bytes);
  for (size_t r = 0; r < n; ++r) {
    check_kernel_region("matmul input row", x + r * x_stride, cols * sizeof(float));
    check_kernel_region("matmul output row", y + r * y_stride + o_begin, (o_end - o_begin) * sizeof(float));
  }
#endif
}

}  // namespace

struct WeightMatrix::Impl {
  kern::TileLayout layout = kern::TileLayout::None;  // None: the generic per-element path
  AlignedBytes packed;       // repacked tiles (kernels_impl.h)
  size_t tile_bytes = 0;     // bytes per 16-row tile
  size_t n_tiles = 0;
  size_t nb = 0;             // 32-blocks per row
  const uint8_t* raw = nullptr;  // generic layout: rows in the file
  size_t row_bytes = 0;
};

WeightMatrix::WeightMatrix(GgmlType type, const uint8_t* data, size_t rows, size_t cols)
    : type_(type), rows_(rows), cols_(cols), impl_(std::make_unique<Impl>()) {
  const auto info = ggml_type_info(type);
  if (!info.supported || type == GgmlType::Q8_1 || type == GgmlType::Q8_K)
    throw std::invalid_argument("WeightMatrix: unsupported weight type " + std::string(info.name));
  if (cols == 0 || rows == 0) throw std::invalid_argument("WeightMatrix: empty matrix");
  Impl& m = *impl_;
  m.row_bytes = ggml_row_bytes(type, cols);  // throws when cols is not whole blocks
  const uint32_t tid = static_cast<uint32_t>(type);
  m.layout = kern::tile_layout_for(tid, cols);
  if (m.layout != kern::TileLayout::None) {
    m.nb = cols / kern::kQK;
    m.n_tiles = (rows + kern::kTileRows - 1) / kern::kTileRows;
    m.tile_bytes = kern::tile_block_bytes(tid, m.layout) * m.nb;
    m.packed = aligned_bytes(m.tile_bytes * m.n_tiles);
    // In slabs, each slab's file pages dropped as soon as it is repacked: the peak memory
    // of loading is then the repacked model plus one slab, not plus the largest matrix
    // (a 262k-word output matrix is 170-215 MiB in the file).
    const bool file_backed = in_file_mapping(data, m.row_bytes * rows);
    const size_t slab_rows = std::max<size_t>(kern::kTileRows, kRepackSlabBytes / m.row_bytes / kern::kTileRows * kern::kTileRows);
    const uint8_t* released = data;  // pages before it are dropped (a straddling page waits for the next slab)
    for (size_t r0 = 0; r0 < rows; r0 += slab_rows) {
      const size_t n = std::min(slab_rows, rows - r0);
      kern::repack_matrix(tid, data + r0 * m.row_bytes, n, cols, m.packed.get() + r0 / kern::kTileRows * m.tile_bytes);
      if (!file_backed) continue;
      const uint8_t* slab_end = data + (r0 + n) * m.row_bytes;
      release_pages(released, static_cast<size_t>(slab_end - released));
      released = page_floor(slab_end);
    }
  } else {
    m.raw = data;
    kern::generic_act_row_bytes(tid, cols);  // throws when no kernel
  }
}

WeightMatrix::~WeightMatrix() = default;
WeightMatrix::WeightMatrix(WeightMatrix&&) noexcept = default;
WeightMatrix& WeightMatrix::operator=(WeightMatrix&&) noexcept = default;

void WeightMatrix::dequantize_weight_row(size_t o, float* dst) const {
  if (o >= rows_) throw std::out_of_range("WeightMatrix::dequantize_weight_row: row out of range");
  const Impl& m = *impl_;
  if (m.layout == kern::TileLayout::None)
    dequantize_row(type_, m.raw + o * m.row_bytes, dst, cols_);
  else
    kern::dequantize_packed_row(static_cast<uint32_t>(type_), m.packed.get(), cols_, o, dst);
}

void WeightMatrix::multiply(const float* x, size_t n, size_t x_stride, float* y, size_t y_stride,
                            ThreadPool& pool, KQuantOrder order) const {
  multiply_rows(x, n, x_stride, y, y_stride, 0, rows_, pool, order);
}

void WeightMatrix::multiply_rows(const float* x, size_t n, size_t x_stride, float* y, size_t y_stride,
                                 size_t o_begin, size_t o_end, ThreadPool& pool, KQuantOrder order) const {
  if (o_end > rows_ || o_begin > o_end) throw std::out_of_range("WeightMatrix::multiply_rows: bad row range");
  if (n == 0 || o_begin == o_end) return;
  const Impl& m = *impl_;
  const size_t threads = pool.size();
  const bool parallel = threads > 1 && n * cols_ * (o_end - o_begin) >= kMinParallelMacs;
  const uint32_t tid = static_cast<uint32_t>(type_);

  if (m.layout == kern::TileLayout::None) {
    const size_t rec = kern::generic_act_row_bytes(tid, cols_);
    uint8_t* acts = act_scratch(rec * n);
    auto quantize = [&](size_t b, size_t e, size_t) {
      for (size_t r = b; r < e; ++r) kern::generic_quantize_row(tid, x + r * x_stride, cols_, acts + r * rec);
    };
    auto compute = [&](size_t b, size_t e, size_t) {
      for (size_t o = o_begin + b; o < o_begin + e; ++o)
        for (size_t r = 0; r < n; ++r)
          y[r * y_stride + o] = kern::generic_dot(tid, m.raw + o * m.row_bytes, acts + r * rec, cols_);
    };
    if (parallel) {
      pool.parallel_range(n, quantize, 1);
      pool.parallel_range(o_end - o_begin, compute);
    } else {
      quantize(0, n, 0);
      compute(0, o_end - o_begin, 0);
    }
    return;
  }

  const Isa isa = active_isa();
  const kern::IsaKernels& k = kern::isa_kernels_for(isa);
  const bool half = m.layout == kern::TileLayout::Half, kq = m.layout == kern::TileLayout::KSuper;
  // llama.cpp's GEMM threshold: K-quants 8 rows (tiled GEMM); F16/BF16 2 rows (tinyBLAS,
  // which only takes matrices of a multiple of 4 rows).
  const bool batched = half ? rows_ % 4 == 0 && (order == KQuantOrder::Batched ||
                                                 (order == KQuantOrder::ByRowCount && n >= kern::kHalfGemmRows))
                            : order == KQuantOrder::Batched ||
                                  (order == KQuantOrder::ByRowCount && n >= kern::kKQuantBatchedRows);
  // Block-quantized weights take the panel GEMM (kernels_panel.h) whenever they batch.
  const bool panel = batched && !half && kern::has_panel(type_);
  const kern::PanelKernels& pk = panel_kernels_for(isa);
  const kern::TileRangeFn range_fn = panel && pk.range ? pk.range(type_) : nullptr;
  const kern::TileKernelFn tile_fn = range_fn ? nullptr : panel ? pk.tile(type_) : tile_kernel(k, type_, batched);
  // The activation record each layout reads: floats for F16/BF16, Q8_K for the K-quants,
  // per-32 Q8 for the rest, the panel record for the panel GEMM.
  const size_t stride = panel ? pk.row_stride(m.nb)
                        : half ? kern::float_act_row_stride(m.nb)
                        : kq ? kern::q8k_act_row_stride(m.nb)
                             : kern::act_row_stride(m.nb);
  // A kernel that reads rows in groups (AMX: 16) reads past row n up to the group's end.
  const size_t group = panel ? pk.row_group : 1;
  uint8_t* acts = act_scratch(stride * ((n + group - 1) / group * group));
  const size_t t_begin = o_begin / kern::kTileRows;  // the tiles holding outputs o_begin..o_end
  const size_t t_end = (o_end + kern::kTileRows - 1) / kern::kTileRows;
  const size_t tiles = t_end - t_begin;
  check_isa_regions(m.packed.get() + t_begin * m.tile_bytes, tiles * m.tile_bytes, acts, stride * n, x, x_stride, n,
                    cols_, y, y_stride, o_begin, o_end);
  auto quantize = [&](size_t b, size_t e, size_t) {
    for (size_t r = b; r < e; ++r) {
      if (panel)
        pk.quantize(x + r * x_stride, cols_, acts, r, stride, kern::panel_type(type_));
      else if (half)
        (type_ == GgmlType::F16 ? k.round_f16 : k.round_bf16)(x + r * x_stride, cols_,
                                                             reinterpret_cast<float*>(acts + r * stride));
      else if (kq)
        k.quantize_q8_k(x + r * x_stride, cols_, acts + r * stride);
      else
        k.quantize_q8(x + r * x_stride, cols_, acts + r * stride);
    }
  };
  if (parallel && n >= 16)
    pool.parallel_range(n, quantize, 1);
  else
    quantize(0, n, 0);

  const kern::ActView act{acts, stride, m.nb};
  const size_t row_chunk = std::min(n, panel ? pk.row_chunk : kRowChunk);
  const size_t row_tasks = (n + row_chunk - 1) / row_chunk;
  // Enough tasks for load balance across threads; tiles per task from that.
  const size_t want = parallel ? threads * 4 : 1;
  const size_t tile_tasks = std::min(tiles, std::max<size_t>(1, (want + row_tasks - 1) / row_tasks));
  size_t tiles_per_task = (tiles + tile_tasks - 1) / tile_tasks;
  if (range_fn) tiles_per_task += tiles_per_task % 2;  // whole pairs (AMX: a pair per product)
  const size_t n_tile_tasks = (tiles + tiles_per_task - 1) / tiles_per_task;

  auto task = [&](size_t id, size_t) {
    const size_t rt = id / n_tile_tasks, tt = id % n_tile_tasks;
    const size_t r0 = rt * row_chunk, nr = std::min(n, r0 + row_chunk) - r0;
    const size_t ta = t_begin + tt * tiles_per_task, tb = std::min(t_end, ta + tiles_per_task);
    auto lanes = [&](size_t t) {  // the tile's outputs inside [o_begin, o_end)
      const size_t base = t * kern::kTileRows;
      return std::pair<unsigned, unsigned>(static_cast<unsigned>(std::max(o_begin, base) - base),
                                           static_cast<unsigned>(std::min(o_end, base + kern::kTileRows) - base));
    };
    if (range_fn) {
      range_fn(m.packed.get() + ta * m.tile_bytes, m.tile_bytes, tb - ta, m.nb, act, r0, nr,
               y + r0 * y_stride + ta * kern::kTileRows, y_stride, lanes(ta).first, lanes(tb - 1).second);
      return;
    }
    for (size_t t = ta; t < tb; ++t) {
      const auto [lo, hi] = lanes(t);
      tile_fn(m.packed.get() + t * m.tile_bytes, m.nb, act, r0, nr, y + r0 * y_stride + t * kern::kTileRows, y_stride,
              lo, hi);
    }
  };
  const size_t n_tasks = row_tasks * n_tile_tasks;
  if (parallel) {
    pool.parallel_for(n_tasks, task);
  } else {
    for (size_t id = 0; id < n_tasks; ++id) task(id, 0);
  }
}

}  // namespace cf

namespace cf::kern {
const IsaKernels& isa_kernels_for(Isa isa) {
  switch (isa) {
    case Isa::Amx:  // decode and the float tiles: AVX-512's kernels
    case Isa::Avx512: return isa_kernels_avx512();
    case Isa::Avx2: return isa_kernels_avx2();
    case Isa::Portable: break;
  }
  return isa_kernels_portable();
}
}  // namespace cf::kern
