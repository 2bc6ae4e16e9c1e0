// Prefill attention on tensor cores, after FlashAttention-2 (Dao, 2023): a block of 4 warps owns
// 64 query rows of one head (16 per warp, one mma row tile); it walks the key tiles of 64
// positions up to the causal diagonal, gathering K and V from the pages with cp.async into
// double-buffered shared memory. Per tile, each warp computes S = Q·Kᵀ with m16n8k16 mma (fp32
// accumulate; Q's fragments stay in registers), masks the diagonal, updates the online softmax in
// registers (a row is spread over the quad of lanes that share it), turns P into 16-bit A
// fragments in place and accumulates O += P·V (V through ldmatrix.trans).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>
#include <string>
#include <type_traits>

#include "core/dtype_dispatch.h"
#include "core/error.h"
#include "kernels/attention_mma.h"
#include "kernels/mma_ptx.h"
#include "kernels/paged_gather.cuh"

namespace gpulab::kernels {

namespace {

constexpr int kRows = 64, kKeys = 64, kWarps = 4, kThreads = 32 * kWarps;
static_assert(kRows == 16 * kWarps, "each warp owns one 16-row mma tile of queries");
static_assert(kKeys % 16 == 0, "key tiles are whole mma k-steps of P·V");

template <int D>
constexpr size_t mma_smem_bytes() {
  return sizeof(uint16_t) * 5 * kRows * ldmatrix_pitch<D>();  // Q, then K and V twice
}

// Blocks that fit an SM by shared memory (5 tiles: 46 KiB at 64, 87 KiB at 128); registers are
// capped to match (128 and 255 a thread).
template <int D>
constexpr int kBlocksPerSm = D == 64 ? 4 : 2;

// Fragment ownership (PTX ISA, mma.m16n8k16): accumulator c[0..1] of lane L is row L/4,
// columns 2(L%4) and +1; c[2..3] the same columns of row L/4 + 8.
template <class T, int D>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm<D>)
    prefill_mma_kernel(T* out, int64_t out_stride, const T* q, int64_t q_stride, const T* k_cache, const T* v_cache,
                       const int32_t* block_table, int64_t max_blocks, int block_size, const int32_t* cu_q,
                       const int32_t* kv_lens, int kv_heads, int group, float scale_log2) {
  constexpr int kLd = ldmatrix_pitch<D>(), kTile = kRows * kLd;
  using Gather = PagedGather<T, D, kThreads, kKeys>;
  static_assert(kRows == kKeys, "Q travels in the same waves as a key tile");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* qs = reinterpret_cast<T*>(smem_raw);  // [kRows][kLd]
  T* ks = qs + kTile;                      // [2][kKeys][kLd]
  T* vs = ks + 2 * kTile;                  // [2][kKeys][kLd]

  // Heads vary fastest and row tiles run backwards, so the blocks with the most keys start first
  // and the short ones fill the tail.
  const int seq = blockIdx.z, h = blockIdx.x, kvh = h / group;
  const int64_t start = cu_q[seq];
  const int len = cu_q[seq + 1] - cu_q[seq], kv_len = kv_lens[seq], past = kv_len - len;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kRows;
  if (q0 >= len) return;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int32_t* table = block_table + seq * max_blocks;
  const int kv_end = min(kv_len, past + q0 + kRows);  // causal: no key past the tile's last query
  const int tiles = (kv_end + kKeys - 1) / kKeys;

  Gather gather;  // the tile being loaded (K finds the slots, V reuses them)
  // Q in the same waves.
#pragma unroll
  for (int w = 0; w < Gather::kWaves; ++w) {
    const int r = gather.row0 + w * Gather::kStep;
    const bool ok = q0 + r < len;
    const T* src = ok ? q + (start + q0 + r) * q_stride + h * D + gather.chunk * 8 : q;
    cp_async16_or_zero(smem_addr(qs + r * kLd + gather.chunk * 8), src, ok);
  }
  gather.find(table, block_size, 0, kv_len);
  gather.load(k_cache, kv_heads, kvh, ks);
  cp_async_commit();  // group: Q and K of tile 0
  gather.load(v_cache, kv_heads, kvh, vs);
  cp_async_commit();  // group: V of tile 0

  cp_async_wait<1>();
  __syncthreads();
  // Q's A fragments, D/16 k-steps: ldmatrix matrices (rows 0-7 | 8-15) x (columns 0-7 | 8-15).
  uint32_t qf[D / 16][4];
  const int mrow = (lane % 8) + ((lane / 8) % 2) * 8, mcol = (lane / 16) * 8;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(qf[kk], smem_addr(qs + (warp * 16 + mrow) * kLd + kk * 16 + mcol));

  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // rows lane/4 and lane/4 + 8, in raw score units
  const int qpos = past + q0 + warp * 16 + lane / 4;      // position of row lane/4 (the other is + 8)
  for (int j = 0; j < tiles; ++j) {
    const int buf = j % 2, k0 = j * kKeys;
    // The last key any row of this warp sees: lane 31's second row, row 15. (Taken afresh each
    // tile, which keeps the kernel within 128 registers at head_dim 64.)
    const int last_key = __shfl_sync(0xffffffffu, qpos, 31) + 8;
    cp_async_wait<1>();
    __syncthreads();  // K of tile j has landed; every warp is done with tile j - 1
    if (j + 1 < tiles) {
      gather.find(table, block_size, k0 + kKeys, kv_len);
      gather.load(k_cache, kv_heads, kvh, ks + (1 - buf) * kTile);
    }
    cp_async_commit();

    // S = Q·Kᵀ, 16 rows x kKeys per warp. K rows are Bᵀ rows, so plain ldmatrix gives B: matrices
    // (keys 0-7, dims 0-7), (keys 0-7, dims 8-15), (keys 8-15, dims 0-7), (keys 8-15, dims 8-15).
    float s[kKeys / 8][4] = {};
    const T* kt = ks + buf * kTile;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int n = 0; n < kKeys / 16; ++n) {
        if (k0 + n * 16 > last_key) continue;  // wholly masked for this warp
        uint32_t b[4];
        ldmatrix_x4(b, smem_addr(kt + (n * 16 + (lane % 8) + (lane / 16) * 8) * kLd + kk * 16 + ((lane / 8) % 2) * 8));
        mma_16816<T>(s[2 * n], qf[kk], b[0], b[1]);
        mma_16816<T>(s[2 * n + 1], qf[kk], b[2], b[3]);
      }
    // Keys past a row's position are masked; so are those the skips above left at 0.
    if (k0 + kKeys > past + q0) {  // the tile reaches past the block's first query
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (k0 + n * 8 + (lane % 4) * 2 + (e % 2) > qpos + (e / 2) * 8) s[n][e] = -INFINITY;
    }

    // Online softmax: p = 2^(scale·log2(e)·(s - m)), one FFMA and one exp2 per score.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float mx = m[i];
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * i], s[n][2 * i + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float base = mx == -INFINITY ? 0.f : mx * scale_log2;  // a row with no key yet
      const float alpha = exp2_approx(m[i] * scale_log2 - base);
      m[i] = mx;
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
        for (int e = 2 * i; e < 2 * i + 2; ++e) {
          s[n][e] = exp2_approx(fmaf(s[n][e], scale_log2, -base));
          sum += s[n][e];
        }
      l[i] = l[i] * alpha + sum;  // this lane's part of the row sum; the quad adds up at the end
#pragma unroll
      for (int d = 0; d < D / 8; ++d) o[d][2 * i] *= alpha, o[d][2 * i + 1] *= alpha;
    }

