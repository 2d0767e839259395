// The runtime kernels compiled for avx512 (CMake adds the ISA flags by file name).
#define CF_RK_NS avx512_impl
#define CF_RK_TABLE table
#include "runtime/runtime_kernels_impl.inc"

namespace cf::rk {
const RuntimeKernels& runtime_kernels_avx512() { return avx512_impl::table(); }
}  // namespace cf::rk
