// Each rule on synthetic traces: a trace with the pathology gives the rule (as the top finding
// where the pathology dominates) and a close variant without it does not.
#include <gtest/gtest.h>

#include "core/error.h"
#include "trace/rules.h"
#include "trace/synthetic.h"

using namespace gpulab::trace;
using namespace gpulab::trace::testing;

namespace {

// Big kernels queued ahead, back to back.
Synthetic healthy(int blocks = 264) {
  Synthetic s;
  for (int i = 0; i < 200; ++i) s.kernel(i * 5, 100 + i * 2002, 2000, blocks);
  return s;
}

void expect_top(const Report& r, const std::string& rule, Severity severity) {
  ASSERT_FALSE(r.findings.empty()) << "expected " << rule;
  EXPECT_EQ(r.findings[0].rule, rule) << rules_text(r);
  EXPECT_EQ(r.findings[0].severity, severity) << rules_text(r);
  EXPECT_FALSE(r.findings[0].fix.empty());
}

}  // namespace

TEST(Rules, HealthyTraceHasNoFindings) {
  const Report r = analyze(healthy().t);
  EXPECT_TRUE(r.findings.empty()) << rules_text(r);
  EXPECT_NEAR(r.summary["gpu_busy_percent"].get<double>(), 99.9, 0.05);
  EXPECT_EQ(r.summary["kernels"].get<int>(), 200);
}

TEST(Rules, EmptyTraceHasNoFindings) {
  const Report r = analyze(Trace{});
  EXPECT_TRUE(r.findings.empty());
  EXPECT_EQ(r.summary["span_ms"].get<double>(), 0.0);
}

TEST(Rules, TopKernelsSumGpuTimeByName) {
  Synthetic s;
  for (int i = 0; i < 6; ++i) s.kernel(i * 100, 10 + i * 100, i % 3 == 0 ? 30 : 10, 264, i % 3 == 0 ? "gemm" : "norm");
  const Report r = analyze(s.t);
  const auto& top = r.summary["top_kernels"];
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0]["name"].get<std::string>(), "gemm");  // 2 x 30 us beats 4 x 10 us
  EXPECT_EQ(top[0]["count"].get<int>(), 2);
  EXPECT_NEAR(top[0]["total_ms"].get<double>(), 0.06, 1e-9);
  EXPECT_NEAR(top[0]["mean_us"].get<double>(), 30.0, 1e-9);
  EXPECT_NEAR(top[0]["percent_of_kernel_time"].get<double>(), 60.0, 1e-9);
  EXPECT_EQ(top[1]["name"].get<std::string>(), "norm");
  EXPECT_EQ(top[1]["count"].get<int>(), 4);
}

TEST(Rules, LaunchBoundTinyKernels) {
  Synthetic s;
  for (int i = 0; i < 1000; ++i) s.kernel(i * 8, i * 8 + 5, 3, 264, i % 2 ? "add_kernel" : "scale_kernel");
  const Report r = analyze(s.t);
  expect_top(r, "launch_bound", Severity::high);
  EXPECT_NEAR(r.findings[0].time_lost_ms, 999 * 0.005, 1e-6);
  EXPECT_EQ(r.findings[0].evidence["short_kernels"].get<int>(), 1000);
  EXPECT_NEAR(r.findings[0].evidence["mean_gap_us"].get<double>(), 5.0, 1e-6);
  EXPECT_EQ(r.findings[0].evidence["top_offenders"].size(), 2u);
  EXPECT_EQ(r.findings.size(), 1u) << rules_text(r);  // the symptom is fully explained
}

TEST(Rules, LaunchBoundNeedsShortKernelsAndEnoughOfThem) {
  Synthetic few;
  for (int i = 0; i < 20; ++i) few.kernel(i * 8, i * 8 + 5, 3);
  EXPECT_EQ(find_rule(analyze(few.t), "launch_bound"), nullptr);
  EXPECT_TRUE(healthy().t.kernels.size() >= 50);
  EXPECT_EQ(find_rule(analyze(healthy().t), "launch_bound"), nullptr);
  // Overriding the minimum count makes the small trace speak.
  Thresholds th;
  th.set_from_text("launch_bound.min_count=10");
  EXPECT_NE(find_rule(analyze(few.t, th), "launch_bound"), nullptr);
}