    cp_async_wait<1>();
    __syncthreads();  // V of tile j has landed
    if (j + 1 < tiles) gather.load(v_cache, kv_heads, kvh, vs + (1 - buf) * kTile);
    cp_async_commit();

    // O += P·V. The accumulators of key columns 16k..16k+15 are exactly P's A fragment of
    // k-step k. V rows are B rows (k = key), so ldmatrix.trans: matrices (keys 0-7, dims 0-7),
    // (keys 8-15, dims 0-7), (keys 0-7, dims 8-15), (keys 8-15, dims 8-15).
    const T* vt = vs + buf * kTile;
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      if (k0 + kk * 16 > last_key) continue;  // p = 0 for all 16 keys
      const float(&lo)[4] = s[2 * kk], (&hi)[4] = s[2 * kk + 1];  // keys 16kk + 0-7 and 8-15
      const uint32_t a[4] = {pack2<T>(lo[0], lo[1]), pack2<T>(lo[2], lo[3]), pack2<T>(hi[0], hi[1]),
                             pack2<T>(hi[2], hi[3])};
#pragma unroll
      for (int n = 0; n < D / 16; ++n) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, smem_addr(vt + (kk * 16 + mrow) * kLd + n * 16 + mcol));
        mma_16816<T>(o[2 * n], a, b[0], b[1]);
        mma_16816<T>(o[2 * n + 1], a, b[2], b[3]);
      }
    }
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float sum = l[i];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int row = q0 + warp * 16 + lane / 4 + 8 * i;
    if (row >= len) continue;
    const float inv = 1.0f / sum;
    T* dst = out + (start + row) * out_stride + h * D + (lane % 4) * 2;
