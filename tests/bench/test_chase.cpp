// The pointer-chase cycle: one cycle through every node, so a chase never repeats a line before
// it has visited them all.
#include <gtest/gtest.h>

#include <vector>

#include "bench/chase.h"

TEST(Chase, RandomCycleVisitsEveryNodeOnce) {
  for (size_t spacing : {size_t(4), size_t(128)}) {
    const size_t bytes = 4096 * spacing, step = spacing / 4, nodes = bytes / spacing;
    const std::vector<uint32_t> next = gpulab::bench::random_cycle(bytes, spacing, 42);
    ASSERT_EQ(next.size(), bytes / 4);
    std::vector<bool> seen(nodes, false);
    uint32_t j = 0;
    for (size_t k = 0; k < nodes; ++k) {
      ASSERT_EQ(j % step, 0u);
      ASSERT_FALSE(seen[j / step]) << "node " << j / step << " revisited after " << k << " loads";
      seen[j / step] = true;
      j = next[j];
    }
    EXPECT_EQ(j, 0u);  // back at the start after exactly `nodes` loads
  }
}
