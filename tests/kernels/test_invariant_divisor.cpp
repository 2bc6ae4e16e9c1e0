// InvariantDivisor against the `/` and `%` operators, on the host (the device takes the same
// arithmetic, with __umulhi for the high word).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "core/error.h"
#include "kernels/invariant_divisor.h"

namespace gpulab::kernels {
namespace {

void expect_divides(int32_t divisor, int32_t n) {
  const InvariantDivisor f(divisor);
  const int32_t q = f.div(n);
  ASSERT_EQ(q, n / divisor) << n << " / " << divisor;
  ASSERT_EQ(f.mod(n, q), n % divisor) << n << " % " << divisor;
}

TEST(InvariantDivisor, SmallDivisorsOverEveryNumeratorBelow2To14) {
  for (int32_t d = 1; d <= 300; ++d)
    for (int32_t n = 0; n < (1 << 14); ++n) expect_divides(d, n);
}

TEST(InvariantDivisor, NumeratorsNearTheTopOfTheRange) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> any(1, INT32_MAX);
  for (int32_t d : {1, 2, 3, 7, 16, 24, 128, 1000, 65537, 1 << 20, INT32_MAX - 1, INT32_MAX}) {
    for (int32_t n = INT32_MAX - 4096; n > 0 && n <= INT32_MAX - 1; ++n) expect_divides(d, n);
    expect_divides(d, INT32_MAX);
    for (int i = 0; i < 100000; ++i) expect_divides(d, any(rng));
  }
}

TEST(InvariantDivisor, RefusesDivisorsOutOfRange) {
  EXPECT_THROW(InvariantDivisor(0), core::Error);
  EXPECT_THROW(InvariantDivisor(-3), core::Error);
  EXPECT_THROW(InvariantDivisor(int64_t{1} << 31), core::Error);
  EXPECT_EQ(InvariantDivisor(24).divisor(), 24);
}

}  // namespace
}  // namespace gpulab::kernels