#pragma unroll
    for (int d = 0; d < D / 8; ++d)
      *reinterpret_cast<uint32_t*>(dst + d * 8) = pack2<T>(o[d][2 * i] * inv, o[d][2 * i + 1] * inv);
  }
}

bool aligned(const void* p, int64_t stride_elems, int64_t elem_bytes, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0 && stride_elems * elem_bytes % bytes == 0;
}

}  // namespace

bool attention_prefill_uses_tensor_cores(Rows out, ConstRows q, const PagedKv& kv, const AttentionShape& shape,
                                         core::DType dtype) {
  return attention_mma_operands_ok(q, kv, shape, dtype) && aligned(out.data, out.stride, 2, 4);  // 4-byte pairs out
}

bool attention_mma_operands_ok(ConstRows q, const PagedKv& kv, const AttentionShape& shape, core::DType dtype) {
  if (dtype != core::DType::bf16 && dtype != core::DType::f16) return false;
  if (shape.head_dim != 64 && shape.head_dim != 128) return false;
  return aligned(q.data, q.stride, 2, 16) && aligned(kv.k_cache, 0, 2, 16) && aligned(kv.v_cache, 0, 2, 16);
}

void attention_prefill_mma(Rows out, ConstRows q, const PagedKv& kv, const int32_t* cu_q, const int32_t* kv_lens,
                           int64_t num_seqs, int64_t max_q_len, const AttentionShape& shape, core::DType dtype,
                           cudaStream_t stream) {
  const int64_t row_tiles = (max_q_len + kRows - 1) / kRows;
  if (row_tiles > 65535 || num_seqs > 65535)
    throw core::Error("attention: prefill of " + std::to_string(max_q_len) + " query rows by " +
                      std::to_string(num_seqs) + " sequences exceeds the grid (65535 x 64 rows, 65535 sequences)");
  const dim3 grid(shape.q_heads, row_tiles, num_seqs);
  const int group = static_cast<int>(shape.q_heads / shape.kv_heads);
  const float scale_log2 = shape.scale * 1.4426950408889634f;  // exp(x) = 2^(x·log2(e))
  core::dispatch_activation(dtype, [&]<class T>() {
    if constexpr (!std::is_same_v<T, float>) {
      auto launch = [&]<int D>() {
        constexpr size_t smem = mma_smem_bytes<D>();
        GPULAB_CHECK(cudaFuncSetAttribute(prefill_mma_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        prefill_mma_kernel<T, D><<<grid, kThreads, smem, stream>>>(
            static_cast<T*>(out.data), out.stride, static_cast<const T*>(q.data), q.stride,
            static_cast<const T*>(kv.k_cache), static_cast<const T*>(kv.v_cache), kv.block_table,
            kv.max_blocks_per_seq, static_cast<int>(kv.block_size), cu_q, kv_lens, static_cast<int>(shape.kv_heads),
            group, scale_log2);
        GPULAB_CHECK_LAUNCH();
      };
      if (shape.head_dim == 64) return launch.template operator()<64>();
      if (shape.head_dim == 128) return launch.template operator()<128>();
    }
    throw core::Error("attention: no tensor-core prefill for this dtype and head_dim");
  });
}

}  // namespace gpulab::kernels
