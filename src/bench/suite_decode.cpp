// gpulab bench decode: the linear layers of one LLaMA-2-7B decode step at 1, 8 and 16 rows,
// kernels::skinny_gemm (norm / SwiGLU fused in) beside cuBLASLt with the kernels the unfused
// path launches before it. Decode is bound by reading the weights, so each figure is weight
// bytes per second, against the HBM copy ceiling.
#include <cmath>

#include "bench/suite.h"
#include "bench/timing.h"
#include "blas/matmul.h"
#include "core/memory.h"
#include "kernels/rmsnorm.h"
#include "kernels/silu_mul.h"
#include "kernels/skinny_gemm.h"

namespace gpulab::bench {

namespace {

using core::DType;
using kernels::SkinnyPrologue;

struct DecodeGemm {
  const char* name;
  int64_t n, k;
  SkinnyPrologue prologue;
  bool into_residual;  // float32 output, added to (o_proj, down); else bf16 written
};

constexpr DecodeGemm kGemms[] = {{"qkv", 12288, 4096, SkinnyPrologue::rmsnorm, false},
                                 {"o_proj", 4096, 4096, SkinnyPrologue::none, true},
                                 {"gate_up", 22016, 4096, SkinnyPrologue::rmsnorm, false},
                                 {"down", 4096, 11008, SkinnyPrologue::swiglu, true}};
constexpr int64_t kRowCounts[] = {1, 8, 16};

std::vector<float> download(const void* p, DType dt, int64_t count) {
  std::vector<std::byte> bytes(count * core::dtype_size(dt));
  GPULAB_CHECK(cudaMemcpy(bytes.data(), p, bytes.size(), cudaMemcpyDeviceToHost));
  std::vector<float> out(count);
  for (int64_t i = 0; i < count; ++i) out[i] = static_cast<float>(core::load_as_double(bytes.data(), dt, i));
  return out;
}

}  // namespace

void run_decode_suite(Context& ctx) {
  core::Stream stream;
  blas::Blas blas;
  blas.set_autotune(16);  // as the engine does for its decode GEMMs
  const TimingPlan plan{ctx.quick() ? 10 : 30, 1.0, 20.0};
  const int64_t rows = kernels::kSkinnyMaxRows;
  for (const DecodeGemm& g : kGemms) {
    const int64_t n = g.n, k = g.k, in_width = g.prologue == SkinnyPrologue::swiglu ? 2 * k : k;
    const size_t weight_bytes = n * k * 2;
    // Enough weight copies, used in turn, that each call reads its weights from HBM.
    const int64_t copies = std::max<int64_t>(2, (2 * ctx.device().l2_bytes + weight_bytes - 1) / weight_bytes);
    core::DeviceBuffer<uint16_t> w(copies * n * k), norm(k), act_in(rows * in_width), xn(rows * k), y_bf16(rows * n);
    core::DeviceBuffer<float> residual(rows * k), y_f32(rows * n), y_check(rows * n);
    for (auto* b : {&w, &norm, &act_in})
      GPULAB_CHECK(cudaMemsetAsync(b->get(), 0x3C, b->bytes(), stream));  // bf16 0x3C3C ≈ 0.0115
    GPULAB_CHECK(cudaMemsetAsync(residual.get(), 0x3F, residual.bytes(), stream));  // float ≈ 0.75
    const DType out_dt = g.into_residual ? DType::f32 : DType::bf16;
    void* y = g.into_residual ? static_cast<void*>(y_f32.get()) : y_bf16.get();
    const void* x = g.prologue == SkinnyPrologue::rmsnorm ? static_cast<const void*>(residual.get()) : act_in.get();
    const kernels::SkinnyInput in{x, g.prologue, norm.get(), 1e-5f};
    int64_t turn = 0;
    const auto weights = [&] { return w.get() + (turn++ % copies) * n * k; };
    const auto skinny = [&](int64_t m) {
      kernels::skinny_gemm(y, out_dt, g.into_residual, in, weights(), DType::bf16, m, n, k, stream);
    };
    const auto unfused = [&](int64_t m, void* out) {
      const void* a = act_in.get();
      if (g.prologue == SkinnyPrologue::rmsnorm) {
        kernels::rmsnorm(xn.get(), DType::bf16, residual.get(), DType::f32, norm.get(), m, k, 1e-5f, stream);
        a = xn.get();
      } else if (g.prologue == SkinnyPrologue::swiglu) {
        kernels::silu_mul(xn.get(), act_in.get(), m, k, DType::bf16, stream);
        a = xn.get();
      }
      blas.matmul({m, n, k, false, true}, {DType::bf16, DType::bf16, out_dt}, a, weights(), out, stream, 1.f,
                  g.into_residual ? 1.f : 0.f);
    };
    const std::string label = std::string("decode ") + g.name;
    ctx.attempt(label, [&] {
      // Verified first: both paths from the same zeroed output agree on every element.
      const auto once = [&](auto&& run, void* out) {
        GPULAB_CHECK(cudaMemsetAsync(out, 0, rows * n * core::dtype_size(out_dt), stream));
        turn = 0;
        run(out);
        stream.synchronize();
        return download(out, out_dt, rows * n);
      };
      const auto mine = once([&](void*) { skinny(rows); }, y);
      const auto theirs = once([&](void* out) { unfused(rows, out); }, g.into_residual ? y_check.get() : y);
      for (int64_t i = 0; i < rows * n; ++i)
        if (!(std::abs(mine[i] - theirs[i]) <= 1e-2f * std::abs(theirs[i]) + 1e-9f))
          throw core::Error("skinny_gemm and cuBLASLt disagree at element " + std::to_string(i) + ": " +
                            std::to_string(mine[i]) + " vs " + std::to_string(theirs[i]));
      for (int64_t m : kRowCounts) {
        const nlohmann::json params = {{"n", n}, {"k", k}, {"rows", m}, {"weight_bytes", weight_bytes},
                                       {"prologue", g.prologue == SkinnyPrologue::none      ? "none"
                                                    : g.prologue == SkinnyPrologue::rmsnorm ? "rmsnorm"
                                                                                            : "swiglu"}};
        for (bool fused : {true, false}) {
          std::vector<double> gbps;
          for (double ms : time_on_stream(stream, [&] { fused ? skinny(m) : unfused(m, y); }, plan))
            gbps.push_back(per_second_1e9(static_cast<double>(weight_bytes), ms));
          Row row = make_row("decode", std::string(fused ? "skinny_" : "cublaslt_") + g.name + "_m" + std::to_string(m),
                             "bandwidth", "GB/s", summarize(gbps), ctx.datasheet().memory_gbps, params);
          row.ceiling = ctx.ceiling("hbm_copy");
          ctx.add(row);
        }
      }
    });
  }
  ctx.note("weight bytes per second; cublaslt_* includes the rmsnorm / silu_mul launch the unfused path needs");
  ctx.finish("decode GEMMs of LLaMA-2-7B (bf16)");
}

}  // namespace gpulab::bench
