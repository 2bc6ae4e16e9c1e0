#include <gtest/gtest.h>

#include "bench/collective.h"
#include "bench/stats.h"
#include "core/error.h"

using namespace gpulab::bench;

TEST(Stats, MedianOfOddAndEvenCounts) {
  EXPECT_DOUBLE_EQ(percentile({5, 1, 3}, 50), 3);
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile({7}, 50), 7);
}

TEST(Stats, PercentilesInterpolateLikeNumpy) {
  // numpy.percentile(range(1, 11), [0, 10, 90, 100]) = 1, 1.9, 9.1, 10
  std::vector<double> v;
  for (int i = 10; i >= 1; --i) v.push_back(i);
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1);
  EXPECT_NEAR(percentile(v, 10), 1.9, 1e-12);
  EXPECT_NEAR(percentile(v, 90), 9.1, 1e-12);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 10);
  EXPECT_NEAR(percentile(v, 25), 3.25, 1e-12);
}

TEST(Stats, SummaryHasMedianAndSpread) {
  const Summary s = summarize({3, 100, 2, 1, 4, 5, 6, 7, 8, 9, 10});
  EXPECT_EQ(s.count, 11u);
  EXPECT_DOUBLE_EQ(s.median, 6);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 100);
  EXPECT_DOUBLE_EQ(s.p10, 2);
  EXPECT_DOUBLE_EQ(s.p90, 10);
}

TEST(Stats, EmptyOrBadInputThrows) {
  EXPECT_THROW(summarize({}), gpulab::core::Error);
  EXPECT_THROW(percentile({}, 50), gpulab::core::Error);
  EXPECT_THROW(percentile({1}, 101), gpulab::core::Error);
}

TEST(Collective, BusBandwidthFactorsMatchNcclTests) {
  EXPECT_DOUBLE_EQ(busbw_factor(Collective::all_reduce, 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(busbw_factor(Collective::all_gather, 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(busbw_factor(Collective::reduce_scatter, 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(busbw_factor(Collective::broadcast, 8), 1.0);
  EXPECT_DOUBLE_EQ(busbw_factor(Collective::all_reduce, 2), 1.0);
  for (Collective c : kCollectives) EXPECT_DOUBLE_EQ(busbw_factor(c, 1), 0.0) << collective_name(c);
  EXPECT_THROW(busbw_factor(Collective::all_reduce, 0), gpulab::core::Error);
}

TEST(Collective, CountsFollowNcclTestsSize) {
  // 1 MiB of floats over 4 ranks.
  const size_t bytes = 1 << 20;
  EXPECT_EQ(send_count(Collective::all_reduce, bytes, 4, 4), 262144u);
  EXPECT_EQ(send_count(Collective::all_gather, bytes, 4, 4), 65536u);
  EXPECT_EQ(recv_count(Collective::all_gather, 65536, 4), 262144u);
  EXPECT_EQ(send_count(Collective::reduce_scatter, bytes, 4, 4), 262144u);
  EXPECT_EQ(recv_count(Collective::reduce_scatter, 262144, 4), 65536u);
  EXPECT_EQ(send_count(Collective::reduce_scatter, 40, 4, 3), 9u);  // whole pieces per rank
  EXPECT_EQ(send_count(Collective::broadcast, 8, 4, 2), 2u);
}
