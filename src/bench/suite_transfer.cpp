// gpulab bench transfer: host<->device copy bandwidth by size, pinned vs pageable, one way and
// both ways at once (two streams; the figure counts both directions' bytes).
#include <cstring>
#include <memory>

#include "bench/suite.h"
#include "bench/timing.h"
#include "core/memory.h"

namespace gpulab::bench {

namespace {

std::string size_name(size_t bytes) {
  if (bytes >= (1u << 30)) return std::to_string(bytes >> 30) + "GiB";
  if (bytes >= (1u << 20)) return std::to_string(bytes >> 20) + "MiB";
  return std::to_string(bytes >> 10) + "KiB";
}

}  // namespace

void run_transfer_suite(Context& ctx) {
  const size_t largest = ctx.quick() ? size_t(256) << 20 : size_t(1) << 30;
  std::vector<size_t> sizes;
  if (ctx.quick())
    sizes = {size_t(64) << 10, size_t(16) << 20, largest};
  else
    for (size_t s = 4096; s <= largest; s *= 4) sizes.push_back(s);
  core::PinnedBuffer<> pinned_in(largest), pinned_out(largest);
  auto pageable_in = std::make_unique<std::byte[]>(largest), pageable_out = std::make_unique<std::byte[]>(largest);
  std::memset(pinned_in.get(), 1, largest);
  std::memset(pageable_in.get(), 1, largest);  // touched, so page faults stay out of the timing
  std::memset(pageable_out.get(), 0, largest);
  core::DeviceBuffer<> dev_a(largest), dev_b(largest);
  core::Stream s1, s2;
  // The device-to-host copies read dev_b: give it defined bytes (compute-sanitizer's initcheck
  // flagged every one of them in session 32).
  GPULAB_CHECK(cudaMemsetAsync(dev_b.get(), 2, largest, s1));
  s1.synchronize();
  core::Event fork, join;

  for (size_t size : sizes) {
    const TimingPlan plan{ctx.quick() ? 10 : 20, 2.0, 20.0};
    const nlohmann::json params = {{"bytes", size}};
    auto add = [&](const std::string& what, const std::vector<double>& ms, double bytes) {
      std::vector<double> gbps;
      for (double t : ms) gbps.push_back(per_second_1e9(bytes, t));
      // The largest pinned copies are the ceilings the um suite's migrations are shown against.
      if (size == largest) ctx.set_ceiling(what, percentile(gbps, 50));
      ctx.add(make_row("transfer", what + "_" + size_name(size), "bandwidth", "GB/s", summarize(gbps), std::nullopt, params));
    };
    add("h2d_pinned", time_on_stream(s1, [&] { GPULAB_CHECK(cudaMemcpyAsync(dev_a.get(), pinned_in.get(), size, cudaMemcpyHostToDevice, s1)); }, plan), double(size));
    add("d2h_pinned", time_on_stream(s1, [&] { GPULAB_CHECK(cudaMemcpyAsync(pinned_out.get(), dev_b.get(), size, cudaMemcpyDeviceToHost, s1)); }, plan), double(size));
    add("bidir_pinned", time_on_stream(s1, [&] {
          fork.record(s1);
          GPULAB_CHECK(cudaStreamWaitEvent(s2, fork.get()));
          GPULAB_CHECK(cudaMemcpyAsync(dev_a.get(), pinned_in.get(), size, cudaMemcpyHostToDevice, s1));
          GPULAB_CHECK(cudaMemcpyAsync(pinned_out.get(), dev_b.get(), size, cudaMemcpyDeviceToHost, s2));
          join.record(s2);
          GPULAB_CHECK(cudaStreamWaitEvent(s1, join.get()));
        }, plan), 2.0 * size);
    // Pageable copies are staged by the driver and return late; time them with the host clock.
    add("h2d_pageable", time_on_host([&] {
          GPULAB_CHECK(cudaMemcpyAsync(dev_a.get(), pageable_in.get(), size, cudaMemcpyHostToDevice, s1));
          s1.synchronize();
        }, plan), double(size));
    add("d2h_pageable", time_on_host([&] {
          GPULAB_CHECK(cudaMemcpyAsync(pageable_out.get(), dev_b.get(), size, cudaMemcpyDeviceToHost, s1));
          s1.synchronize();
        }, plan), double(size));
  }
  const auto& d = ctx.device();
  if (d.pcie_generation) ctx.note("PCIe Gen" + std::to_string(*d.pcie_generation) + " x" + std::to_string(d.pcie_width.value_or(0)) + " (as the link reports now)");
  ctx.finish("transfer");
}

}  // namespace gpulab::bench
