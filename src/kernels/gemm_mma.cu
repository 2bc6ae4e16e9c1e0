// GEMM ladder step 4: tensor cores through warp-level mma.sync (m16n8k16, fp16/bf16 in, fp32
// accumulate). A 128×256×32 block tile, 8 warps (2×4) of 64×64 each; tiles arrive by cp.async
// in a 5-stage pipeline and reach registers by ldmatrix (B transposed on the way, since B is k×n
// row-major and mma wants it column-major). Rows are padded by 16 bytes so ldmatrix's eight
// 16-byte row reads hit distinct banks.
// Why this shape: shared memory serves 128 bytes per clock per SM and has to take both the
// cp.async writes and the ldmatrix reads. A 64×64 warp tile needs 8 ldmatrix.x4 (32 wavefronts)
// per 32 mma, and the 128×256 block writes 0.375 wavefronts per mma; the 128×128 block with
// 64×32 warps needed 1.5 + 0.5 and reached only 38 % of cuBLASLt.
// The price is 128 fp32 accumulators per thread, so one block (8 warps) per SM; the 5 stages use
// the shared memory that frees up.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "core/dtype_dispatch.h"
#include "core/error.h"
#include "kernels/gemm_ladder.h"

namespace gpulab::kernels {

namespace {

constexpr int kBm = 128, kBn = 256, kBk = 32, kStages = 5, kThreads = 256;
constexpr int kWarpM = 64, kWarpN = 64;
constexpr int kAStride = kBk + 8;  // elements per A row in shared memory (80 bytes)
constexpr int kBStride = kBn + 8;  // elements per B row (272 bytes)
constexpr int kAStage = kBm * kAStride, kBStage = kBk * kBStride;
constexpr size_t kSmemBytes = size_t(kStages) * (kAStage + kBStage) * 2;
static_assert((kBm / kWarpM) * (kBn / kWarpN) * 32 == kThreads, "warps tile the block");
static_assert(kBk % 16 == 0 && kWarpM % 16 == 0 && kWarpN % 16 == 0, "mma and ldmatrix shapes");
constexpr int kAChunks = kBk / 8, kBChunks = kBn / 8;  // 16-byte chunks per tile row
static_assert(kBm * kAChunks % kThreads == 0 && kBk * kBChunks % kThreads == 0, "every thread copies whole chunks");

__device__ inline uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ inline void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(smem)), "l"(gmem));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

template <class T>
__device__ inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <class T>
__global__ void __launch_bounds__(kThreads, 1) mma_kernel(const T* __restrict__ a, const T* __restrict__ b,
                                                       float* __restrict__ c, int m, int n, int k) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* as = reinterpret_cast<T*>(smem_raw);
  T* bs = as + kStages * kAStage;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int warp_m = warp / (kBn / kWarpN), warp_n = warp % (kBn / kWarpN);
  const int row0 = blockIdx.y * kBm, col0 = blockIdx.x * kBn;
  const int k_tiles = k / kBk;

  auto load_stage = [&](int stage, int kt) {
    const int k0 = kt * kBk;
    T* sa = as + stage * kAStage;
    T* sb = bs + stage * kBStage;
#pragma unroll
    for (int j = 0; j < kBm * kAChunks / kThreads; ++j) {
      const int i = tid + j * kThreads, r = i / kAChunks, ch = i % kAChunks;
      cp_async16(sa + r * kAStride + ch * 8, a + size_t(row0 + r) * k + k0 + ch * 8);
    }
#pragma unroll
    for (int j = 0; j < kBk * kBChunks / kThreads; ++j) {
      const int i = tid + j * kThreads, r = i / kBChunks, ch = i % kBChunks;
      cp_async16(sb + r * kBStride + ch * 8, b + size_t(k0 + r) * n + col0 + ch * 8);
    }
  };

  float acc[kWarpM / 16][kWarpN / 8][4] = {};
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();  // empty groups keep the wait counts uniform
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<kStages - 2>();  // tile kt has landed (for this thread's copies)
    __syncthreads();               // ...and everyone's; and everyone is done with tile kt-1
    const int next = kt + kStages - 1;
    if (next < k_tiles) load_stage(next % kStages, next);  // into tile kt-1's stage
    cp_async_commit();
    const T* sa = as + (kt % kStages) * kAStage;
    const T* sb = bs + (kt % kStages) * kBStage;
#pragma unroll
    for (int kk = 0; kk < kBk; kk += 16) {
      uint32_t af[kWarpM / 16][4], bf[kWarpN / 16][4];
#pragma unroll
      for (int mi = 0; mi < kWarpM / 16; ++mi)
        ldmatrix_x4(af[mi], sa + (warp_m * kWarpM + mi * 16 + lane % 16) * kAStride + kk + (lane / 16) * 8);
#pragma unroll
      for (int ni = 0; ni < kWarpN / 16; ++ni)
        ldmatrix_x4_trans(bf[ni], sb + (kk + lane % 16) * kBStride + warp_n * kWarpN + ni * 16 + (lane / 16) * 8);
#pragma unroll
      for (int mi = 0; mi < kWarpM / 16; ++mi)
#pragma unroll
        for (int nj = 0; nj < kWarpN / 8; ++nj)
          mma_16816<T>(acc[mi][nj], af[mi], bf[nj / 2][(nj % 2) * 2], bf[nj / 2][(nj % 2) * 2 + 1]);
    }
  }
  cp_async_wait<0>();
#pragma unroll
  for (int mi = 0; mi < kWarpM / 16; ++mi)
#pragma unroll
    for (int nj = 0; nj < kWarpN / 8; ++nj) {
      const int r = row0 + warp_m * kWarpM + mi * 16 + lane / 4;
      const int col = col0 + warp_n * kWarpN + nj * 8 + (lane % 4) * 2;
      *reinterpret_cast<float2*>(c + size_t(r) * n + col) = make_float2(acc[mi][nj][0], acc[mi][nj][1]);
      *reinterpret_cast<float2*>(c + size_t(r + 8) * n + col) = make_float2(acc[mi][nj][2], acc[mi][nj][3]);
    }
}

}  // namespace

size_t gemm_mma_sync_smem_bytes() { return kSmemBytes; }

void gemm_mma_sync(core::DType input, const void* a, const void* b, float* c, int m, int n, int k, cudaStream_t stream) {
  const std::string rule = gemm_step_size_rule(GemmStep::mma_sync, m, n, k);
  if (!rule.empty()) throw core::InputError(rule);
  core::dispatch_activation(input, [&]<class T>() {
    if constexpr (std::is_same_v<T, float>) {
      throw core::InputError("gemm mma_sync takes fp16 or bf16 inputs, not fp32");
    } else {
      GPULAB_CHECK(cudaFuncSetAttribute(mma_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes)));
      mma_kernel<T><<<dim3(n / kBn, m / kBm), kThreads, kSmemBytes, stream>>>(static_cast<const T*>(a), static_cast<const T*>(b), c, m, n, k);
      GPULAB_CHECK_LAUNCH();
    }
  });
}

}  // namespace gpulab::kernels
