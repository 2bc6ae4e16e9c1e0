// gpulab bench gemm: cuBLASLt per precision and the GEMM ladder, square sizes 512..16384.
// Every variant is verified before it is timed: inputs are integers in [-2, 2], so each product
// is exact and the fp32 reference (cuBLASLt in strict fp32) is exact; outputs must equal it after
// rounding through their own type (fp32, fp16, bf16), tf32 and fp8 within a tolerance. Inputs
// rotate among enough copies to exceed the L2 twice over.
#include <cuda_profiler_api.h>
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

#include "bench/gemm_data.h"
#include "bench/suite.h"
#include "bench/timing.h"
#include "blas/matmul.h"
#include "core/memory.h"
#include "kernels/gemm_ladder.h"

namespace gpulab::bench {

namespace {

using core::DType;
using kernels::GemmStep;

struct Variant {
  std::string name;
  std::string precision;  // datasheet column and ceiling key
  DType input, output;
  bool library;
  GemmStep step = GemmStep::naive;
  int64_t max_size = 1 << 30;  // slow steps stop early: the naive kernel at 16384 takes minutes
  double rtol = 0;             // 0: exact
  bool outer_vector = false;   // fp8 scaled per row of A and per column of C (the LLaMA engine's fp8 layers)
};

std::vector<Variant> variants() {
  return {
      {"cublaslt_fp32", "fp32", DType::f32, DType::f32, true},
      {"cublaslt_tf32", "tf32", DType::f32, DType::f32, true, GemmStep::naive, 1 << 30, 1e-3},
      {"cublaslt_fp16", "fp16", DType::f16, DType::f16, true},
      {"cublaslt_bf16", "bf16", DType::bf16, DType::bf16, true},
      {"cublaslt_fp8e4m3", "fp8e4m3", DType::f8e4m3, DType::bf16, true, GemmStep::naive, 1 << 30, 1e-2},
      {"cublaslt_fp8e4m3_rowwise", "fp8e4m3", DType::f8e4m3, DType::bf16, true, GemmStep::naive, 1 << 30, 1e-2, true},
      {"ladder1_naive_fp32", "fp32", DType::f32, DType::f32, false, GemmStep::naive, 4096},
      {"ladder2_smem_tiled_fp32", "fp32", DType::f32, DType::f32, false, GemmStep::smem_tiled, 8192},
      {"ladder3_register_blocked_fp32", "fp32", DType::f32, DType::f32, false, GemmStep::register_blocked},
      {"ladder4_mma_sync_fp16", "fp16", DType::f16, DType::f32, false, GemmStep::mma_sync},
      {"ladder4_mma_sync_bf16", "bf16", DType::bf16, DType::f32, false, GemmStep::mma_sync},
      {"ladder5_wgmma_bf16", "bf16", DType::bf16, DType::f32, false, GemmStep::wgmma},
  };
}

// fp8 through cuBLASLt and the wgmma step want B stored n×k; everything else takes B as k×n.
bool b_transposed(const Variant& v) {
  return v.library ? v.input == DType::f8e4m3 : kernels::gemm_step_b_transposed(v.step);
}

// The variants --only selects (all when it is empty).
std::vector<Variant> selected_variants(const Options& options) {
  std::vector<Variant> out;
  for (const Variant& v : variants())
    if (options.only.empty() || std::ranges::find(options.only, v.name) != options.only.end()) out.push_back(v);
  return out;
}

}  // namespace

void check_gemm_options(const Options& options) {
  for (const std::string& name : options.only)
    if (std::ranges::none_of(variants(), [&](const Variant& v) { return v.name == name; })) {
      std::string valid;
      for (const Variant& v : variants()) valid += (valid.empty() ? "" : ", ") + v.name;
      throw core::InputError("--only: no gemm variant '" + name + "'; the variants are " + valid);
    }
  for (const int64_t n : options.sizes)
    if (n < 1 || n > INT32_MAX) throw core::InputError("--sizes: " + std::to_string(n) + " is not a size from 1 to 2^31-1");
}

void run_gemm_suite(Context& ctx) {
  const std::vector<int64_t> sizes = !ctx.options().sizes.empty() ? ctx.options().sizes
                                     : ctx.quick()                 ? std::vector<int64_t>{4096, 8192}
                                                                   : std::vector<int64_t>{512, 1024, 2048, 4096, 8192, 16384};
  core::Stream stream;
  blas::Blas blas;
  // Autotuned as a demanding user (and torch through cuBLAS's own heuristics) would: the first
  // call of each shape times the heuristic's candidates and keeps the fastest.
  constexpr int kAutotuneCandidates = 16;
  blas.set_autotune(kAutotuneCandidates);
  // fp8 per-tensor scales: powers of two whose product is 1, so the result stays exact;
  // 16 bytes apart because cuBLASLt wants each scale pointer 16-byte aligned.
  core::DeviceBuffer<float> scales(8);
  const float scale_values[8] = {0.5f, 0.f, 0.f, 0.f, 2.f, 0.f, 0.f, 0.f};
  GPULAB_CHECK(cudaMemcpy(scales.get(), scale_values, sizeof scale_values, cudaMemcpyHostToDevice));
  const blas::Fp8Scales fp8_scales{scales.get(), scales.get() + 4};
  const size_t l2 = ctx.device().l2_bytes;

  for (const int64_t n : sizes) {
    const uint64_t elems = uint64_t(n) * n;
    const double flops = 2.0 * n * n * n;
    size_t free_bytes = 0, total = 0;
    GPULAB_CHECK(cudaMemGetInfo(&free_bytes, &total));
    if (free_bytes < elems * 4 * 6) {
      ctx.note(std::to_string(n) + "³ skipped: needs " + std::to_string(elems * 24 >> 20) + " MiB free");
      continue;
    }
    // The reference: strict fp32 cuBLASLt on the seed-0 integer matrices.
    core::DeviceBuffer<float> ref;
    if (!ctx.attempt("gemm reference at " + std::to_string(n) + "³", [&] {
      core::DeviceBuffer<float> a32(elems), b32(elems);
      ref = core::DeviceBuffer<float>(elems);
      fill_integer_matrix(DType::f32, a32.get(), n, n, false, 1, stream);
      fill_integer_matrix(DType::f32, b32.get(), n, n, false, 2, stream);
      blas.matmul({n, n, n}, {DType::f32, DType::f32, DType::f32, core::MathMode::strict_fp32}, a32.get(), b32.get(), ref.get(), stream);
      stream.synchronize();
    }))
      continue;  // recorded as failed; the next size may still fit
    for (const Variant& v : selected_variants(ctx.options())) {
      // A variant that throws (a launch error, memory) is recorded as failed; the others still run.
      ctx.attempt(v.name + " at " + std::to_string(n) + "³", [&] {
        if (n > v.max_size) return;
        if (!v.library) {
          if (!kernels::gemm_step_available(v.step)) {
            if (n == sizes.front()) ctx.note(v.name + ": not available on this device or build");
            return;
          }
          const std::string rule = kernels::gemm_step_size_rule(v.step, n, n, n);
          if (!rule.empty()) {
            ctx.note(v.name + " skipped: " + rule);
            return;
          }
        }
        const size_t in_bytes = core::dtype_size(v.input) * elems;
        const int sets = int(std::clamp<size_t>((2 * l2 + 2 * in_bytes - 1) / (2 * in_bytes), 1, 64));
        std::vector<core::DeviceBuffer<>> as, bs;
        for (int s = 0; s < sets; ++s) {
          as.emplace_back(in_bytes);
          bs.emplace_back(in_bytes);
          // Set 0 is the reference's matrices; the others only feed the timing.
          fill_integer_matrix(v.input, as.back().get(), n, n, false, s == 0 ? 1 : 1000 + s, stream);
          fill_integer_matrix(v.input, bs.back().get(), n, n, b_transposed(v), s == 0 ? 2 : 2000 + s, stream);
        }
        core::DeviceBuffer<> c(core::dtype_size(v.output) * elems);
        // Outer-vector scales: 0.5 per row, 2 per column, so the result stays exact.
        core::DeviceBuffer<float> row_scales(v.outer_vector ? n : 0), col_scales(v.outer_vector ? n : 0);
        if (v.outer_vector) {
          const std::vector<float> half(n, 0.5f), two(n, 2.f);
          GPULAB_CHECK(cudaMemcpy(row_scales.get(), half.data(), n * 4, cudaMemcpyHostToDevice));
          GPULAB_CHECK(cudaMemcpy(col_scales.get(), two.data(), n * 4, cudaMemcpyHostToDevice));
        }
        const blas::Fp8Scales scales = v.input != DType::f8e4m3 ? blas::Fp8Scales{}
                                       : v.outer_vector       ? blas::Fp8Scales{row_scales.get(), col_scales.get(), true}
                                                              : fp8_scales;
        auto run = [&](int s) {
          if (v.library) {
            const core::MathMode math = v.precision == "tf32" ? core::MathMode::tf32 : core::MathMode::strict_fp32;
            blas.matmul({n, n, n, false, b_transposed(v)}, {v.input, v.input, v.output, math}, as[s].get(), bs[s].get(),
                        c.get(), stream, 1.f, 0.f, scales);
          } else {
            kernels::gemm_ladder(v.step, v.input, as[s].get(), bs[s].get(), reinterpret_cast<float*>(c.get()), n, n, n, stream);
          }
        };
        GPULAB_CHECK(cudaMemsetAsync(c.get(), 0xff, c.bytes(), stream));  // NaN: unwritten elements fail
        run(0);
        const uint64_t wrong = count_mismatches(v.output, c.get(), ref.get(), elems, v.rtol > 0 ? 1e-2 : 0, v.rtol, stream);
        if (wrong) {
          ctx.fail("verification of " + v.name + " at " + std::to_string(n) + "³: " + std::to_string(wrong) + " of " +
                   std::to_string(elems) + " elements wrong; not timed");
          return;
        }
        int next = 0;
        const TimingPlan plan{ctx.quick() ? 10 : 20, 5.0, 100.0};
        // Profilers see only the timed launches: ncu --profile-from-start off (bench/ncu_mma.sh)
        // and nsys --capture-range cudaProfilerApi start here, and the NVTX range names the row.
        nvtxRangePushA((v.name + "_" + std::to_string(n)).c_str());
        GPULAB_CHECK(cudaProfilerStart());
        const auto ms = time_on_stream(stream, [&] { run(next); next = (next + 1) % sets; }, plan);
        GPULAB_CHECK(cudaProfilerStop());
        nvtxRangePop();
        std::vector<double> tflops;
        for (double t : ms) tflops.push_back(flops / (t * 1e-3) / 1e12);
        const Summary s = summarize(tflops);
        const std::string key = "gemm_" + v.precision + "_" + std::to_string(n);
        const bool sets_ceiling = v.library && !v.outer_vector;  // rowwise fp8 is measured against per-tensor
        if (sets_ceiling) ctx.set_ceiling(key, s.median);
        Row row = make_row("gemm", v.name + "_" + std::to_string(n), "throughput", "TFLOP/s", s, gemm_peak(ctx.datasheet(), v.precision),
                           {{"m", n}, {"n", n}, {"k", n}, {"input", core::dtype_name(v.input)}, {"output", core::dtype_name(v.output)},
                            {"precision", v.precision}, {"verified", v.rtol > 0 ? "tolerance" : "exact"}, {"input_sets", sets},
                            {"median_ms", percentile(ms, 50)}});
        if (v.library)
          row.result.params["algorithm"] = blas.autotune() > 1 ? "fastest of up to " + std::to_string(blas.autotune()) +
                                                                     " cuBLASLt heuristic candidates"
                                                               : "cuBLASLt heuristic's first choice";
        if (!sets_ceiling) row.ceiling = ctx.ceiling(key);
        else row.ceiling = s.median;
        ctx.add(row);
      });
    }
  }
  ctx.note("% ceiling: of cuBLASLt at the same size and input precision (ladder steps write fp32 C; cuBLASLt fp16/bf16 write their own type; fp8 rowwise against fp8 per-tensor)");
  ctx.finish("gemm (square m = n = k, dense)");
}

nlohmann::json measure_gemm_variant(const std::string& variant, int64_t n) {
  Options options;
  options.only = {variant};
  options.sizes = {n};
  check_gemm_options(options);
  core::require_devices();
  GPULAB_CHECK(cudaGetDevice(&options.device));
  const core::DeviceInfo device = core::query_device(options.device);
  std::ostringstream table;
  Context ctx(options, device, load_datasheet(device.name), table);
  run_gemm_suite(ctx);
  const std::string name = variant + "_" + std::to_string(n);
  if (!ctx.failed())
    for (const nlohmann::json& r : ctx.log().results())
      if (r["name"].get<std::string>() == name) return r;
  throw core::Error("bench gemm's " + name + " gave no figure:\n" + table.str());
}

}  // namespace gpulab::bench
