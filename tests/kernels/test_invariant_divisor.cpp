// InvariantDivisor against the `/` and `%` operators, on the host (the device takes the same
// arithmetic, with __umulhi for the high word).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "core/error.h"
#include "kernels/invariant_divisor.h"

namespace gpulab::kernels {
namespace {

void expect_divides(const InvariantDivisor& f, int32_t n) {
  const int32_t q = f.div(n), d = f.divisor();
  ASSERT_EQ(q, n / d) << n << " / " << d;
  ASSERT_EQ(f.mod(n, q), n % d) << n << " % " << d;
}

TEST(InvariantDivisor, SmallDivisorsOverEveryNumeratorBelow2To14) {
  for (int32_t d = 1; d <= 300; ++d) {
    const InvariantDivisor f(d);
    for (int32_t n = 0; n < (1 << 14); ++n) expect_divides(f, n);
  }
}

TEST(InvariantDivisor, NumeratorsNearTheTopOfTheRange) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> any(1, INT32_MAX);
  for (int32_t d : {1, 2, 3, 7, 16, 24, 128, 1000, 65537, 1 << 20, INT32_MAX - 1, INT32_MAX}) {
    const InvariantDivisor f(d);
    for (int32_t n = INT32_MAX - 4096; n < INT32_MAX; ++n) expect_divides(f, n);
    expect_divides(f, INT32_MAX);
    for (int i = 0; i < 100000; ++i) expect_divides(f, any(rng));
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
