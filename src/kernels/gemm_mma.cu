// GEMM ladder step 4: tensor cores through warp-level mma.sync (m16n8k16, fp16/bf16 in, fp32
// accumulate). A 128×256×64 block tile, 8 warps (2×4) of 64×64 each; tiles arrive by cp.async
// in a 3-stage pipeline and reach registers by ldmatrix (B transposed on the way, since B is k×n
// row-major and mma wants it column-major). Rows are padded by 16 bytes so ldmatrix's eight
// 16-byte row reads, and the cp.async writes, hit distinct bank groups (a swizzle would save the
// 8 % of shared memory the padding costs, but shared memory does not limit occupancy here).
// Why this shape: shared memory serves 128 bytes per clock per SM and has to take both the
// cp.async writes and the ldmatrix reads. A 64×64 warp tile needs 8 ldmatrix.x4 (32 wavefronts)
// per 32 mma, and the 128×256 block writes 0.375 wavefronts per mma. The price is 128 fp32
// accumulators per thread, so one block (8 warps, 2 per scheduler) per SM.
// With so few warps, latency has to be hidden inside each warp (the first version issued every
// ldmatrix of a k-tile after the barrier and then waited for them, leaving the tensor pipe idle
// at each k-tile: 37 % of cuBLASLt). So the loop is software-pipelined:
// - fragments are double-buffered: the ldmatrix for k-step s+1 (the next tile's first step at the
//   end of a tile) are issued before the mma of step s, so mma never waits on shared memory;
// - the one __syncthreads per k-tile sits before the last of its 4 k-steps, between two runs of
//   32 mma (a 64-deep tile, as cuBLAS's own sm80 kernels of this size use, halves the barriers
//   of a 32-deep one);
// - copy addresses are computed once; each k-tile only advances two pointers.
// Blocks are rasterised in groups of 8 block rows, so the blocks running at once share B panels
// in L2 instead of each wave streaming all of B from HBM.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "core/dtype_dispatch.h"
#include "core/error.h"
#include "kernels/gemm_ladder.h"
#include "kernels/mma_ptx.h"

namespace gpulab::kernels {

namespace {

constexpr int kBm = 128, kBn = 256, kBk = 64, kStages = 3, kThreads = 256, kGroupM = 8;
constexpr int kWarpM = 64, kWarpN = 64, kWarpsN = kBn / kWarpN;
constexpr int kMi = kWarpM / 16, kNi = kWarpN / 16;  // ldmatrix.x4 per k-step: A 16×16 and B 16×16 pieces
constexpr int kKSteps = kBk / 16;
constexpr int kAStride = kBk + 8;  // elements per A row in shared memory (144 bytes)
constexpr int kBStride = kBn + 8;  // elements per B row (528 bytes)
constexpr int kAStageBytes = kBm * kAStride * 2, kBStageBytes = kBk * kBStride * 2;
constexpr size_t kSmemBytes = size_t(kStages) * (kAStageBytes + kBStageBytes);
static_assert((kBm / kWarpM) * kWarpsN * 32 == kThreads, "warps tile the block");
static_assert(kBk % 16 == 0 && kWarpM % 16 == 0 && kWarpN % 16 == 0, "mma and ldmatrix shapes");
static_assert(kKSteps % 2 == 0, "fragment buffers alternate per k-step, so a tile starts in buffer 0");
static_assert(kStages >= 2, "the pipeline needs a stage to fill while one is read");
constexpr int kAChunks = kBk / 8, kBChunks = kBn / 8;  // 16-byte chunks per tile row
constexpr int kARowsPerPass = kThreads / kAChunks, kBRowsPerPass = kThreads / kBChunks;
static_assert(kThreads % kAChunks == 0 && kThreads % kBChunks == 0, "a pass of the block covers whole rows");
static_assert(kBm % kARowsPerPass == 0 && kBk % kBRowsPerPass == 0, "every thread copies whole chunks");

// One k-step's operands for a warp: 4 A pieces (16 rows × 16 k) and 4 B pieces (16 k × 16 cols).
struct Fragments {
  uint32_t a[kMi][4], b[kNi][4];
};

template <class T>
__global__ void __launch_bounds__(kThreads, 1) mma_kernel(const T* __restrict__ a, const T* __restrict__ b,
                                                       float* __restrict__ c, int m, int n, int k) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t smem_a = smem_addr(smem_raw), smem_b = smem_a + kStages * kAStageBytes;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int warp_m = warp / kWarpsN, warp_n = warp % kWarpsN;

  // Grouped raster: consecutive blocks walk down kGroupM block rows, then move one column right.
  const int tiles_m = m / kBm, tiles_n = n / kBn, per_group = kGroupM * tiles_n;
  const int first_m = int(blockIdx.x) / per_group * kGroupM, in_group = int(blockIdx.x) % per_group;
  const int group_rows = min(tiles_m - first_m, kGroupM);
  const int row0 = (first_m + in_group % group_rows) * kBm, col0 = in_group / group_rows * kBn;
  const int k_tiles = k / kBk;

