#include "bench/timing.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"
#include "core/memory.h"
#include "core/sanitizer.h"

namespace gpulab::bench {

std::vector<double> time_on_stream(cudaStream_t stream, const std::function<void()>& enqueue,
                                   const TimingPlan& plan) {
  core::Event begin, end;
  auto run = [&](int calls) {
    begin.record(stream);
    for (int i = 0; i < calls; ++i) enqueue();
    end.record(stream);
    end.synchronize();
    float ms = 0;
    GPULAB_CHECK(cudaEventElapsedTime(&ms, begin.get(), end.get()));
    return double(ms);
  };
  // Under racecheck the figures mean nothing (its instrumentation slows kernels unevenly) and
  // each launch costs host memory, the more in NVIDIA's racy kernels: the decode suite's quick
  // pass (10 samples, each as many calls as fill 1 ms, after 20 ms of them) took 124.7 GiB of a
  // 128 GiB machine in its first 90 s (session 44; that the launch count did it is our reading).
  // Two single calls there, each waited for: every kernel still runs, checked (and a call below
  // the events' resolution still gives a finite rate, as the clamp below does for `calls`).
  const auto single = [&] { return std::max(run(1), 1e-4); };
  if (core::under_racecheck()) return {single(), single()};
  const double first = single();
  const int calls = std::clamp(int(std::ceil(plan.min_sample_ms / first)), 1, 10000);
  for (double warm = first; warm < plan.warmup_ms;) warm += run(calls);
  std::vector<double> out;
  for (int s = 0; s < plan.samples; ++s) out.push_back(run(calls) / calls);
  return out;
}

std::vector<double> time_on_host(const std::function<void()>& call, const TimingPlan& plan) {
  using clock = std::chrono::steady_clock;
  auto run = [&](int calls) {
    const auto t0 = clock::now();
    for (int i = 0; i < calls; ++i) call();
    return std::chrono::duration<double, std::milli>(clock::now() - t0).count();
  };
  const double first = std::max(run(1), 1e-6);
  const int calls = std::clamp(int(std::ceil(plan.min_sample_ms / first)), 1, 100000);
  for (double warm = first; warm < plan.warmup_ms;) warm += run(calls);
  std::vector<double> out;
  for (int s = 0; s < plan.samples; ++s) out.push_back(run(calls) / calls);
  return out;
}

}  // namespace gpulab::bench
