// skinny_gemm's W8A8 kernel on wgmma (see skinny_wgmma.h). The tiles kernel (skinny_gemm.cu) runs
// e4m3 on mma.sync, which sm_90 executes as conversions to f16 and f16 MMAs, after every lane has
// read its fragment pieces from shared memory; and each of its blocks serves 16 channels, so it
// reads the activations once per 16 weight rows. Here the tensor cores read both operands from
// the stages themselves, in e4m3, and a block serves 64 channels.
//
// A block: warps 0-3 (one warpgroup) consume, warp 4's first lane produces. The producer loads
// stage i with the 64 × 128-byte box of W at (k = 128 i, channel n0) and the 16 × 128-byte box of
// x at (128 i, row 0), both 128-byte swizzled; TMA fills what lies past n, m or k with zeros. The
// first kStages weight boxes go out before pdl_wait (weights are constant), the activations after
// it. Full/empty mbarriers hand the stages back and forth.
//
// Where 64-channel tiles are too few to fill the GPU's block places (LLaMA-2-70B's o_proj and
// down: 128 tiles for 264 places), a cluster of C blocks shares a tile, each a C-th of k, and block 0 adds the others'
// sums through distributed shared memory, in rank order: deterministic still.
//
// Precision: Hopper's fp8 tensor cores add a k32 step's products into the accumulator with about
// 14 bits kept (DeepSeek-V3 report, section 3.3.2), so each stage's four wgmma start from zero
// and their sum is added to float32 accumulators on the CUDA cores: every 128 of k, as DeepGEMM
// does. A block adds its stages in k order, a cluster its blocks in rank order: deterministic.
//
// Built for sm_90a only (the _sm90a suffix; see src/kernels/CMakeLists.txt).
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <type_traits>

#include "core/error.h"
#include "kernels/gemm_ladder.h"
#include "kernels/pdl.h"
#include "kernels/skinny_gemm.h"
#include "kernels/skinny_wgmma.h"
#include "kernels/tensor_map.h"
#include "kernels/wgmma_sm90a.cuh"

