// kernels::FastDiv (the preparation passes' index splits) against the plain division, on the host (the device
// path differs only in __umul64hi for the 128-bit product's high half).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/common/fast_div.h"

namespace {

using flashcore::kernels::FastDiv;

std::vector<uint32_t> divisors() {
  std::vector<uint32_t> d = {1, 2, 3, 5, 7, 8, 12, 16, 24, 25, 31, 32, 33, 48, 64, 96, 100, 113, 127, 128, 4097,
                             8191, 8192, 65535, 65536, 65537, 1000003, (1u << 31) - 1, 1u << 31, (1u << 31) + 1,
                             0xfffffffeu, 0xffffffffu};
  std::mt19937 rng(7);
  for (int i = 0; i < 64; ++i) d.push_back(1 + rng() % 100000);
  return d;
}

std::vector<uint64_t> dividends(uint32_t d) {
  std::vector<uint64_t> n = {0, 1, 2, d - 1u, d, uint64_t{d} + 1, 2 * uint64_t{d} - 1, 2 * uint64_t{d},
                             (uint64_t{1} << 32) - 1, uint64_t{1} << 32, (uint64_t{1} << 62) + 12345,
                             (uint64_t{1} << 63) - 1, (uint64_t{1} << 63) - d};
  std::mt19937_64 rng(d);
  for (int i = 0; i < 2000; ++i) n.push_back(rng() >> (1 + rng() % 63));
  for (uint64_t q = 0; q < 64; ++q) {  // around multiples of the divisor
    n.push_back(q * d);
    if (q > 0) n.push_back(q * d - 1);
  }
  return n;
}

TEST(FastDiv, MatchesDivisionBelowTwoToThe63) {
  for (const uint32_t d : divisors()) {
    const FastDiv f(d);
    for (const uint64_t n : dividends(d)) {
      if (n >= (uint64_t{1} << 63)) continue;
      const uint64_t q = f.div(n);
      ASSERT_EQ(q, n / d) << "n=" << n << " d=" << d;
      ASSERT_EQ(f.mod(n, q), n % d) << "n=" << n << " d=" << d;
    }
  }
}

TEST(FastDiv, ZeroDivisorIsTakenAsOne) {
  const FastDiv f(0);
  EXPECT_EQ(f.div(12345), 12345u);
  EXPECT_EQ(f.mod(12345, 12345), 0u);
}

}  // namespace
