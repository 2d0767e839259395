#include "runtime/runtime_kernels.h"

#include "model/kernels.h"

namespace cf::rk {

const RuntimeKernels& runtime_kernels_for(Isa isa) {
  switch (isa) {
    case Isa::Amx: return runtime_kernels_amx();
    case Isa::Avx512: return runtime_kernels_avx512();
    case Isa::Avx2: return runtime_kernels_avx2();
    case Isa::Portable: break;
  }
  return runtime_kernels_portable();
}

const RuntimeKernels& active() { return runtime_kernels_for(active_isa()); }

}  // namespace cf::rk
