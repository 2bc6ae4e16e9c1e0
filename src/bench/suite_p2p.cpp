// gpulab bench p2p: every ordered GPU pair. Peer access, copy-engine bandwidth one way and both
// ways at once, SM kernels pushing to and pulling from the peer, and the load latency of peer
// memory. Bandwidths count the bytes that cross the link.
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

void enable_peer(int from, int to) {
  GPULAB_CHECK(cudaSetDevice(from));
  const cudaError_t e = cudaDeviceEnablePeerAccess(to, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();  // clear the sticky-free error state
    return;
  }
  GPULAB_CHECK(e);
}

std::string link_type(const core::DeviceInfo& a, const core::DeviceInfo& b, bool atomics) {
  const bool nvlink = std::count(a.nvlink_active.begin(), a.nvlink_active.end(), true) > 0 &&
                      std::count(b.nvlink_active.begin(), b.nvlink_active.end(), true) > 0;
  if (nvlink) return atomics ? "NVLink" : "NVLink (no native atomics?)";
  return "PCIe";
}

}  // namespace

void run_p2p_suite(Context& ctx) {
  int count = 0;
  GPULAB_CHECK(cudaGetDeviceCount(&count));
  if (count < 2) {
    ctx.note("skipped: needs 2 GPUs (" + std::to_string(count) + " visible)");
    ctx.finish("p2p");
    return;
  }
  const auto devices = core::query_devices();
  const size_t size = ctx.quick() ? size_t(128) << 20 : size_t(512) << 20;
  const TimingPlan plan{ctx.quick() ? 5 : 15, 2.0, 20.0};
  auto bw = [&](const std::vector<double>& ms, double bytes) {
    std::vector<double> v;
    for (double t : ms) v.push_back(per_second_1e9(bytes, t));
    return summarize(v);
  };
  for (int i = 0; i < count; ++i)
    for (int j = 0; j < count; ++j) {
      if (i == j) continue;
      int can = 0, atomics = 0;
      GPULAB_CHECK(cudaDeviceCanAccessPeer(&can, i, j));
      GPULAB_CHECK(cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, i, j));
      const std::string pair = std::to_string(i) + "to" + std::to_string(j);
      const std::string link = link_type(devices[i], devices[j], atomics != 0);
      const nlohmann::json params = {{"src", i}, {"dst", j}, {"bytes", size}, {"peer_access", can != 0}, {"link", link}};
      if (can) {
        enable_peer(i, j);
        enable_peer(j, i);
      } else {
        ctx.note("GPU " + std::to_string(i) + " -> " + std::to_string(j) + ": no peer access; copies go through host memory");
      }
      GPULAB_CHECK(cudaSetDevice(i));
      core::DeviceBuffer<> src_i(size), dst_i(size);
      core::Stream si;
      core::Event fork;  // recorded on si: created on i
      GPULAB_CHECK(cudaSetDevice(j));
      core::DeviceBuffer<> src_j(size), dst_j(size);
      core::Stream sj;
      core::Event join;  // recorded on sj: created on j
      GPULAB_CHECK(cudaSetDevice(i));

      ctx.add(make_row("p2p", "ce_one_way_" + pair, "bandwidth", "GB/s",
                       bw(time_on_stream(si, [&] { GPULAB_CHECK(cudaMemcpyPeerAsync(dst_j.get(), j, src_i.get(), i, size, si)); }, plan), double(size)),
                       std::nullopt, params));
      ctx.add(make_row("p2p", "ce_both_ways_" + pair, "bandwidth", "GB/s",
                       bw(time_on_stream(si, [&] {
                            fork.record(si);
                            GPULAB_CHECK(cudaStreamWaitEvent(sj, fork.get()));
                            GPULAB_CHECK(cudaMemcpyPeerAsync(dst_j.get(), j, src_i.get(), i, size, si));
                            GPULAB_CHECK(cudaMemcpyPeerAsync(dst_i.get(), i, src_j.get(), j, size, sj));
                            join.record(sj);
                            GPULAB_CHECK(cudaStreamWaitEvent(si, join.get()));
                          }, plan), 2.0 * size),
                       std::nullopt, params));
      if (!can) continue;
      // SM kernels on GPU i: stores into j's memory (push), loads from it (pull).
      ctx.add(make_row("p2p", "sm_push_" + pair, "bandwidth", "GB/s",
                       bw(time_on_stream(si, [&] { kernels::stream_copy(dst_j.get(), src_i.get(), size, si); }, plan), double(size)),
                       std::nullopt, params));
      ctx.add(make_row("p2p", "sm_pull_" + pair, "bandwidth", "GB/s",
                       bw(time_on_stream(si, [&] { kernels::stream_copy(dst_i.get(), src_j.get(), size, si); }, plan), double(size)),
                       std::nullopt, params));
      // Latency: GPU i chases pointers through 64 MiB of j's memory.
      const size_t chase_bytes = std::min<size_t>(size, 64u << 20);
      const std::vector<uint32_t> next = random_cycle(chase_bytes, 128, 7);
      GPULAB_CHECK(cudaMemcpy(src_j.get(), next.data(), chase_bytes, cudaMemcpyHostToDevice));
      const std::vector<double> ns =
          chase_latency(reinterpret_cast<const uint32_t*>(src_j.get()), 10000, 3, si).ns_per_load;
      ctx.add(make_row("p2p", "latency_" + pair, "latency", "ns", summarize(ns), std::nullopt, params));
    }
  GPULAB_CHECK(cudaSetDevice(ctx.options().device));
  ctx.note("link type from NVML's active NVLink links on both GPUs, else PCIe");
  ctx.finish("p2p (" + std::to_string(count) + " GPUs)");
}

}  // namespace gpulab::bench
