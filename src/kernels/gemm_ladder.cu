// GEMM ladder steps 1-3 (fp32 on CUDA cores) and the dispatch over all five steps.
#include "kernels/gemm_ladder.h"

#include "core/error.h"

namespace gpulab::kernels {

namespace {

// Step 1: one thread per output, straight from global memory.
__global__ void naive_kernel(const float* a, const float* b, float* c, int m, int n, int k) {
  const int row = blockIdx.y * blockDim.y + threadIdx.y;
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= m || col >= n) return;
  float sum = 0.f;
  for (int p = 0; p < k; ++p) sum += a[size_t(row) * k + p] * b[size_t(p) * n + col];
  c[size_t(row) * n + col] = sum;
}

// Step 2: 32×32 tiles of A and B staged in shared memory; each value read from global memory
// once per tile instead of once per output. A 32×8 block: each thread computes the 4 outputs of
// its column at rows ty, ty+8, ty+16, ty+24, so one shared-memory read of B feeds 4 FMAs (with
// one output per thread every FMA needs its own B read and shared-memory bandwidth caps the
// kernel at ~1/4 of fp32 peak). A warp is one tile row: A reads are broadcasts, 4 per LDS.128,
// and B reads are 32 consecutive words; neither has bank conflicts.
constexpr int kTile = 32, kTileRows = 8, kTileOut = kTile / kTileRows;
__global__ void __launch_bounds__(kTile * kTileRows) smem_tiled_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                                                       float* __restrict__ c, int m, int n, int k) {
  __shared__ alignas(16) float as[kTile][kTile];
  __shared__ float bs[kTile][kTile];
  const int ty = threadIdx.y, tx = threadIdx.x;
  const int row0 = blockIdx.y * kTile, col = blockIdx.x * kTile + tx;
  float sum[kTileOut] = {};
  for (int k0 = 0; k0 < k; k0 += kTile) {
#pragma unroll
    for (int i = 0; i < kTileOut; ++i) {
      const int r = ty + i * kTileRows, row = row0 + r;
      as[r][tx] = row < m && k0 + tx < k ? a[size_t(row) * k + k0 + tx] : 0.f;
      bs[r][tx] = k0 + r < k && col < n ? b[size_t(k0 + r) * n + col] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int p = 0; p < kTile; ++p) {
      const float bv = bs[p][tx];
#pragma unroll
      for (int i = 0; i < kTileOut; ++i) sum[i] += as[ty + i * kTileRows][p] * bv;
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < kTileOut; ++i) {
    const int row = row0 + ty + i * kTileRows;
    if (row < m && col < n) c[size_t(row) * n + col] = sum[i];
  }
}

// Step 3: a 128×128 block tile, 8×8 outputs per thread held in registers, float4 loads from
// global and shared memory. A is stored transposed in shared memory so a thread's 8 rows are
// two float4 reads.
constexpr int kBm = 128, kBn = 128, kBk = 8, kTm = 8, kTn = 8, kRbThreads = 256;
static_assert(kBm * kBk / 4 == kRbThreads && kBk * kBn / 4 == kRbThreads, "one float4 of A and of B per thread");
static_assert((kBm / kTm) * (kBn / kTn) == kRbThreads, "8×8 outputs per thread cover the tile");

__global__ void __launch_bounds__(kRbThreads) register_blocked_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                                                        float* __restrict__ c, int m, int n, int k) {
  __shared__ alignas(16) float as[kBk][kBm];
  __shared__ alignas(16) float bs[kBk][kBn];
  const int tid = threadIdx.x;
  const int row0 = blockIdx.y * kBm, col0 = blockIdx.x * kBn;
  const int a_row = tid / 2, a_col = (tid % 2) * 4;    // A tile: 128 rows × 2 float4
  const int b_row = tid / 32, b_col = (tid % 32) * 4;  // B tile: 8 rows × 32 float4
  const int ty = tid / 16, tx = tid % 16;
  float acc[kTm][kTn] = {};
  for (int k0 = 0; k0 < k; k0 += kBk) {
    const float4 av = *reinterpret_cast<const float4*>(a + size_t(row0 + a_row) * k + k0 + a_col);
    as[a_col + 0][a_row] = av.x;
    as[a_col + 1][a_row] = av.y;
    as[a_col + 2][a_row] = av.z;
    as[a_col + 3][a_row] = av.w;
    *reinterpret_cast<float4*>(&bs[b_row][b_col]) = *reinterpret_cast<const float4*>(b + size_t(k0 + b_row) * n + col0 + b_col);
    __syncthreads();
#pragma unroll
    for (int p = 0; p < kBk; ++p) {
      float ar[kTm], br[kTn];
      *reinterpret_cast<float4*>(&ar[0]) = *reinterpret_cast<const float4*>(&as[p][ty * kTm]);
      *reinterpret_cast<float4*>(&ar[4]) = *reinterpret_cast<const float4*>(&as[p][ty * kTm + 4]);
      *reinterpret_cast<float4*>(&br[0]) = *reinterpret_cast<const float4*>(&bs[p][tx * kTn]);
      *reinterpret_cast<float4*>(&br[4]) = *reinterpret_cast<const float4*>(&bs[p][tx * kTn + 4]);
#pragma unroll
      for (int i = 0; i < kTm; ++i)
#pragma unroll
        for (int j = 0; j < kTn; ++j) acc[i][j] += ar[i] * br[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < kTm; ++i) {
    float* out = c + size_t(row0 + ty * kTm + i) * n + col0 + tx * kTn;
    *reinterpret_cast<float4*>(out) = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    *reinterpret_cast<float4*>(out + 4) = make_float4(acc[i][4], acc[i][5], acc[i][6], acc[i][7]);
  }
}

void require_size(GemmStep s, int64_t m, int64_t n, int64_t k) {
  const std::string rule = gemm_step_size_rule(s, m, n, k);
  if (!rule.empty()) throw core::InputError(rule);
}

}  // namespace

std::string gemm_step_name(GemmStep s) {
  switch (s) {
    case GemmStep::naive: return "naive";
    case GemmStep::smem_tiled: return "smem_tiled";
    case GemmStep::register_blocked: return "register_blocked";
    case GemmStep::mma_sync: return "mma_sync";
    case GemmStep::wgmma: return "wgmma";
  }
  return "?";
}

bool gemm_step_supports(GemmStep s, core::DType input) {
  switch (s) {
    case GemmStep::naive:
    case GemmStep::smem_tiled:
    case GemmStep::register_blocked: return input == core::DType::f32;
    case GemmStep::mma_sync: return input == core::DType::f16 || input == core::DType::bf16;
    case GemmStep::wgmma: return input == core::DType::bf16;
  }
  return false;
}

std::string gemm_step_size_rule(GemmStep s, int64_t m, int64_t n, int64_t k) {
  if (m <= 0 || n <= 0 || k <= 0 || m > INT32_MAX || n > INT32_MAX || k > INT32_MAX)
    return "gemm " + gemm_step_name(s) + ": sizes must be positive 32-bit integers";
  int64_t tm = 1, tn = 1, tk = 1;
  switch (s) {
    case GemmStep::naive:
    case GemmStep::smem_tiled: return "";
    case GemmStep::register_blocked: tm = kBm, tn = kBn, tk = kBk; break;
    case GemmStep::mma_sync: tm = 128, tn = 256, tk = 64; break;
    case GemmStep::wgmma: tm = 128, tn = 256, tk = 64; break;
  }
  if (m % tm || n % tn || k % tk)
    return "gemm " + gemm_step_name(s) + " needs m a multiple of " + std::to_string(tm) + ", n of " + std::to_string(tn) +
           " and k of " + std::to_string(tk) + " (got " + std::to_string(m) + "×" + std::to_string(n) + "×" + std::to_string(k) + ")";
  return "";
}

bool gemm_step_available(GemmStep s) {
  if (s != GemmStep::wgmma && s != GemmStep::mma_sync) return true;
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (s == GemmStep::mma_sync) {
    int smem = 0;
    GPULAB_CHECK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return size_t(smem) >= gemm_mma_sync_smem_bytes();
  }
  GPULAB_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  GPULAB_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return gemm_wgmma_compiled() && major == 9 && minor == 0;
}

void gemm_naive(const float* a, const float* b, float* c, int m, int n, int k, cudaStream_t stream) {
  require_size(GemmStep::naive, m, n, k);
  const dim3 block(16, 16), grid((n + 15) / 16, (m + 15) / 16);
  naive_kernel<<<grid, block, 0, stream>>>(a, b, c, m, n, k);
  GPULAB_CHECK_LAUNCH();
}

void gemm_smem_tiled(const float* a, const float* b, float* c, int m, int n, int k, cudaStream_t stream) {
  require_size(GemmStep::smem_tiled, m, n, k);
  const dim3 block(kTile, kTileRows), grid((n + kTile - 1) / kTile, (m + kTile - 1) / kTile);
  smem_tiled_kernel<<<grid, block, 0, stream>>>(a, b, c, m, n, k);
  GPULAB_CHECK_LAUNCH();
}

void gemm_register_blocked(const float* a, const float* b, float* c, int m, int n, int k, cudaStream_t stream) {
  require_size(GemmStep::register_blocked, m, n, k);
  register_blocked_kernel<<<dim3(n / kBn, m / kBm), kRbThreads, 0, stream>>>(a, b, c, m, n, k);
  GPULAB_CHECK_LAUNCH();
}

void gemm_ladder(GemmStep s, core::DType input, const void* a, const void* b, float* c, int64_t m, int64_t n,
                 int64_t k, cudaStream_t stream) {
  if (!gemm_step_supports(s, input))
    throw core::InputError("gemm " + gemm_step_name(s) + " does not take " + std::string(core::dtype_name(input)) + " inputs");
  require_size(s, m, n, k);
  const auto fa = static_cast<const float*>(a);
  const auto fb = static_cast<const float*>(b);
  switch (s) {
    case GemmStep::naive: return gemm_naive(fa, fb, c, int(m), int(n), int(k), stream);
    case GemmStep::smem_tiled: return gemm_smem_tiled(fa, fb, c, int(m), int(n), int(k), stream);
    case GemmStep::register_blocked: return gemm_register_blocked(fa, fb, c, int(m), int(n), int(k), stream);
    case GemmStep::mma_sync: return gemm_mma_sync(input, a, b, c, int(m), int(n), int(k), stream);
    case GemmStep::wgmma: return gemm_wgmma(a, b, c, int(m), int(n), int(k), stream);
  }
}

}  // namespace gpulab::kernels
