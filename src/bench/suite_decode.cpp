// gpulab bench decode: the linear layers of one LLaMA-2-7B decode step at 1, 2, 4, 8 and 16 rows,
// kernels::skinny_gemm (norm / SwiGLU fused in; its GEMV kernel where that takes the rows, on bf16
// and on e4m3 weights, and its tensor-core kernel) beside cuBLASLt with the kernels the unfused
// path launches before it.
// Decode is bound by reading the weights, so each figure is weight bytes per second, against the
// HBM copy ceiling. Then paged decode attention (one layer,
// LLaMA-2-7B and the GQA LLaMA-3-8B shape, batch 1 and 16, 256 and 2048 positions): time per
// call, and K+V bytes read per second.
#include <cuda_profiler_api.h>
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <random>

#include "bench/suite.h"
#include "bench/timing.h"
#include "blas/matmul.h"
#include "core/dtype.h"
#include "core/memory.h"
#include "kernels/attention.h"
#include "kernels/rmsnorm.h"
#include "kernels/silu_mul.h"
#include "kernels/skinny_gemm.h"

namespace gpulab::bench {

namespace {

using core::DType;
using kernels::SkinnyKernel;
using kernels::SkinnyPrologue;

// The skinny_gemm paths timed: its GEMV (bf16 weights, or e4m3 ones with per-channel scales) and
// its tensor-core kernel.
struct SkinnyPath {
  const char* name;
  SkinnyKernel kernel;
  DType weights;
};
constexpr SkinnyPath kGemv{"gemv", SkinnyKernel::gemv, DType::bf16},
    kGemvFp8{"gemv_fp8", SkinnyKernel::gemv, DType::f8e4m3}, kTensorCore{"skinny", SkinnyKernel::mma, DType::bf16};

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
constexpr int64_t kRowCounts[] = {1, 2, 4, 8, 16};

std::vector<float> download(const void* p, DType dt, int64_t count) {
  std::vector<std::byte> bytes(count * core::dtype_size(dt));
  GPULAB_CHECK(cudaMemcpy(bytes.data(), p, bytes.size(), cudaMemcpyDeviceToHost));
  std::vector<float> out(count);
  for (int64_t i = 0; i < count; ++i) out[i] = static_cast<float>(core::load_as_double(bytes.data(), dt, i));
  return out;
}

struct DecodeAttention {
  const char* name;
  int64_t q_heads, kv_heads;
};
constexpr DecodeAttention kAttentions[] = {{"7b", 32, 32}, {"8b", 32, 8}};  // head_dim 128, bf16
constexpr int64_t kAttentionBatches[] = {1, 16}, kAttentionContexts[] = {256, 2048};
constexpr int64_t kHeadDim = 128, kPageSize = 16;  // the engine's default page

// Sequence s owns pages s·pages .. (s+1)·pages - 1 of the cache, listed last page first so that
// the kernel must follow the table.
std::vector<int32_t> reversed_block_table(int64_t seqs, int64_t pages) {
  std::vector<int32_t> table(seqs * pages);
  for (int64_t i = 0; i < seqs * pages; ++i) table[i] = static_cast<int32_t>(seqs * pages - 1 - i);
  return table;
}

template <class T>
core::DeviceBuffer<T> upload(const std::vector<T>& host) {
  core::DeviceBuffer<T> d(host.size());
  GPULAB_CHECK(cudaMemcpy(d.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

using DecodeFn = decltype(&kernels::attention_decode);

// A decode attention path against attention_ref on sequences of 1, 100 and 300 positions (random
// bf16 keys, values and queries); throws on the first element off by more than bf16 rounding of
// the output, plus, on tensor cores, of the softmax weights (at most u·max|v| = 2^-8 · 2).
void verify_decode_attention(DecodeFn decode, bool tensor_cores, const kernels::AttentionShape& shape,
                             cudaStream_t stream) {
  const std::vector<int32_t> lens = {1, 100, 300};
  const int64_t seqs = 3, pages = (300 + kPageSize - 1) / kPageSize, qd = shape.q_heads * kHeadDim,
                kvd = shape.kv_heads * kHeadDim;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-2.f, 2.f);
  const auto random_bf16 = [&](int64_t n) {
    std::vector<uint16_t> bits(n);
    for (auto& b : bits) b = core::float_to_bf16_bits(dist(rng));
    return bits;
  };
  const auto k = random_bf16(seqs * pages * kPageSize * kvd), v = random_bf16(k.size()), q = random_bf16(seqs * qd);
  const auto table = reversed_block_table(seqs, pages);
  auto d_k = upload(k), d_v = upload(v), d_q = upload(q);
  auto d_table = upload(table), d_lens = upload(lens);
  core::DeviceBuffer<uint16_t> out(seqs * qd);
  core::DeviceBuffer<std::byte> ws(kernels::attention_decode_workspace(seqs, 300, shape));
  decode({out.get(), qd}, {d_q.get(), qd}, {d_k.get(), d_v.get(), d_table.get(), pages, kPageSize}, d_lens.get(), seqs,
         300, shape, ws.get(), DType::bf16, stream);
  GPULAB_CHECK(cudaStreamSynchronize(stream));
  const auto got = download(out.get(), DType::bf16, seqs * qd);
  const auto floats = [](const std::vector<uint16_t>& bits, int64_t from, int64_t count) {
    std::vector<float> f(count);
    for (int64_t i = 0; i < count; ++i) f[i] = core::bf16_bits_to_float(bits[from + i]);
    return f;
  };
  std::vector<float> want(seqs * qd);
  for (int64_t s = 0; s < seqs; ++s) {
    std::vector<float> ks(lens[s] * kvd), vs(lens[s] * kvd);
    for (int64_t p = 0; p < lens[s]; ++p) {
      const int64_t slot = table[s * pages + p / kPageSize] * kPageSize + p % kPageSize;
      std::copy_n(floats(k, slot * kvd, kvd).begin(), kvd, ks.begin() + p * kvd);
      std::copy_n(floats(v, slot * kvd, kvd).begin(), kvd, vs.begin() + p * kvd);
    }
    const auto qs = floats(q, s * qd, qd);
    kernels::attention_ref(want.data() + s * qd, qd, qs.data(), qd, ks.data(), vs.data(), kvd, 1, lens[s] - 1, shape);
  }
  for (int64_t i = 0; i < seqs * qd; ++i)
    if (!(std::abs(got[i] - want[i]) <= (tensor_cores ? 2 * 0x1p-8f : 1e-4f) + 1e-2f * std::abs(want[i])))
      throw core::Error("attention_decode and attention_ref disagree at element " + std::to_string(i) + ": " +
                        std::to_string(got[i]) + " vs " + std::to_string(want[i]));
}

// One layer's decode attention per batch and context: microseconds per call, and K+V bytes
// read per second against the HBM copy ceiling. Enough caches, used in turn, that each call
// reads from HBM as a layer of a real model does. Rows without a suffix time the path that
// attention_decode takes; rows ending in _cuda_cores or _tensor_cores, the other one (where the
// tensor cores apply at all), for the A/B.
void run_attention_rows(Context& ctx, cudaStream_t stream, const TimingPlan& plan) {
  for (const DecodeAttention& a : kAttentions) {
    const kernels::AttentionShape shape{a.q_heads, a.kv_heads, kHeadDim, 1.0f / std::sqrt(float(kHeadDim))};
    const int64_t qd = a.q_heads * kHeadDim, kvd = a.kv_heads * kHeadDim, q_stride = qd + 2 * kvd;
    const kernels::PagedKv probe{nullptr, nullptr, nullptr, 0, kPageSize};
    const bool auto_tc = kernels::attention_decode_uses_tensor_cores({nullptr, q_stride}, probe, shape, DType::bf16);
    struct Path {
      const char* suffix;
      DecodeFn decode;
      bool tensor_cores;
    };
    const Path paths[] = {{"", kernels::attention_decode, auto_tc},
                          auto_tc ? Path{"_cuda_cores", kernels::attention_decode_cuda_cores, false}
                                  : Path{"_tensor_cores", kernels::attention_decode_tensor_cores, true}};
    for (const Path& path : paths) {
      ctx.attempt(std::string("decode attention ") + a.name + path.suffix, [&] {
        verify_decode_attention(path.decode, path.tensor_cores, shape, stream);
        for (int64_t batch : kAttentionBatches)
          for (int64_t context : kAttentionContexts) {
            const int64_t pages = context / kPageSize, cache = batch * context * kvd;
            const double kv_bytes = 2.0 * cache * 2;  // K and V, bf16
            const int64_t copies =
                std::max<int64_t>(2, static_cast<int64_t>(std::ceil(2 * ctx.device().l2_bytes / kv_bytes)));
            core::DeviceBuffer<uint16_t> k(copies * cache), v(copies * cache), qkv(batch * q_stride), out(batch * qd);
            for (auto* b : {&k, &v, &qkv})
              GPULAB_CHECK(cudaMemsetAsync(b->get(), 0x3C, b->bytes(), stream));  // bf16 0x3C3C ≈ 0.0115
            auto table = upload(reversed_block_table(batch, pages));
            auto lens = upload(std::vector<int32_t>(batch, static_cast<int32_t>(context)));
            core::DeviceBuffer<std::byte> ws(kernels::attention_decode_workspace(batch, context, shape));
            int64_t turn = 0;
            const auto call = [&] {
              const int64_t at = (turn++ % copies) * cache;
              path.decode({out.get(), qd}, {qkv.get(), q_stride},
                          {k.get() + at, v.get() + at, table.get(), pages, kPageSize}, lens.get(), batch, context,
                          shape, ws.get(), DType::bf16, stream);
            };
            std::vector<double> us, gbps;
            for (double ms : time_on_stream(stream, call, plan)) {
              us.push_back(ms * 1e3);
              gbps.push_back(per_second_1e9(kv_bytes, ms));
            }
            const nlohmann::json params = {{"q_heads", a.q_heads}, {"kv_heads", a.kv_heads}, {"head_dim", kHeadDim},
                                           {"batch", batch},       {"context", context},   {"kv_bytes", kv_bytes},
                                           {"page_size", kPageSize}};
            const std::string name = std::string("attention_") + a.name + "_b" + std::to_string(batch) + "_ctx" +
                                     std::to_string(context) + path.suffix;
            ctx.add(make_row("decode", name + "_time", "latency", "us", summarize(us), std::nullopt, params));
            Row row =
                make_row("decode", name, "bandwidth", "GB/s", summarize(gbps), ctx.datasheet().memory_gbps, params);
            row.ceiling = ctx.ceiling("hbm_copy");
            ctx.add(row);
          }
      });
    }
  }
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
    // Enough weight copies, used in turn, that each call reads its weights from HBM, also where
    // it reads them as e4m3 (the first half of each copy).
    const int64_t copies = std::max<int64_t>(2, (4 * ctx.device().l2_bytes + weight_bytes - 1) / weight_bytes);
    core::DeviceBuffer<uint16_t> w(copies * n * k), norm(k), act_in(rows * in_width), xn(rows * k), y_bf16(rows * n);
    core::DeviceBuffer<float> residual(rows * k), y_f32(rows * n), y_check(rows * n);
    for (auto* b : {&w, &norm, &act_in})
      GPULAB_CHECK(cudaMemsetAsync(b->get(), 0x3C, b->bytes(), stream));  // bf16 0x3C3C ≈ 0.0115
    // Read as e4m3, the same bytes are 1.5 each: scaled back to the bf16 value, the fp8 GEMV's
    // products are the bf16 ones.
    const auto fp8_scales = upload(std::vector<float>(n, core::bf16_bits_to_float(0x3C3C) / 1.5f));
    GPULAB_CHECK(cudaMemsetAsync(residual.get(), 0x3F, residual.bytes(), stream));  // float ≈ 0.75
    // W8A8: the activation already in e4m3 (0x3C, 1.5) with a scale per row.
    core::DeviceBuffer<uint8_t> act_fp8(rows * k);
    GPULAB_CHECK(cudaMemsetAsync(act_fp8.get(), 0x3C, act_fp8.bytes(), stream));
    const auto row_scales = upload(std::vector<float>(rows, 0.5f));
    const DType out_dt = g.into_residual ? DType::f32 : DType::bf16;
    void* y = g.into_residual ? static_cast<void*>(y_f32.get()) : y_bf16.get();
    const void* x = g.prologue == SkinnyPrologue::rmsnorm ? static_cast<const void*>(residual.get()) : act_in.get();
    const kernels::SkinnyInput in{x, g.prologue, norm.get(), 1e-5f};
    int64_t turn = 0;
    const auto weights = [&] { return w.get() + (turn++ % copies) * n * k; };
    const auto skinny = [&](int64_t m, const SkinnyPath& path) {
      const bool fp8 = path.weights == DType::f8e4m3;
      kernels::skinny_gemm(y, out_dt, g.into_residual, in, {weights(), path.weights, fp8 ? fp8_scales.get() : nullptr},
                           m, n, k, stream, path.kernel);
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
    // W8A8 as the engine's fp8 decode runs it at 3-16 rows (its quantize kernel not timed):
    // skinny_gemm's kernel (`skinny`: automatic, or wgmma), or (nullopt) cuBLASLt's fp8
    // GEMM with the same outer-vector scales writing bf16 (it cannot add into float32; the engine
    // adds its product in another kernel).
    const auto w8a8 = [&](int64_t m, std::optional<SkinnyKernel> skinny, void* out) {
      if (skinny) {
        const kernels::SkinnyInput q{act_fp8.get(), SkinnyPrologue::none, nullptr, 0.f, row_scales.get()};
        const bool into_y = out == y;
        kernels::skinny_gemm(out, into_y ? out_dt : DType::bf16, into_y && g.into_residual, q,
                             {weights(), DType::f8e4m3, fp8_scales.get()}, m, n, k, stream, *skinny);
      } else {
        blas.matmul({m, n, k, false, true}, {DType::f8e4m3, DType::f8e4m3, DType::bf16}, act_fp8.get(), weights(),
                    out, stream, 1.f, 0.f, {row_scales.get(), fp8_scales.get(), true});
      }
    };
    const std::string label = std::string("decode ") + g.name;
    ctx.attempt(label, [&] {
      // Verified first: each kernel and cuBLASLt, from the same zeroed output, agree on every
      // element (the GEMV at its most rows).
      const auto once = [&](auto&& run, void* out, DType dt) {
        GPULAB_CHECK(cudaMemsetAsync(out, 0, rows * n * core::dtype_size(dt), stream));
        turn = 0;
        run(out);
        stream.synchronize();
        return download(out, dt, rows * n);
      };
      const auto agree = [&](const std::vector<float>& mine, const std::vector<float>& theirs, int64_t m,
                             const std::string& what) {
        for (int64_t i = 0; i < m * n; ++i)
          if (!(std::abs(mine[i] - theirs[i]) <= 1e-2f * std::abs(theirs[i]) + 1e-9f))
            throw core::Error(what + " disagree at element " + std::to_string(i) + ": " + std::to_string(mine[i]) +
                              " vs " + std::to_string(theirs[i]));
      };
      for (const SkinnyPath& path : {kTensorCore, kGemv, kGemvFp8}) {
        const int64_t m = path.kernel == SkinnyKernel::gemv ? kernels::kGemvMaxRows : rows;
        agree(once([&](void*) { skinny(m, path); }, y, out_dt),
              once([&](void* out) { unfused(m, out); }, g.into_residual ? y_check.get() : y, out_dt), m,
              std::string("skinny_gemm (") + path.name + ") and cuBLASLt");
      }
      // W8A8: the automatic kernel and, where the GPU runs it, wgmma (automatic's for large weights).
      const bool wgmma = kernels::skinny_wgmma_runs_here();
      for (SkinnyKernel kernel : {SkinnyKernel::automatic, SkinnyKernel::wgmma})
        if (kernel == SkinnyKernel::automatic || wgmma)
          agree(once([&](void* out) { w8a8(rows, kernel, out); }, y_bf16.get(), DType::bf16),
                once([&](void* out) { w8a8(rows, std::nullopt, out); }, y_bf16.get(), DType::bf16), rows,
                "skinny_gemm (W8A8) and cuBLASLt fp8");
      // One row per path and row count: name, weight bytes, whether its input is through the
      // GEMM's prologue (W8A8 inputs are quantized already), the call.
      struct Timed {
        std::string name;
        size_t bytes;
        bool prologue;
        std::function<void()> run;
      };
      for (int64_t m : kRowCounts) {
        std::vector<Timed> timed;
        const auto add_path = [&](const SkinnyPath& path) {
          const size_t bytes = path.weights == DType::f8e4m3 ? weight_bytes / 2 : weight_bytes;
          timed.push_back({path.name, bytes, true, [&, m] { skinny(m, path); }});
        };
        if (kernels::skinny_gemv_fits(m, k)) add_path(kGemv), add_path(kGemvFp8);
        add_path(kTensorCore);
        timed.push_back({"cublaslt", weight_bytes, true, [&, m] { unfused(m, y); }});
        if (m > kernels::kGemvMaxRows) {
          const auto skinny_w8a8 = [&](std::string name, SkinnyKernel kernel) {
            timed.push_back({std::move(name), weight_bytes / 2, false, [&, m, kernel] { w8a8(m, kernel, y); }});
          };
          skinny_w8a8("skinny_w8a8", SkinnyKernel::automatic);
          if (wgmma) skinny_w8a8("skinny_w8a8_wgmma", SkinnyKernel::wgmma);
          timed.push_back({"cublaslt_fp8", weight_bytes / 2, false, [&, m] { w8a8(m, std::nullopt, y_bf16.get()); }});
        }
        for (const Timed& t : timed) {
          const SkinnyPrologue prologue = t.prologue ? g.prologue : SkinnyPrologue::none;
          const nlohmann::json params = {{"n", n}, {"k", k}, {"rows", m}, {"weight_bytes", t.bytes},
                                         {"prologue", prologue == SkinnyPrologue::none      ? "none"
                                                      : prologue == SkinnyPrologue::rmsnorm ? "rmsnorm"
                                                                                            : "swiglu"}};
          const std::string name = t.name + "_" + g.name + "_m" + std::to_string(m);
          // Profilers see only the timed launches, the NVTX range naming the row (as in bench gemm):
          // ncu --profile-from-start off --nvtx --nvtx-include NAME/ --launch-count 1.
          nvtxRangePushA(name.c_str());
          GPULAB_CHECK(cudaProfilerStart());
          const std::vector<double> times = time_on_stream(stream, t.run, plan);
          GPULAB_CHECK(cudaProfilerStop());
          nvtxRangePop();
          std::vector<double> gbps;
          for (double ms : times) gbps.push_back(per_second_1e9(static_cast<double>(t.bytes), ms));
          Row row = make_row("decode", name, "bandwidth", "GB/s", summarize(gbps), ctx.datasheet().memory_gbps, params);
          row.ceiling = ctx.ceiling("hbm_copy");
          ctx.add(row);
        }
      }
    });
  }
  run_attention_rows(ctx, stream, plan);
  ctx.note("GEMMs: weight bytes per second; gemv_* / skinny_*: skinny_gemm's GEMV / tensor-core kernel; gemv_fp8_*: "
           "the GEMV on e4m3 weights with per-channel scales (half the bytes); cublaslt_* includes the rmsnorm / "
           "silu_mul launch the unfused path needs; skinny_w8a8_* / cublaslt_fp8_*: e4m3 inputs with per-row scales "
           "beside e4m3 weights (W8A8, the engine's fp8 decode at 3-16 rows; its quantize kernel not timed), "
           "cuBLASLt writing bf16; skinny_w8a8_wgmma_*: on wgmma, which skinny_w8a8 takes past 8 rows from 64 MiB of "
           "weights");
  ctx.note("attention_*: one layer, head_dim 128, pages of 16; 7b = 32/32 heads, 8b = 32 query / 8 kv heads; "
           "GB/s of K+V read (batch x context x kv_heads x 128 x 2 x 2 B)");
  ctx.finish("decode GEMMs of LLaMA-2-7B and decode attention (bf16)");
}

}  // namespace gpulab::bench
