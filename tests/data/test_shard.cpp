// Data-parallel sharding: disjoint shards that cover each epoch, a pure function of the seed and
// epoch, and the same samples as gradient accumulation on one process.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "core/error.h"
#include "data/sampling.h"
#include "data/shard.h"

using namespace gpulab::data;

TEST(Shard, EpochOrderIsASeededPermutation) {
  const std::vector<int64_t> a = epoch_order(1000, 7, 0, true);
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[size_t(i)], i);
  EXPECT_EQ(epoch_order(1000, 7, 0, true), a);
  EXPECT_NE(epoch_order(1000, 7, 1, true), a);
  EXPECT_NE(epoch_order(1000, 8, 0, true), a);
}

TEST(Shard, RanksAreDisjointAndCoverEveryFullGlobalBatch) {
  for (const int world : {1, 2, 3, 8}) {
    for (const int64_t samples : {int64_t(96), int64_t(103), int64_t(1000)}) {
      const int batch = 4;
      for (const int64_t epoch : {0, 1, 5}) {
        SCOPED_TRACE("world " + std::to_string(world) + " samples " + std::to_string(samples) + " epoch " +
                     std::to_string(epoch));
        const int64_t per_rank = shard_batches_per_epoch(samples, batch, world);
        ASSERT_EQ(per_rank, std::max<int64_t>(1, samples / (batch * world)));
        const std::vector<int64_t> order = epoch_order(samples, 42, epoch, true);
        std::set<int64_t> seen;
        for (int r = 0; r < world; ++r) {
          const std::vector<int64_t> mine = shard_samples(samples, batch, {r, world}, 42, epoch);
          ASSERT_EQ(int64_t(mine.size()), per_rank * batch);
          EXPECT_EQ(shard_samples(samples, batch, {r, world}, 42, epoch), mine) << "deterministic";
          for (const int64_t s : mine) {
            ASSERT_GE(s, 0);
            ASSERT_LT(s, samples);
            EXPECT_TRUE(seen.insert(s).second) << "sample " << s << " read twice (rank " << r << ")";
          }
        }
        // Together: exactly the first per_rank·world·batch samples of the epoch's order.
        const std::set<int64_t> expect(order.begin(), order.begin() + per_rank * world * batch);
        EXPECT_EQ(seen, expect);
      }
    }
  }
}

TEST(Shard, RankBatchesAreTheMicroBatchesOfOneProcessWithAccumulation) {
  // World W with batch B reads, at its step k, what one process reads in step k's W micro-batches.
  const int batch = 5, world = 4;
  for (int r = 0; r < world; ++r)
    for (int64_t k = 0; k < 10; ++k)
      for (int s = 0; s < batch; ++s)
        EXPECT_EQ(shard_position(k, s, batch, {r, world}), shard_position(k * world + r, s, batch, {0, 1}));
  // And the samples themselves, for a whole epoch.
  const std::vector<int64_t> one = shard_samples(400, batch, {0, 1}, 3, 2);
  for (int r = 0; r < world; ++r) {
    const std::vector<int64_t> mine = shard_samples(400, batch, {r, world}, 3, 2);
    for (size_t k = 0; k < mine.size() / batch; ++k)
      for (int s = 0; s < batch; ++s)
        ASSERT_EQ(mine[k * batch + size_t(s)], one[(k * world + size_t(r)) * batch + size_t(s)]);
  }
}

TEST(Shard, ADatasetSmallerThanOneGlobalBatchWraps) {
  // 10 samples, 2 ranks of batch 8: one batch each, positions past the end wrap.
  const std::vector<int64_t> order = epoch_order(10, 1, 0, true);
  const std::vector<int64_t> r1 = shard_samples(10, 8, {1, 2}, 1, 0);
  ASSERT_EQ(r1.size(), 8u);
  for (int s = 0; s < 8; ++s) EXPECT_EQ(r1[size_t(s)], order[size_t((8 + s) % 10)]);
}

TEST(Shard, RankOutsideTheWorldIsAnError) {
  EXPECT_THROW(shard_position(0, 0, 4, {2, 2}), gpulab::core::InputError);
  EXPECT_THROW(shard_position(0, 0, 4, {-1, 2}), gpulab::core::InputError);
  EXPECT_THROW(shard_batches_per_epoch(10, 0, 1), gpulab::core::InputError);
}
