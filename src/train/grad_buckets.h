// Gradient buckets for data parallelism: the packed gradient buffer cut into contiguous runs of
// whole parameters, each reduced by one all-reduce as soon as backward has finished all of its
// parameters. Pure planning, no GPU.
#pragma once

#include <cstdint>
#include <vector>

namespace gpulab::train {

struct GradBucket {
  int64_t begin = 0, end = 0;  // elements [begin, end) of the packed gradients
  int first = 0, last = 0;     // parameters first..last (packed order), inclusive
  int ready_after = 0;         // how many entries of the backward order complete it, minus one
};

// Buckets over parameters of `counts` elements (packed order), each at most `bucket_elems` (a
// larger parameter is a bucket alone), cut from the end of the buffer (the classifier, whose
// gradients backward finishes first) toward the stem. Returned in launch order, the order in which
// `backward_order` (a permutation of the parameter indices) completes them. Throws
// core::InputError for a size below one element and core::Error for an order that is not a
// permutation.
std::vector<GradBucket> plan_buckets(const std::vector<int64_t>& counts, const std::vector<int>& backward_order,
                                     int64_t bucket_elems);

}  // namespace gpulab::train