namespace gpulab::kernels {

namespace {

constexpr int kChannels = 64;  // W rows a block: wgmma's M
constexpr int kRows = 16;      // activation rows: wgmma's N (zeros past m)
constexpr int kStepK = 128;    // e4m3 of k a stage: one 128-byte swizzle row
// Stages a block: 10 KB each, two blocks an SM (about 200 KB of weights in flight an SM).
constexpr int kStages = 10, kBlocksPerSm = 2;
constexpr int kWBytes = kChannels * kStepK, kXBytes = kRows * kStepK, kStageBytes = kWBytes + kXBytes;
constexpr int kConsumerThreads = 128, kThreads = kConsumerThreads + 32;
constexpr size_t kSmemBytes = size_t(kStages) * kStageBytes + 1024;  // +1024: alignment slack
static_assert(kWBytes % 1024 == 0 && kStageBytes % 1024 == 0, "swizzled tiles start on 1024-byte boundaries");

// d = (accumulate ? d : 0) + A(64×32 e4m3, desc_a) · B(16×32 e4m3, desc_b)ᵀ-stored, fp32.
__device__ inline void wgmma_m64n16k32_e4m3(float (&d)[8], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
#endif
}

template <class Out, int C>
__global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(kThreads, kBlocksPerSm)
    skinny_wgmma_kernel(const __grid_constant__ CUtensorMap w_map, const __grid_constant__ CUtensorMap x_map, Out* y,
                        bool accumulate, const float* w_scales, const float* row_scales, int m, int n, int k) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full[kStages], empty[kStages];
  unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  const auto w_tile = [&](int s) { return smem + s * kStageBytes; };
  const auto x_tile = [&](int s) { return smem + s * kStageBytes + kWBytes; };
  // This block's share of the tile's k: steps first .. first + steps - 1 (rank = blockIdx.x % C).
  const int n0 = blockIdx.x / C * kChannels, all_steps = (k + kStepK - 1) / kStepK, rank = blockIdx.x % C;
  const int first = rank * all_steps / C, steps = (rank + 1) * all_steps / C - first;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);                  // the producer's arrive (+ the TMA bytes)
      mbar_init(&empty[s], kConsumerThreads);  // every consumer thread is done reading
    }
    mbar_init_fence();
  }
  __syncthreads();
  pdl_launch_dependents();

  const bool consumer = threadIdx.x < kConsumerThreads;
  float acc[8] = {};
  if (threadIdx.x == kConsumerThreads) {
    tensor_map_prefetch(&w_map);
    tensor_map_prefetch(&x_map);
    const int ahead = min(kStages, steps);
    for (int i = 0; i < ahead; ++i) {
      mbar_expect_tx(&full[i], kStageBytes);
      tma_load_2d(w_tile(i), &w_map, &full[i], (first + i) * kStepK, n0);
    }
    pdl_wait();  // x is the kernel before's output
    for (int i = 0; i < ahead; ++i) tma_load_2d(x_tile(i), &x_map, &full[i], (first + i) * kStepK, 0);
    for (int i = kStages; i < steps; ++i) {
      const int s = i % kStages;
      mbar_wait(&empty[s], (i / kStages - 1) & 1);
      mbar_expect_tx(&full[s], kStageBytes);
      tma_load_2d(w_tile(s), &w_map, &full[s], (first + i) * kStepK, n0);
      tma_load_2d(x_tile(s), &x_map, &full[s], (first + i) * kStepK, 0);
    }
  }
  float stage_sum[8];
  for (int i = 0; consumer && i < steps; ++i) {
    const int s = i % kStages;
    mbar_wait(&full[s], (i / kStages) & 1);
    wgmma_fence();
    fence_operands(stage_sum);
#pragma unroll
    for (int kk = 0; kk < kStepK / 32; ++kk)  // k32 steps advance 32 bytes inside the swizzled row
      wgmma_m64n16k32_e4m3(stage_sum, smem_descriptor(w_tile(s) + kk * 32), smem_descriptor(x_tile(s) + kk * 32),
                           kk > 0);
    wgmma_commit();
    // All of it, before the sums are read: ptxas serializes every wgmma of a kernel that reads
    // one group's accumulators while another is in flight (warning C7514).
    wgmma_wait<0>();
    fence_operands(stage_sum);
    mbar_arrive(&empty[s]);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] += stage_sum[j];
  }

  if constexpr (C > 1) {  // block 0 of the cluster adds the others' sums, in rank order
    __shared__ float shared_acc[8][kConsumerThreads];
    const cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    if (consumer)
#pragma unroll
      for (int j = 0; j < 8; ++j) shared_acc[j][threadIdx.x] = acc[j];
    cluster.sync();
    if (rank == 0 && consumer)
      for (int r = 1; r < C; ++r) {
        const float(*other)[kConsumerThreads] = cluster.map_shared_rank(shared_acc, r);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[j] += other[j][threadIdx.x];
      }
    cluster.sync();  // the others' shared memory stays until block 0 has read it
    if (rank != 0) return;
  }
  if (!consumer) return;
  pdl_wait();  // y may be what the kernels before wrote (the residual stream)
  // Accumulator fragment: warp w holds channels 16w..16w+15; acc[4j], acc[4j+1] at (lane/4,
  // 8j + 2·(lane%4)) and acc[4j+2], acc[4j+3] eight channels below; columns are x's rows.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int c = n0 + 16 * warp + lane / 4 + 8 * ((j / 2) % 2), r = 8 * (j / 4) + 2 * (lane % 4) + j % 2;
    if (r >= m || c >= n) continue;
    const float sum = acc[j] * (w_scales[c] * row_scales[r]);
    Out* out = y + static_cast<int64_t>(r) * n + c;
    if constexpr (std::is_same_v<Out, float>)
      *out = accumulate ? *out + sum : sum;
    else
      *out = static_cast<Out>(sum);
  }
#endif
}

}  // namespace

// The GEMM ladder's wgmma step needs the same: this build's sm_90a code and a compute 9.0 GPU.
bool skinny_wgmma_runs_here() { return gemm_step_available(GemmStep::wgmma); }

void skinny_w8a8_wgmma(void* y, bool y_f32, bool accumulate, const void* x, const float* row_scales, const void* w,
                       const float* w_scales, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  const auto map = [&](const void* p, int64_t rows, int box_rows) {
    return tensor_map_2d(p, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, rows, k, box_rows, "skinny_gemm wgmma");
  };
  const CUtensorMap w_map = map(w, n, kChannels), x_map = map(x, m, kRows);
  // Blocks a tile: the most of 1, 2, 4 that still fits every block on the GPU at once (and
  // leaves each at least one stage).
  const int64_t tiles = (n + kChannels - 1) / kChannels, places = int64_t{kBlocksPerSm} * current_sm_count();
  const int64_t steps = (k + kStepK - 1) / kStepK;
  int cluster = 1;
  while (cluster < 4 && tiles * cluster * 2 <= places && cluster * 2 <= steps) cluster *= 2;
  const auto run = [&]<class Out, int C>() {
    const auto kernel = skinny_wgmma_kernel<Out, C>;
    GPULAB_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes)));
    launch_overlapped(kernel, dim3(static_cast<unsigned>(tiles * C)), dim3(kThreads), kSmemBytes, stream, w_map,
                      x_map, static_cast<Out*>(y), accumulate, w_scales, row_scales, static_cast<int>(m),
                      static_cast<int>(n), static_cast<int>(k));
  };
  const auto with_cluster = [&]<class Out>() {
    if (cluster == 4) run.template operator()<Out, 4>();
    else if (cluster == 2) run.template operator()<Out, 2>();
    else run.template operator()<Out, 1>();
  };
  if (y_f32) with_cluster.template operator()<float>();
  else with_cluster.template operator()<__nv_bfloat16>();
}

}  // namespace gpulab::kernels
