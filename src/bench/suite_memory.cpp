// gpulab bench memory: HBM bandwidth four ways, L2 bandwidth, and load latency at each level.
// Bandwidths count bytes read plus bytes written.
#include <algorithm>
#include <numeric>
#include <random>

#include "bench/chase.h"
#include "bench/suite.h"
#include "bench/timing.h"
#include "core/memory.h"
#include "kernels/membench.h"

namespace gpulab::bench {

namespace {


}  // namespace

void run_memory_suite(Context& ctx) {
  core::Stream stream;
  const auto& dev = ctx.device();
  const TimingPlan plan{ctx.quick() ? 10 : 30, 2.0, 50.0};
  size_t free_bytes = 0, total = 0;
  GPULAB_CHECK(cudaMemGetInfo(&free_bytes, &total));
  const size_t size = std::min<size_t>(ctx.quick() ? (512u << 20) : (1u << 30), free_bytes / 4) & ~size_t(4095);
  core::DeviceBuffer<> a(size), b(size);
  core::DeviceBuffer<uint32_t> sink(1);
  GPULAB_CHECK(cudaMemsetAsync(a.get(), 0x5a, size, stream));
  GPULAB_CHECK(cudaMemsetAsync(sink.get(), 0, sink.bytes(), stream));  // the read kernel xors into it
  const auto hbm_peak = ctx.datasheet().memory_gbps;
  const nlohmann::json params = {{"bytes", size}};

  // The write kernel and the copies are checked once: a wrong probe must not report a number.
  kernels::stream_write(b.get(), size, 0x01020304u, stream);
  kernels::stream_copy(a.get(), b.get(), size, stream);
  std::vector<uint32_t> probe(4096);
  GPULAB_CHECK(cudaMemcpyAsync(probe.data(), static_cast<std::byte*>(a.get()) + size - probe.size() * 4, probe.size() * 4, cudaMemcpyDeviceToHost, stream));
  stream.synchronize();
  if (std::any_of(probe.begin(), probe.end(), [](uint32_t w) { return w != 0x01020304u; }))
    throw core::Error("memory probe: the copy kernel did not copy the pattern");

  auto bw = [&](const std::vector<double>& ms, double bytes) {
    std::vector<double> gbps;
    for (double t : ms) gbps.push_back(per_second_1e9(bytes, t));
    return summarize(gbps);
  };
  const auto ce = bw(time_on_stream(stream, [&] { GPULAB_CHECK(cudaMemcpyAsync(b.get(), a.get(), size, cudaMemcpyDeviceToDevice, stream)); }, plan), 2.0 * size);
  const auto sm = bw(time_on_stream(stream, [&] { kernels::stream_copy(b.get(), a.get(), size, stream); }, plan), 2.0 * size);
  const auto rd = bw(time_on_stream(stream, [&] { kernels::stream_read(a.get(), size, 1, sink.get(), stream); }, plan), double(size));
  const auto wr = bw(time_on_stream(stream, [&] { kernels::stream_write(b.get(), size, 7u, stream); }, plan), double(size));
  const double ceiling = std::max(ce.median, sm.median);
  ctx.set_ceiling("hbm_copy", ceiling);
  for (auto [name, s] : {std::pair{"hbm_copy_memcpy_d2d", ce}, {"hbm_copy_sm_kernel", sm}, {"hbm_read_only", rd}, {"hbm_write_only", wr}}) {
    Row row = make_row("memory", name, "bandwidth", "GB/s", s, hbm_peak, params);
    row.ceiling = ceiling;
    ctx.add(row);
  }

  // L2: a working set of half the L2, read over and over inside one launch.
  const size_t l2_set = (dev.l2_bytes / 2) & ~size_t(4095);
  const int passes = int(std::max<size_t>(1, (size_t(2) << 30) / l2_set));
  kernels::stream_read(a.get(), l2_set, 1, sink.get(), stream);
  const auto l2 = bw(time_on_stream(stream, [&] { kernels::stream_read(a.get(), l2_set, passes, sink.get(), stream); }, plan), double(l2_set) * passes);
  Row l2row = make_row("memory", "l2_read", "bandwidth", "GB/s", l2, std::nullopt, {{"bytes", l2_set}, {"passes", passes}});
  ctx.add(l2row);
  ctx.note("L2 working set " + std::to_string(l2_set >> 20) + " MiB (half of the " + std::to_string(dev.l2_bytes >> 20) + " MiB L2); % ceiling is of the faster HBM copy");

  // Latency: one thread, dependent loads over a random cycle with 128-byte spacing.
  struct Level { const char* name; size_t bytes; long steps; };
  const Level levels[] = {{"latency_l1", 16u << 10, 200000},
                          {"latency_l2", std::max<size_t>(dev.l2_bytes / 4, 1u << 20), 100000},
                          {"latency_hbm", std::min<size_t>(std::max<size_t>(dev.l2_bytes * 4, 256u << 20), size), 20000}};
  for (const auto& level : levels) {
    const auto next = random_cycle(level.bytes, 128, 42);
    GPULAB_CHECK(cudaMemcpyAsync(a.get(), next.data(), next.size() * 4, cudaMemcpyHostToDevice, stream));
    const ChaseResult chase = chase_latency(reinterpret_cast<const uint32_t*>(a.get()), level.steps, ctx.quick() ? 3 : 7, stream);
    const std::vector<double>& ns = chase.ns_per_load;
    const double cycles = chase.cycles_per_load;
    ctx.add(make_row("memory", level.name, "latency", "ns", summarize(ns), std::nullopt,
                     {{"working_set_bytes", level.bytes}, {"stride_bytes", 128}, {"cycles_per_load", cycles}}));
  }
  ctx.finish("memory (" + std::to_string(size >> 20) + " MiB buffers)");
}

}  // namespace gpulab::bench
