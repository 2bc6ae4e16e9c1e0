// Gradient bucketing for data parallelism and the backward order it follows.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "train/grad_buckets.h"
#include "train/resnet_config.h"

using namespace gpulab;
using namespace gpulab::train;

namespace {
void expect_bucket(const GradBucket& b, int first, int last, int64_t begin, int64_t end, int ready_after) {
  EXPECT_EQ(b.first, first);
  EXPECT_EQ(b.last, last);
  EXPECT_EQ(b.begin, begin);
  EXPECT_EQ(b.end, end);
  EXPECT_EQ(b.ready_after, ready_after);
}
}  // namespace

TEST(GradBuckets, CutFromTheEndAndLaunchedInBackwardOrder) {
  const std::vector<int64_t> counts = {10, 20, 30, 40, 50};  // offsets 0, 10, 30, 60, 100, 150
  // Reverse order: {4} (50; +40 > 60), {3} (40; +30 > 60), {0, 1, 2} (60 fits exactly).
  std::vector<GradBucket> b = plan_buckets(counts, {4, 3, 2, 1, 0}, 60);
  ASSERT_EQ(b.size(), 3u);
  expect_bucket(b[0], 4, 4, 100, 150, 0);
  expect_bucket(b[1], 3, 3, 60, 100, 1);
  expect_bucket(b[2], 0, 2, 0, 60, 4);
  // Parameter 3 finishes first: its bucket launches first; {0,1,2} waits for its last member.
  b = plan_buckets(counts, {3, 1, 4, 2, 0}, 60);
  ASSERT_EQ(b.size(), 3u);
  expect_bucket(b[0], 3, 3, 60, 100, 0);
  expect_bucket(b[1], 4, 4, 100, 150, 2);
  expect_bucket(b[2], 0, 2, 0, 60, 4);
  // A parameter larger than the bucket size is a bucket of its own; a huge size is one bucket.
  b = plan_buckets(counts, {4, 3, 2, 1, 0}, 35);
  ASSERT_EQ(b.size(), 4u);  // {4}, {3}, {2}, {0, 1}
  expect_bucket(b[3], 0, 1, 0, 30, 4);
  b = plan_buckets(counts, {4, 3, 2, 1, 0}, 1 << 30);
  ASSERT_EQ(b.size(), 1u);
  expect_bucket(b[0], 0, 4, 0, 150, 4);
}

TEST(GradBuckets, BadInputs) {
  EXPECT_THROW(plan_buckets({1, 2}, {1, 0}, 0), core::InputError);
  EXPECT_THROW(plan_buckets({1, 2}, {1, 1}, 4), core::Error);
  EXPECT_THROW(plan_buckets({1, 2}, {1}, 4), core::Error);
  EXPECT_THROW(plan_buckets({1, 2}, {2, 0}, 4), core::Error);
}

TEST(ResNetBackwardOrder, ClassifierFirstBlocksFromTheLastStemLast) {
  const ResNetLayout l = resnet_layout({50, 1000, 64, false});
  const std::vector<ParamSpec> specs = resnet_params(l);
  const std::vector<int> order = resnet_backward_order(l);
  ASSERT_EQ(order.size(), specs.size());
  std::vector<int> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) ASSERT_EQ(sorted[i], int(i)) << "a permutation";
  auto name = [&](size_t i) { return specs[size_t(order[i])].name; };
  EXPECT_EQ(name(0), "fc.weight");
  EXPECT_EQ(name(1), "fc.bias");
  EXPECT_EQ(name(2), "layer4.2.conv3.weight");
  EXPECT_EQ(name(3), "layer4.2.bn3.weight");
  EXPECT_EQ(name(4), "layer4.2.bn3.bias");
  EXPECT_EQ(name(5), "layer4.2.conv2.weight");
  // layer4.0: conv3, conv2, conv1, then the shortcut.
  const auto at = [&](const std::string& n) {
    for (size_t i = 0; i < order.size(); ++i)
      if (name(i) == n) return i;
    return order.size();
  };
  EXPECT_EQ(at("layer4.0.downsample.0.weight"), at("layer4.0.conv1.weight") + 3);
  EXPECT_EQ(at("layer3.5.conv3.weight"), at("layer4.0.downsample.1.bias") + 1);
  EXPECT_EQ(name(order.size() - 3), "conv1.weight");
  EXPECT_EQ(name(order.size() - 1), "bn1.bias");
}

TEST(GradBuckets, Resnet50At25MegabytesCoversEveryParameterOnce) {
  const ResNetLayout l = resnet_layout({50, 1000, 64, false});
  const std::vector<ParamSpec> specs = resnet_params(l);
  std::vector<int64_t> counts;
  for (const auto& p : specs) counts.push_back(p.count);
  const std::vector<int> order = resnet_backward_order(l);
  const int64_t cap = (int64_t(25) << 20) / 4;
  const std::vector<GradBucket> buckets = plan_buckets(counts, order, cap);
  const int64_t total = resnet_param_count(l);  // 25.6 M parameters, 102 MB of fp32
  EXPECT_GE(buckets.size(), 5u);
  EXPECT_LE(buckets.size(), 6u);
  std::vector<int> owner(specs.size(), -1);
  int64_t covered = 0;
  for (size_t k = 0; k < buckets.size(); ++k) {
    const GradBucket& b = buckets[k];
    EXPECT_EQ(b.begin, std::accumulate(counts.begin(), counts.begin() + b.first, int64_t(0)));
    EXPECT_EQ(b.end - b.begin, std::accumulate(counts.begin() + b.first, counts.begin() + b.last + 1, int64_t(0)));
    EXPECT_TRUE(b.end - b.begin <= cap || b.first == b.last) << "bucket " << k << " too large";
    if (k > 0) {
      EXPECT_GT(b.ready_after, buckets[k - 1].ready_after) << "launch order";
    }
    int last_pos = -1;
    for (int p = b.first; p <= b.last; ++p) {
      EXPECT_EQ(owner[size_t(p)], -1) << specs[size_t(p)].name << " in two buckets";
      owner[size_t(p)] = int(k);
      last_pos = std::max(last_pos, int(std::find(order.begin(), order.end(), p) - order.begin()));
    }
    EXPECT_EQ(b.ready_after, last_pos) << "bucket " << k << " launches when its last parameter is done";
    // Filled greedily: the next parameter toward the stem would not have fitted.
    if (b.first > 0) {
      EXPECT_GT(b.end - b.begin + counts[size_t(b.first) - 1], cap);
    }
    covered += b.end - b.begin;
  }
  EXPECT_EQ(covered, total);
  EXPECT_EQ(std::count(owner.begin(), owner.end(), -1), 0);
  // The classifier and the last block go first; the stem rides in the last bucket.
  EXPECT_EQ(buckets.front().last, int(specs.size()) - 1);
  EXPECT_EQ(buckets.back().first, 0);
}
