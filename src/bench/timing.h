// The timing protocol every suite uses: warm up, then repeated samples bracketed by CUDA events,
// each sample long enough (several calls when one is short) that event resolution does not matter.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <vector>

namespace gpulab::bench {

struct TimingPlan {
  int samples = 30;
  double min_sample_ms = 1.0;  // calls per sample grow until a sample lasts this long
  double warmup_ms = 50.0;
};

// Milliseconds per call of `enqueue` (which enqueues one call on `stream`), one entry per sample.
std::vector<double> time_on_stream(cudaStream_t stream, const std::function<void()>& enqueue,
                                   const TimingPlan& plan);
// The same with a host clock around each call (for work that is not stream-ordered, and for
// host-side costs); `call` must be complete when it returns.
std::vector<double> time_on_host(const std::function<void()>& call, const TimingPlan& plan);

// Bytes or operations per millisecond → per second in units of 1e9 (GB/s, GFLOP/s...).
inline double per_second_1e9(double amount, double ms) { return amount / (ms * 1e-3) / 1e9; }

}  // namespace gpulab::bench