// Host preprocessing of 8 ms before each 2 ms kernel.
Synthetic host_bound(bool queued_ahead, bool sync_before_launch = false) {
  Synthetic s;
  for (int i = 0; i < 50; ++i) {
    const double launch = queued_ahead ? i * 5.0 : i * 8003.0 + 8000;
    const double start = queued_ahead ? 10 + i * 8013.0 : launch + 10;
    // A synchronize that returns at once: the GPU was long idle, it is not the cause.
    if (sync_before_launch) s.api("cudaStreamSynchronize", launch - 4, launch - 1);
    s.kernel(launch, start, 2000);
  }
  return s;
}

TEST(Rules, HostStarvedWhenLaunchComesLate) {
  const Report r = analyze(host_bound(false).t);
  expect_top(r, "host_starved", Severity::high);
  EXPECT_NEAR(r.findings[0].time_lost_ms, 49 * 5.993, 1e-3);
  EXPECT_EQ(r.findings[0].evidence["gaps"].get<int>(), 49);
  EXPECT_EQ(find_rule(r, "low_gpu_utilization"), nullptr) << rules_text(r);
}

TEST(Rules, HostStarvedEvenWithAQuickSyncBeforeTheLaunch) {
  const Report r = analyze(host_bound(false, true).t);
  expect_top(r, "host_starved", Severity::high);
  EXPECT_NEAR(r.findings[0].time_lost_ms, 49 * 5.993, 1e-3);
  EXPECT_EQ(find_rule(r, "sync_api"), nullptr) << rules_text(r);
}

TEST(Rules, QueuedWorkWithGapsIsNotHostStarvedButLowUtilization) {
  const Report r = analyze(host_bound(true).t);
  EXPECT_EQ(find_rule(r, "host_starved"), nullptr);
  const Finding* low = find_rule(r, "low_gpu_utilization");
  ASSERT_NE(low, nullptr) << rules_text(r);
  EXPECT_NEAR(low->time_lost_ms, 49 * 6.013, 0.5);
  EXPECT_GT(low->evidence["flagged_chunks"].get<int>(), 25);
}

// Launch, kernel of 30 us, then a blocking call (named `sync_name`) or an async copy.
Synthetic blocking(const std::string& what) {
  Synthetic s;
  for (int i = 0; i < 500; ++i) {
    const double l = i * 38.5;
    s.kernel(l, l + 5, 30);
    if (what == "sync")
      s.api("cudaDeviceSynchronize", l + 3, l + 38);
    else if (what == "sync_skewed") {
      // The return lands 2 us before the kernel's converted end (GPU-to-host clock conversion),
      // and error checks run after it, one before and one inside the gap, before the next launch.
      s.api("cudaDeviceSynchronize", l + 3, l + 33);
      s.api("cudaGetLastError", l + 33.5, l + 34);
      s.api("cudaPeekAtLastError", l + 35.5, l + 36);
    }
    else if (what == "item" || what == "item_pinned") {
      // PyTorch's .item(): cudaMemcpyAsync into a pageable (or, as a control, pinned) host value,
      // waiting for the kernel before it, then a quick cudaStreamSynchronize.
      s.copy("cudaMemcpyAsync", l + 3, l + 37.8, l + 35.5, 2, CopyKind::dtoh, MemoryKind::device,
             what == "item" ? MemoryKind::pageable : MemoryKind::pinned, 4);
      s.api("cudaStreamSynchronize", l + 37.9, l + 38.1);
    } else if (what == "item_then_sync") {
      // PyTorch 2.11's .item(): cudaMemcpyAsync into pinned memory returns at once, then
      // cudaStreamSynchronize waits for the kernel and the copy.
      s.copy("cudaMemcpyAsync", l + 3, l + 4, l + 35.5, 2, CopyKind::dtoh, MemoryKind::device, MemoryKind::pinned, 4);
      s.api("cudaStreamSynchronize", l + 4.5, l + 38);
    } else if (what == "memcpy" || what == "memcpy_async")
      s.copy(what == "memcpy" ? "cudaMemcpy" : "cudaMemcpyAsync", l + 3, what == "memcpy" ? l + 38 : l + 4, l + 35.5, 2,
             CopyKind::dtoh, MemoryKind::device, MemoryKind::pinned, 4096);
    else if (what == "memset") {
      Memset m;
      m.correlation = s.api("cudaMemset", l + 3, l + 38);
      m.start_ns = us(l + 35.5);
      m.end_ns = us(l + 37.5);
      m.stream = 7;
      m.dst = MemoryKind::device;
      m.bytes = 4096;
      s.t.memsets.push_back(m);
    }
  }
  return s;
}

