// gpulab bench power: NVML board power while cuBLASLt bf16 GEMMs (8192³, or --sizes' first) keep the
// GPU busy, and the TFLOP/s per watt that gives. The GEMM's result is verified first, like in the
// gemm suite.
#include <chrono>

#include "bench/gemm_data.h"
#include "bench/suite.h"
#include "bench/timing.h"
#include "blas/matmul.h"
#include "core/gpu_sampler.h"
#include "core/memory.h"
#include "core/nvml.h"

namespace gpulab::bench {

void run_power_suite(Context& ctx) {
  auto& nvml = core::Nvml::get();
  const std::string bus = ctx.device().pci_bus_id;
  if (!nvml.available() || !nvml.power_watts(bus)) {
    ctx.note("skipped: NVML power readings are unavailable (" + (nvml.available() ? std::string("no power sensor") : nvml.unavailable_reason()) + ")");
    ctx.finish("power");
    return;
  }
  using core::DType;
  const int64_t n = ctx.options().sizes.empty() ? 8192 : ctx.options().sizes.front();
  const std::string gemm = "bf16_gemm_" + std::to_string(n);
  const uint64_t elems = uint64_t(n) * n;
  core::Stream stream;
  blas::Blas blas;
  core::DeviceBuffer<float> a32(elems), b32(elems), ref(elems);
  core::DeviceBuffer<> a(elems * 2), b(elems * 2), c(elems * 2);
  fill_integer_matrix(DType::f32, a32.get(), n, n, false, 1, stream);
  fill_integer_matrix(DType::f32, b32.get(), n, n, false, 2, stream);
  fill_integer_matrix(DType::bf16, a.get(), n, n, false, 1, stream);
  fill_integer_matrix(DType::bf16, b.get(), n, n, false, 2, stream);
  blas.matmul({n, n, n}, {DType::f32, DType::f32, DType::f32}, a32.get(), b32.get(), ref.get(), stream);
  const blas::MatmulTypes bf16{DType::bf16, DType::bf16, DType::bf16};
  GPULAB_CHECK(cudaMemsetAsync(c.get(), 0xff, c.bytes(), stream));
  blas.matmul({n, n, n}, bf16, a.get(), b.get(), c.get(), stream);
  if (const uint64_t wrong = count_mismatches(DType::bf16, c.get(), ref.get(), elems, 0, 0, stream))
    throw core::Error("power: the bf16 GEMM gave " + std::to_string(wrong) + " wrong elements");

  // A sampling thread reads power every 50 ms while the GEMMs run in timed chunks.
  const double seconds = ctx.quick() ? 3.0 : 10.0;
  core::GpuSampler sampler(core::nvml_reader(bus), std::chrono::milliseconds(50));
  std::vector<double> tflops;
  core::EventTimer timer(stream);
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds) {
    constexpr int kChunk = 20;
    timer.start();
    for (int i = 0; i < kChunk; ++i) blas.matmul({n, n, n}, bf16, a.get(), b.get(), c.get(), stream);
    tflops.push_back(kChunk * 2.0 * n * n * n / (timer.stop() * 1e-3) / 1e12);
  }
  const std::vector<core::GpuReading> readings = sampler.stop();
  std::vector<double> watts, temps;
  for (const core::GpuReading& r : readings) {
    if (r.power_w) watts.push_back(*r.power_w);
    if (r.temperature_c) temps.push_back(*r.temperature_c);
  }
  // The sampler's last reading is taken as the last chunk ends (stop() reads once more).
  const std::optional<unsigned> clock_during = readings.back().sm_clock_mhz;
  // The first second ramps up; keep the samples after it when there are enough.
  const size_t skip = watts.size() > 40 ? 20 : 0;
  const std::vector<double> steady(watts.begin() + skip, watts.end());
  if (steady.empty()) throw core::Error("power: no NVML samples were taken");
  const Summary w = summarize(steady), t = summarize(tflops);
  const nlohmann::json params = {{"m", n}, {"n", n}, {"k", n}, {"seconds", seconds}, {"power_samples", steady.size()},
                                 {"temperature_c_max", temps.empty() ? 0.0 : summarize(temps).max},
                                 {"sm_clock_mhz_during", clock_during ? int(*clock_during) : -1}};
  ctx.add(make_row("power", gemm + "_tflops", "throughput", "TFLOP/s", t, ctx.datasheet().bf16_tflops, params));
  ctx.add(make_row("power", gemm + "_board_power", "power", "W", w, ctx.datasheet().tdp_watts, params));
  std::vector<double> per_watt;
  for (double x : tflops) per_watt.push_back(x / w.median);
  ctx.add(make_row("power", gemm + "_tflops_per_watt", "efficiency", "TFLOP/s/W", summarize(per_watt), std::nullopt, params));
  if (ctx.device().mig_enabled.value_or(false)) ctx.note("MIG is on: board power covers every instance, not only this one");
  ctx.note("% peak of power is of the datasheet TDP");
  ctx.finish("power");
}

}  // namespace gpulab::bench
