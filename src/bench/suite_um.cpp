// gpulab bench um: managed memory. On-demand migration (a kernel touching pages that live on the
// host) against an explicit prefetch, and the way back. Never more managed memory than half of
// the free device memory (and at most a few GB) unless --allow-oversubscription.
#include <chrono>
#include <cstring>
#include <memory>

#include "bench/suite.h"
#include "bench/timing.h"
#include "core/log.h"
#include "core/memory.h"
#include "kernels/membench.h"

namespace gpulab::bench {

namespace {

struct ManagedFree {
  void operator()(std::byte* p) const { GPULAB_CHECK_NOTHROW(cudaFree(p)); }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void run_um_suite(Context& ctx) {
  const int dev = ctx.options().device;
  int concurrent = 0;
  GPULAB_CHECK(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, dev));
  if (!concurrent) {
    ctx.note("skipped: this device/OS does not support on-demand page migration (concurrentManagedAccess = 0)");
    ctx.finish("um");
    return;
  }
  size_t free_bytes = 0, total = 0;
  GPULAB_CHECK(cudaMemGetInfo(&free_bytes, &total));
  size_t size = std::min<size_t>(ctx.quick() ? size_t(1) << 30 : size_t(4) << 30, free_bytes / 2);
  const bool oversubscribe = ctx.options().allow_oversubscription;
  if (oversubscribe) {
    size = total + total / 4;
    if (core::query_host().memory_total < 2 * size)
      throw core::InputError("um --allow-oversubscription needs host memory of twice 1.25x the GPU's memory (" +
                             std::to_string(2 * size >> 30) + " GiB); this host has less");
    core::log_warn("um: allocating " + std::to_string(size >> 20) + " MiB of managed memory, 1.25x the GPU's memory: pages will thrash and this is slow");
  }
  size &= ~((size_t(2) << 20) - 1);  // whole 2 MiB pages
  std::byte* raw = nullptr;
  GPULAB_CHECK(cudaMallocManaged(&raw, size));
  std::unique_ptr<std::byte, ManagedFree> p(raw);
  core::Stream stream;
  core::DeviceBuffer<uint32_t> sink(1);
  GPULAB_CHECK(cudaMemsetAsync(sink.get(), 0, sink.bytes(), stream));  // the read kernel xors into it
  core::EventTimer timer(stream);
  const int reps = ctx.quick() ? 3 : 5;
  const cudaMemLocation on_device{cudaMemLocationTypeDevice, dev}, on_host{cudaMemLocationTypeHost, 0};
  const nlohmann::json params = {{"bytes", size}, {"oversubscribed", oversubscribe}};
  std::vector<double> demand, prefetch_h2d, resident, host_read, prefetch_d2h;
  auto gbps = [&](double ms) { return per_second_1e9(double(size), ms); };
  for (int r = 0; r < reps; ++r) {
    std::memset(p.get(), r + 1, size);  // pages now live on the host
    timer.start();
    kernels::stream_read(p.get(), size, 1, sink.get(), stream);
    demand.push_back(gbps(timer.stop()));
    if (oversubscribe) continue;  // a prefetch larger than the GPU only evicts itself

    std::memset(p.get(), r + 2, size);
    timer.start();
    GPULAB_CHECK(cudaMemPrefetchAsync(p.get(), size, on_device, 0, stream));
    prefetch_h2d.push_back(gbps(timer.stop()));
    timer.start();
    kernels::stream_read(p.get(), size, 1, sink.get(), stream);
    resident.push_back(gbps(timer.stop()));

    kernels::stream_write(p.get(), size, 0x01010101u * (r + 3), stream);  // pages now on the device
    stream.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t acc = 0;
    const auto* words = reinterpret_cast<const uint64_t*>(p.get());
    for (size_t i = 0; i < size / 8; i += 512) acc += words[i];  // one word per 4 KiB page faults every page in
    const double host_s = seconds_since(t0);
    if (acc != uint64_t(size / 8 / 512) * (0x0101010101010101ull * uint64_t(r + 3)))
      throw core::Error("um: the host read back something other than what the device wrote");
    host_read.push_back(per_second_1e9(double(size), host_s * 1e3));

    kernels::stream_write(p.get(), size, 7u, stream);
    timer.start();
    GPULAB_CHECK(cudaMemPrefetchAsync(p.get(), size, on_host, 0, stream));
    prefetch_d2h.push_back(gbps(timer.stop()));
  }
  auto add = [&](const char* name, const std::vector<double>& v, const char* ceiling_key) {
    if (v.empty()) return;
    Row row = make_row("um", name, "bandwidth", "GB/s", summarize(v), std::nullopt, params);
    row.ceiling = ctx.ceiling(ceiling_key);
    ctx.add(row);
  };
  add("on_demand_device_read_of_host_pages", demand, "h2d_pinned");
  add("prefetch_to_device", prefetch_h2d, "h2d_pinned");
  add("device_read_after_prefetch", resident, "hbm_copy");
  add("host_touch_of_device_pages", host_read, "d2h_pinned");
  add("prefetch_to_host", prefetch_d2h, "d2h_pinned");
  ctx.note(std::to_string(size >> 20) + " MiB managed; % ceiling is of the pinned copies (transfer suite) or the HBM copy (memory suite) when those ran");
  ctx.note("host_touch_of_device_pages: bytes migrated per second while the host touches one word per 4 KiB page");
  ctx.finish("um (unified memory)");
}

}  // namespace gpulab::bench