TEST(Rules, SyncApiAfterEveryKernel) {
  const Report r = analyze(blocking("sync").t);
  expect_top(r, "sync_api", Severity::high);
  EXPECT_NEAR(r.findings[0].time_lost_ms, 499 * 0.0085, 1e-3);  // ms rounded to 1 us
  EXPECT_EQ(r.findings[0].evidence["calls"].get<int>(), 500);
  EXPECT_EQ(r.findings[0].evidence["top_calls"][0]["name"], "cudaDeviceSynchronize");
}

TEST(Rules, SyncApiDespiteClockSkewAndAnErrorCheckInTheGap) {
  const Report r = analyze(blocking("sync_skewed").t);
  expect_top(r, "sync_api", Severity::high);
  EXPECT_NEAR(r.findings[0].time_lost_ms, 499 * 0.0085, 1e-3);
  EXPECT_EQ(r.findings[0].evidence["gaps_after_blocking_call"].get<int>(), 499);
}

TEST(Rules, SyncIssuedIntoAnIdleGpuIsNotTheCause) {
  // Kernels of 30 us queued 40 us apart: each gap opens before the host synchronizes and
  // launches, so the synchronize (begun inside the gap) did not drain anything.
  Synthetic s;
  for (int i = 0; i < 500; ++i) {
    const double l = i * 40.0;
    s.api("cudaStreamSynchronize", l - 4, l - 2);
    s.kernel(l, l + 5, 30);
  }
  const Report r = analyze(s.t);
  EXPECT_EQ(find_rule(r, "sync_api"), nullptr) << rules_text(r);
}

TEST(Rules, SyncReturningLongBeforeTheLaunchIsNotTheCause) {
  // Each 1 ms kernel is waited for only briefly (a synchronize that returns after 90 us, as for an
  // event), then the host works 900 us and launches the next kernel 10 us after the GPU drained.
  Synthetic s;
  for (int i = 0; i < 50; ++i) {
    const double p = i * 1100.0;
    s.kernel(p - 90, p, 1000);
    s.api("cudaEventSynchronize", p + 10, p + 100);
  }
  const Report r = analyze(s.t);
  EXPECT_EQ(find_rule(r, "sync_api"), nullptr) << rules_text(r);
}

TEST(Rules, NoSyncNoSyncFinding) {
  Synthetic s;
  for (int i = 0; i < 500; ++i) s.kernel(i * 4, 5 + i * 30.5, 30);
  const Report r = analyze(s.t);
  EXPECT_EQ(find_rule(r, "sync_api"), nullptr) << rules_text(r);
  EXPECT_TRUE(r.findings.empty()) << rules_text(r);
}

TEST(Rules, SyncMemcpyAndSyncMemset) {
  const Report copy = analyze(blocking("memcpy").t);
  // 6 us idle after each of 499 copies in a 19.25 ms span: 15.6 %.
  expect_top(copy, "sync_memcpy", Severity::medium);
  EXPECT_NEAR(copy.findings[0].time_lost_ms, 499 * 0.006, 1e-3);
  EXPECT_EQ(find_rule(copy, "sync_memset"), nullptr);
  EXPECT_EQ(find_rule(copy, "pageable_memcpy"), nullptr);
  const Report set = analyze(blocking("memset").t);
  expect_top(set, "sync_memset", Severity::medium);
  EXPECT_EQ(find_rule(set, "sync_memcpy"), nullptr);
  // An async copy into pageable memory blocks the host all the same (CUDA's API sync behaviour).
  const Report item = analyze(blocking("item").t);
  expect_top(item, "sync_memcpy", Severity::medium);
  EXPECT_NEAR(item.findings[0].time_lost_ms, 499 * 0.006, 1e-3);
  EXPECT_EQ(item.findings[0].evidence["top_calls"][0]["name"].get<std::string>(), "cudaMemcpyAsync");
  EXPECT_EQ(find_rule(item, "sync_api"), nullptr) << rules_text(item);  // that synchronize found the GPU idle
  const Report item_pinned = analyze(blocking("item_pinned").t);
  EXPECT_EQ(find_rule(item_pinned, "sync_memcpy"), nullptr) << rules_text(item_pinned);
  // A synchronize right after a device-to-host copy waits for that copy: a synchronous copy.
  const Report item_then_sync = analyze(blocking("item_then_sync").t);
  expect_top(item_then_sync, "sync_memcpy", Severity::medium);
  EXPECT_EQ(find_rule(item_then_sync, "sync_api"), nullptr) << rules_text(item_then_sync);
  const Report async = analyze(blocking("memcpy_async").t);
  EXPECT_EQ(find_rule(async, "sync_memcpy"), nullptr) << rules_text(async);
  EXPECT_EQ(find_rule(async, "sync_api"), nullptr) << rules_text(async);
}

