// The sanitizer build (CHUNKFUSE_SANITIZE) compiles the ISA kernels (*_avx2.cpp,
// *_avx512.cpp) without ASan and UBSan (CMakeLists.txt): instrumented, the model tests ran
// 8x slower on an AVX2 machine and CI's sanitizer phase ran past its time limits. Their
// callers (the weight matmul, attention, the elementwise wrappers) check instead, once per
// call, that every byte a kernel will read or write is addressable, so an overflow of the
// buffers handed to a kernel is still reported, at the call. The kernels' results are
// checked against the instrumented portable kernels in tests/model/test_kernels.cpp.
#pragma once
#include <cstddef>
#include <cstdio>

#if defined(__SANITIZE_ADDRESS__)
#define CF_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CF_ASAN 1
#endif
#endif
#ifdef CF_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace cf {

// Under ASan: if any of the `bytes` bytes at p is unaddressable, says which kernel's region
// it is and touches that byte, so that ASan reports it (heap overflow, use after free, ...)
// and stops. Otherwise, and in every other build, nothing.
inline void check_kernel_region([[maybe_unused]] const char* what, [[maybe_unused]] const void* p,
                                [[maybe_unused]] size_t bytes) {
#ifdef CF_ASAN
  if (bytes == 0) return;
  if (void* bad = __asan_region_is_poisoned(const_cast<void*>(p), bytes)) {
    std::fprintf(stderr, "chunkfuse: %s: byte %zu of the %zu-byte region a kernel will access is not addressable\n",
                 what, static_cast<size_t>(static_cast<const char*>(bad) - static_cast<const char*>(p)), bytes);
    (void)*static_cast<const volatile char*>(bad);
  }
#endif
}

}  // namespace cf
