#include "runtime/runtime_kernels.h"

#include "model/kernels.h"

namespace cf::rk {

const RuntimeKernels& active() {
  switch (active_isa()) {
    case Isa::Amx:  // AMX is the prefill GEMM's; attention runs AVX-512
    case Isa::Avx512: return avx512_kernels();
    case Isa::Avx2: return avx2_kernels();
    case Isa::Portable: break;
  }
  return portable_kernels();
}

}  // namespace cf::rk
