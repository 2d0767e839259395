// The runtime kernels compiled for portable (CMake adds the ISA flags by file name).
#define CF_RK_NS portable_impl
#define CF_RK_TABLE table
#include "runtime/runtime_kernels_impl.inc"

namespace cf::rk {
const RuntimeKernels& runtime_kernels_portable() { return portable_impl::table(); }
}  // namespace cf::rk