// 20 x (64 MiB host-to-device copy, 500 us kernel).
Synthetic copies(MemoryKind host_kind, double copy_us, bool overlapped = false) {
  Synthetic s;
  constexpr int64_t kBytes = 64 << 20;
  for (int i = 0; i < 20; ++i) {
    const double t0 = i * (copy_us + 520);
    s.copy("cudaMemcpyAsync", t0, host_kind == MemoryKind::pageable ? t0 + copy_us + 3 : t0 + 3, t0 + 2, copy_us,
           CopyKind::htod, host_kind, MemoryKind::device, kBytes);
    s.kernel(t0 + copy_us + 4, t0 + copy_us + 10, 500);
    if (overlapped) s.kernel(t0 + 1, t0 + 2, copy_us, 264, "other_stream_kernel", 8);
  }
  return s;
}

TEST(Rules, PageableMemcpy) {
  const Report r = analyze(copies(MemoryKind::pageable, 8000).t);
  expect_top(r, "pageable_memcpy", Severity::high);
  EXPECT_EQ(r.findings[0].evidence["copies"].get<int>(), 20);
  EXPECT_EQ(r.findings[0].evidence["async_copies"].get<int>(), 20);
  // Expected pinned rate: 0.7 of the PCIe gen 5 x16 link (63 GB/s).
  const double pinned_us = double(64 << 20) / (0.7 * 3.938 * 16) / 1000;
  EXPECT_NEAR(r.findings[0].time_lost_ms, 20 * (8000 - pinned_us) / 1000, 0.01);
  EXPECT_EQ(find_rule(r, "pcie_saturation"), nullptr);
}

// Without a measured link (PyTorch traces) the generation is assumed from the compute capability;
// with neither, 10 GB/s is expected.
TEST(Rules, PageableMemcpyExpectationWithoutALink) {
  const auto lost_with = [](DeviceInfo d) {
    Synthetic s = copies(MemoryKind::pageable, 8000);
    s.t.devices[0] = d;
    const Report r = analyze(s.t);
    const Finding* f = find_rule(r, "pageable_memcpy");
    return f ? std::pair{f->time_lost_ms, f->evidence["link"].get<std::string>()} : std::pair{-1.0, std::string()};
  };
  const auto expected_loss = [](double gbps) { return 20 * (8000 - double(64 << 20) / gbps / 1000) / 1000; };
  auto [lost, link] = lost_with(DeviceInfo{"H200", 132, 0, 0, 9, 0});
  EXPECT_NEAR(lost, expected_loss(0.7 * 3.938 * 16), 0.01);
  EXPECT_EQ(link, "PCIe gen 5 x16 assumed from compute capability 9.0");
  std::tie(lost, link) = lost_with(DeviceInfo{"A100", 108, 0, 0, 8, 0});
  EXPECT_NEAR(lost, expected_loss(0.7 * 1.969 * 16), 0.01);
  EXPECT_EQ(link, "PCIe gen 4 x16 assumed from compute capability 8.0");
  std::tie(lost, link) = lost_with(DeviceInfo{"?", 132, 0, 0, 0, 0});
  EXPECT_NEAR(lost, expected_loss(10), 0.01);
  EXPECT_EQ(link, "unknown");
  // A measured link wins over the assumption.
  std::tie(lost, link) = lost_with(DeviceInfo{"H200", 132, 4, 8, 9, 0});
  EXPECT_NEAR(lost, expected_loss(0.7 * 1.969 * 8), 0.01);
  EXPECT_EQ(link, "PCIe gen 4 x8");
}

TEST(Rules, PinnedCopiesAreNotPageable) {
  const Report r = analyze(copies(MemoryKind::pinned, 8000).t);
  EXPECT_EQ(find_rule(r, "pageable_memcpy"), nullptr) << rules_text(r);
}

