// The machine's int8 multiply-add peak per ISA, measured by a dependency-free loop of the
// instruction each ISA's GEMM is built on (AVX-512 VNNI: vpdpbusd zmm; AVX2: vpmaddubsw +
// vpmaddwd + vpaddd on ymm), so that `chunkfuse perf --peak` can say what fraction of the
// silicon the prefill GEMM reaches; with AMX also the tile loops (TDPBUSD for the int8 peak,
// TDPBF16PS for the BF16 one, which the AMX GEMM runs). (../shared/tools/amx_probe.c
// measures the same loops.)
#pragma once
#include <cstddef>
#include <cstdint>

#include "model/kernels.h"

namespace cf {

// Multiply-adds per second of `isa`'s loop on `threads` threads at once (each runs
// `iterations` rounds of 10 independent accumulators), the best of `runs` runs. Portable has
// no int8 SIMD, and a CPU without the ISA cannot run it: 0.
double int8_peak_macs_per_s(Isa isa, size_t threads, long iterations = 5000000, int runs = 7);
// The AMX BF16 tile peak (TDPBF16PS) in multiply-adds per second; 0 without AMX.
double amx_bf16_peak_macs_per_s(size_t threads, long iterations = 5000000, int runs = 7);

// Bytes per second that `threads` threads read from memory at once, each summing its part
// of a buffer far larger than the caches (AVX2 loads where the CPU has them), the best of
// `runs` passes: what decode, which streams every weight once per token, can at most use.
double read_bandwidth_bytes_per_s(size_t threads, size_t bytes = size_t{256} << 20, int runs = 3);

namespace kern {
// One thread's loop; returns the multiply-adds done (the checksum keeps it from being elided).
double int8_peak_loop_avx512(long iterations, int& checksum);
double int8_peak_loop_avx2(long iterations, int& checksum);
double int8_peak_loop_amx(long iterations, int& checksum);  // TDPBUSD
double bf16_peak_loop_amx(long iterations, int& checksum);  // TDPBF16PS
// Sums n bytes (a multiple of 64) at p as 64-bit words.
uint64_t read_sum_avx2(const uint8_t* p, size_t n);
}  // namespace kern

}  // namespace cf
