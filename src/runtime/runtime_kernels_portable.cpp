// The runtime kernels in their scalar form (no ISA flags: the baseline x86-64 build), every
// hook ScalarOps' own.
#include "runtime/runtime_kernels_table.h"

namespace cf::rk {
namespace {

struct PortableOps : ScalarOps<PortableOps> {};

}  // namespace

const RuntimeKernels& runtime_kernels_portable() { return runtime_kernels_table<PortableOps>(); }

}  // namespace cf::rk