TEST(Rules, PcieSaturationWhenPinnedCopiesDominate) {
  const Report r = analyze(copies(MemoryKind::pinned, 1300).t);  // 51.6 GB/s on a 63 GB/s link
  expect_top(r, "pcie_saturation", Severity::high);
  EXPECT_NEAR(r.findings[0].time_lost_ms, 20 * 1.3, 1e-6);
  EXPECT_NEAR(r.findings[0].evidence["ceiling_gbps"]["HtoD"].get<double>(), 63.008, 1e-3);
}

TEST(Rules, PcieSaturationNegatives) {
  // Slow copies (5 GB/s) are not at the ceiling.
  EXPECT_EQ(find_rule(analyze(copies(MemoryKind::pinned, 13400).t), "pcie_saturation"), nullptr);
  // Copies hidden under kernels on another stream lose nothing.
  const Report hidden = analyze(copies(MemoryKind::pinned, 1300, true).t);
  EXPECT_EQ(find_rule(hidden, "pcie_saturation"), nullptr) << rules_text(hidden);
  // Without device info the best observed copy is the ceiling, and an explicit link overrides it.
  Synthetic s = copies(MemoryKind::pinned, 1300);
  s.t.devices.clear();
  EXPECT_NE(find_rule(analyze(s.t), "pcie_saturation"), nullptr);
  Thresholds th;
  th.set("pcie_saturation.link_gbps", 200);
  EXPECT_EQ(find_rule(analyze(s.t, th), "pcie_saturation"), nullptr);
}

// Kernel touching 64 MiB of managed memory, then the host touching it again.
Synthetic um(bool pingpong) {
  Synthetic s;
  for (int i = 0; i < 10; ++i) {
    const double b = i * 17000.0;
    s.kernel(b, b + 10, 10000);
    s.api("cudaDeviceSynchronize", b + 3, b + 10015);
    for (int j = 0; j < 64; ++j) {
      const uint64_t addr = 0x7f0000000000ull + uint64_t(j) * (1 << 20);
      if (pingpong || i == 0) s.um(UmKind::htod_migration, b + 20 + j * 100, 100, addr, 1 << 20);
      if (pingpong) {  // the host pulls pages back in smaller chunks than the GPU moved them
        s.um(UmKind::cpu_fault, b + 10020 + j * 100, 0, addr, 1);
        s.um(UmKind::dtoh_migration, b + 10020 + j * 100, 50, addr, 1 << 19);
        s.um(UmKind::dtoh_migration, b + 10070 + j * 100, 50, addr + (1 << 19), 1 << 19);
      }
    }
  }
  return s;
}

TEST(Rules, UnifiedMemoryPingPong) {
  const Report r = analyze(um(true).t);
  expect_top(r, "um_thrashing", Severity::high);
  EXPECT_NEAR(r.findings[0].evidence["remigration_ratio"].get<double>(), 20.0, 1e-9);
  EXPECT_EQ(r.findings[0].evidence["cpu_faults"].get<int>(), 640);
  // Host windows (9 x 6990 us) plus migrations inside kernels (10 x 6400 us).
  EXPECT_NEAR(r.findings[0].time_lost_ms, 9 * 6.990 + 10 * 6.4, 1e-3);
  EXPECT_EQ(find_rule(r, "host_starved"), nullptr) << rules_text(r);
}

TEST(Rules, OneWayMigrationIsNotThrashing) {
  const Report r = analyze(um(false).t);
  EXPECT_EQ(find_rule(r, "um_thrashing"), nullptr) << rules_text(r);
  EXPECT_NE(find_rule(r, "host_starved"), nullptr) << rules_text(r);
}

TEST(Rules, LowOccupancy) {
  const Report r = analyze(healthy(8).t);
  expect_top(r, "low_occupancy", Severity::high);
  EXPECT_NEAR(r.findings[0].time_lost_ms, 200 * 2.0 * (1 - 8.0 / 132), 1e-3);
  EXPECT_EQ(r.findings[0].evidence["sm_count"].get<int>(), 132);
  // Unknown SM count: the rule stays silent unless told.
  Synthetic s = healthy(8);
  s.t.devices.clear();
  EXPECT_EQ(find_rule(analyze(s.t), "low_occupancy"), nullptr);
  Thresholds th;
  th.set("low_occupancy.sm_count", 16);
  EXPECT_NE(find_rule(analyze(s.t, th), "low_occupancy"), nullptr);
  EXPECT_EQ(find_rule(analyze(healthy(132).t), "low_occupancy"), nullptr);
}

