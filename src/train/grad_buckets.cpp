#include "train/grad_buckets.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace gpulab::train {

std::vector<GradBucket> plan_buckets(const std::vector<int64_t>& counts, const std::vector<int>& backward_order,
                                     int64_t bucket_elems) {
  if (bucket_elems < 1) throw core::InputError("gradient buckets need at least one element");
  const int n = int(counts.size());
  std::vector<int> position(size_t(n), -1);  // of each parameter in the backward order
  if (int(backward_order.size()) != n) throw core::Error("backward order does not list every parameter once");
  for (int i = 0; i < n; ++i) {
    const int p = backward_order[size_t(i)];
    if (p < 0 || p >= n || position[size_t(p)] >= 0) throw core::Error("backward order is not a permutation");
    position[size_t(p)] = i;
  }
  std::vector<int64_t> offset(size_t(n) + 1, 0);
  for (int p = 0; p < n; ++p) offset[size_t(p) + 1] = offset[size_t(p)] + counts[size_t(p)];

  std::vector<GradBucket> buckets;
  for (int last = n - 1; last >= 0;) {
    int first = last;
    while (first > 0 && offset[size_t(last) + 1] - offset[size_t(first) - 1] <= bucket_elems) --first;
    GradBucket b{offset[size_t(first)], offset[size_t(last) + 1], first, last, 0};
    for (int p = first; p <= last; ++p) b.ready_after = std::max(b.ready_after, position[size_t(p)]);
    buckets.push_back(b);
    last = first - 1;
  }
  std::sort(buckets.begin(), buckets.end(),
            [](const GradBucket& a, const GradBucket& b) { return a.ready_after < b.ready_after; });
  return buckets;
}

}  // namespace gpulab::train
