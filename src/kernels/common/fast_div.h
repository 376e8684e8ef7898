// Division of a non-negative 64-bit value by a divisor fixed for a whole launch, as a multiply-high, an add and a
// shift (Granlund and Montgomery, "Division by invariant integers using multiplication", 1994, the round-up method
// with N = 64): the memory-bound preparation passes split flat indices into (batch, seq, head) per 16 bytes loaded,
// and a 64-bit `/` or `%` there is a software routine of about a hundred instructions (docs/decisions.md#fast-div).
// The magic number is computed on the host (128-bit arithmetic) and travels in the kernel's parameters.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define FLASHCORE_FAST_DIV_HD __host__ __device__
#else
#define FLASHCORE_FAST_DIV_HD
#endif

namespace flashcore::kernels {

struct FastDiv {
  uint64_t mul = 1;    // floor(2^64 (2^shift - divisor) / divisor) + 1
  uint32_t shift = 0;  // ceil(log2(divisor))
  uint32_t divisor = 1;

  FastDiv() = default;
  // divisor >= 1 (0 is taken as 1: a call with an empty dimension launches nothing that divides by it).
  explicit FastDiv(uint32_t d) : divisor(d == 0 ? 1u : d) {
    while ((uint64_t{1} << shift) < divisor) ++shift;
    using u128 = unsigned __int128;
    mul = static_cast<uint64_t>((u128{1} << 64) * ((uint64_t{1} << shift) - divisor) / divisor) + 1;
  }

  // n / divisor for 0 <= n < 2^63 (t <= n, so t + n does not overflow).
  FLASHCORE_FAST_DIV_HD uint64_t div(uint64_t n) const {
#if defined(__CUDA_ARCH__)
    const uint64_t t = __umul64hi(n, mul);
#else
    const uint64_t t = static_cast<uint64_t>((static_cast<unsigned __int128>(n) * mul) >> 64);
#endif
    return (t + n) >> shift;
  }
  // n % divisor, with the quotient q = div(n) already known.
  FLASHCORE_FAST_DIV_HD uint64_t mod(uint64_t n, uint64_t q) const { return n - q * divisor; }
};

}  // namespace flashcore::kernels

#undef FLASHCORE_FAST_DIV_HD