  // This thread's 16-byte copies: A rows a_row + i·kARowsPerPass, B rows b_row + i·kBRowsPerPass.
  const int a_row = tid / kAChunks, a_col = tid % kAChunks * 8;
  const int b_row = tid / kBChunks, b_col = tid % kBChunks * 8;
  const T* a_src = a + size_t(row0 + a_row) * k + a_col;
  const T* b_src = b + size_t(b_row) * n + col0 + b_col;
  const uint32_t a_dst = (a_row * kAStride + a_col) * 2, b_dst = (b_row * kBStride + b_col) * 2;
  auto load_tile = [&](int stage) {
#pragma unroll
    for (int i = 0; i < kBm / kARowsPerPass; ++i)
      cp_async16(smem_a + stage * kAStageBytes + a_dst + i * kARowsPerPass * kAStride * 2, a_src + size_t(i) * kARowsPerPass * k);
#pragma unroll
    for (int i = 0; i < kBk / kBRowsPerPass; ++i)
      cp_async16(smem_b + stage * kBStageBytes + b_dst + i * kBRowsPerPass * kBStride * 2, b_src + size_t(i) * kBRowsPerPass * n);
    a_src += kBk;
    b_src += size_t(kBk) * n;
  };

  // ldmatrix row addresses: lanes 0-15 give rows 0-15 of a 16×16 piece, lanes 16-31 the same rows
  // 8 elements further on (for B, trans turns its k×n rows into the column-major pieces mma wants).
  const uint32_t a_frag = ((warp_m * kWarpM + lane % 16) * kAStride + lane / 16 * 8) * 2;
  const uint32_t b_frag = ((lane % 16) * kBStride + warp_n * kWarpN + lane / 16 * 8) * 2;
  auto load_fragments = [&](Fragments& f, int stage, int step) {
#pragma unroll
    for (int mi = 0; mi < kMi; ++mi)
      ldmatrix_x4(f.a[mi], smem_a + stage * kAStageBytes + a_frag + (mi * 16 * kAStride + step * 16) * 2);
#pragma unroll
    for (int ni = 0; ni < kNi; ++ni)
      ldmatrix_x4_trans(f.b[ni], smem_b + stage * kBStageBytes + b_frag + (step * 16 * kBStride + ni * 16) * 2);
  };

  float acc[kMi][kWarpN / 8][4] = {};
  Fragments frag[2];
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_tile(s);
    cp_async_commit();  // empty groups keep the wait counts uniform
  }
  cp_async_wait<kStages - 2>();
  __syncthreads();
  load_fragments(frag[0], 0, 0);
  int read_stage = 0, write_stage = kStages - 1;  // stages of tile kt and of tile kt + kStages - 1
  for (int kt = 0; kt < k_tiles; ++kt) {
#pragma unroll
    for (int step = 0; step < kKSteps; ++step) {
      if (step == kKSteps - 1) {
        // After this barrier tile kt+1 has landed (the groups of tiles up to kt+1 are complete,
        // in every thread), and every warp has loaded all its fragments of tile kt (step s's were
        // loaded during step s-1), so tile kt's stage may be refilled from the next step on.
        cp_async_wait<kStages - 2>();
        __syncthreads();
        read_stage = read_stage == kStages - 1 ? 0 : read_stage + 1;
      }
      // Next step's fragments first (at the last step: the next tile's first; past the last tile
      // they read a stale stage, harmlessly, and go unused).
      load_fragments(frag[(step + 1) % 2], read_stage, (step + 1) % kKSteps);
      if (step == 0) {
        // Into the stage of tile kt-1, whose fragments every warp loaded before the last barrier.
        if (kt + kStages - 1 < k_tiles) load_tile(write_stage);
        cp_async_commit();
        write_stage = write_stage == kStages - 1 ? 0 : write_stage + 1;
      }
      const Fragments& f = frag[step % 2];
#pragma unroll
      for (int mi = 0; mi < kMi; ++mi)
#pragma unroll
        for (int nj = 0; nj < kWarpN / 8; ++nj)
          mma_16816<T>(acc[mi][nj], f.a[mi], f.b[nj / 2][nj % 2 * 2], f.b[nj / 2][nj % 2 * 2 + 1]);
    }
  }
  cp_async_wait<0>();  // only empty groups remain; leave none in flight
#pragma unroll
  for (int mi = 0; mi < kMi; ++mi)
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
      const int64_t blocks = int64_t(m / kBm) * (n / kBn);
      if (blocks > INT32_MAX) throw core::InputError("gemm mma_sync: " + std::to_string(blocks) + " block tiles exceed one grid");
      mma_kernel<T><<<unsigned(blocks), kThreads, kSmemBytes, stream>>>(static_cast<const T*>(a), static_cast<const T*>(b), c, m, n, k);
      GPULAB_CHECK_LAUNCH();
    }
  });
}

}  // namespace gpulab::kernels