TEST(Rules, GpuIdleGaps) {
  Synthetic s;
  s.kernel(0, 10, 100000);
  s.kernel(5, 2100010, 100000);  // queued long before, started 2 s later: nothing explains it
  const Report r = analyze(s.t);
  const Finding* gap = find_rule(r, "gpu_idle_gaps");
  ASSERT_NE(gap, nullptr) << rules_text(r);
  EXPECT_NEAR(gap->time_lost_ms, 2000.0, 1e-6);
  EXPECT_EQ(gap->severity, Severity::high);
  EXPECT_EQ(gap->evidence["ranges_ms"][0][0].get<double>(), 100.0);

  Synthetic shorter;
  shorter.kernel(0, 10, 100000);
  shorter.kernel(5, 200010, 100000);
  EXPECT_EQ(find_rule(analyze(shorter.t), "gpu_idle_gaps"), nullptr);
}

TEST(Rules, FindingsAreRankedByTimeLost) {
  Synthetic s = host_bound(false);
  for (auto& k : s.t.kernels) k.grid = {4, 1, 1};  // adds low_occupancy, smaller than the starvation
  const Report r = analyze(s.t);
  ASSERT_GE(r.findings.size(), 2u) << rules_text(r);
  for (size_t i = 1; i < r.findings.size(); ++i) EXPECT_GE(r.findings[i - 1].time_lost_ms, r.findings[i].time_lost_ms);
  EXPECT_EQ(r.findings[0].rule, "host_starved");
  const auto j = report_json(r);
  EXPECT_EQ(j["findings"][0]["rule"], "host_starved");
  EXPECT_EQ(j["findings"][0]["severity"], "high");
  EXPECT_TRUE(j["findings"][0].contains("evidence"));
  EXPECT_TRUE(j["summary"].contains("span_ms"));
}

// A trace whose times span 73 years (its clock and base time allow up to 2^62 ns): the chunks
// of low_gpu_utilization lie inside the span. Their boundaries once overflowed int64 (length x
// chunk index), which fuzz_chrome_trace found (UBSan: crash_chunk_boundary_overflow).
TEST(Rules, ChunksOfAVeryLongSpanStayInsideIt) {
  Synthetic s;
  s.kernel(0, 1, 10);
  s.kernel(0.5, 2.3e15, 10);  // microseconds; queued at once, so the idle time is unexplained
  const Report r = analyze(s.t);
  const Finding* low = find_rule(r, "low_gpu_utilization");
  ASSERT_NE(low, nullptr) << rules_text(r);
  const double span_ms = 2.3e12;
  ASSERT_FALSE(low->evidence["flagged_ranges_ms"].empty());
  for (const auto& range : low->evidence["flagged_ranges_ms"]) {
    EXPECT_GE(range[0].get<double>(), 0) << range;
    EXPECT_LE(range[1].get<double>(), span_ms) << range;
    EXPECT_LT(range[0].get<double>(), range[1].get<double>()) << range;
  }
}

TEST(Thresholds, UnknownKeyOrBadValueIsAnInputError) {
  Thresholds th;
  EXPECT_THROW(th.set_from_text("launch_bound.nope=3"), gpulab::core::InputError);
  EXPECT_THROW(th.set_from_text("launch_bound.min_count"), gpulab::core::InputError);
  EXPECT_THROW(th.set_from_text("launch_bound.min_count=abc"), gpulab::core::InputError);
  EXPECT_THROW(th.set_from_text("launch_bound.min_count=3x"), gpulab::core::InputError);
  // Out of range: negative, or so large that the rules' integer conversions or loops would break.
  EXPECT_THROW(th.set_from_text("launch_bound.short_us=-1"), gpulab::core::InputError);
  EXPECT_THROW(th.set_from_text("host_starved.min_host_us=1e300"), gpulab::core::InputError);
  EXPECT_THROW(th.set_from_text("low_gpu_utilization.chunks=1e30"), gpulab::core::InputError);
  EXPECT_THROW(th.set_from_text("low_gpu_utilization.chunks=20000"), gpulab::core::InputError);
  th.set_from_text("gpu_idle_gaps.min_ms=250");
  EXPECT_EQ(th.get("gpu_idle_gaps.min_ms"), 250.0);
  for (const auto& id : rule_ids()) {
    bool has_key = false;
    for (const auto& [k, v] : th.values()) has_key |= k.rfind(id + ".", 0) == 0;
    EXPECT_TRUE(has_key) << id << " has no documented threshold";
  }
}
