// The runtime kernels compiled for avx2 (CMake adds the ISA flags by file name).
#define CF_RK_NS avx2_impl
#define CF_RK_TABLE table
#include "runtime/runtime_kernels_impl.inc"

namespace cf::rk {
const RuntimeKernels& runtime_kernels_avx2() { return avx2_impl::table(); }
}  // namespace cf::rk
