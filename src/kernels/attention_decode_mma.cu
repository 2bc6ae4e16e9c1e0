// Decode attention's split pass on tensor cores, for GQA. The query heads that share a kv head
// are the rows of one m16n8k16 tile (up to 16), so a 64-position split's S = Q·Kᵀ and O = P·V
// are a few mma per warp. The CUDA-core split kernel (attention.cu) spends `group` multiply-adds
// and as many shared-memory reads of q on every cached element: at group 8 that arithmetic, not
// HBM, bounds it (LLaMA-3-8B shape, batch 16, 2048 positions: 1.6 TB/s where group 1 reads 4).
//
// A block of 4 warps owns (kv head, sequence, splits blockIdx.z, + gridDim.z, ...), as the
// CUDA-core kernel, and writes the same partials. Per split, cp.async gathers K and V from the
// pages into shared memory in two groups, so the scores start while V is still on its way; warp w
// scores positions 16w..16w+15; the maxima of the 4 warps meet in shared memory; P goes to shared
// memory in T; then warp w accumulates O's columns [w·D/4, (w+1)·D/4) over all 64 positions, so
// no partial outputs need adding across warps. The next split's K is requested once the scores
// are done, and its V once P·V is. With PagedKv::settled, the first split's K and V but the
// newest position are requested before pdl_wait, and Q and that position after it. With
// PagedKv::append (`added`), Q is rotated on its way to shared memory, and the newest position
// is the new token, which the block that has it stores in the cache.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <type_traits>

#include "core/dtype_dispatch.h"
#include "core/error.h"
#include "kernels/attention_mma.h"
#include "kernels/decode_append.cuh"
#include "kernels/mma_ptx.h"
#include "kernels/paged_gather.cuh"
#include "kernels/pdl.h"

namespace gpulab::kernels {

namespace {

constexpr int kSplit = kDecodeSplit, kWarps = 4, kThreads = 32 * kWarps;
constexpr int kHeadRows = 16;  // query heads of a kv head: one mma row tile, zero past the group
// Blocks an SM holds at head_dim 128 by shared memory. Left alone, ptxas takes about 120
// registers a thread (4 blocks); bound to 5 blocks it takes 96, without spills.
constexpr int kBlocksPerSm = 5;
static_assert(kSplit == 16 * kWarps, "each warp scores one 16-position k-step of P·V");

template <int D>
struct DecodeMmaSmem {
  static constexpr int kLd = ldmatrix_pitch<D>(), kPd = ldmatrix_pitch<kSplit>();
  static constexpr size_t kBytes = sizeof(uint16_t) * (kHeadRows * kLd + 2 * kSplit * kLd + kHeadRows * kPd + 2 * D) +
                                   sizeof(float) * 2 * kWarps * kHeadRows;
};

// Fragment ownership (PTX ISA, mma.m16n8k16): accumulator c[0..1] of lane L is row L/4,
// columns 2(L%4) and +1; c[2..3] the same columns of row L/4 + 8.
template <class T, int D>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    decode_mma_kernel(const T* q, int64_t q_stride, const T* k_cache, const T* v_cache, const int32_t* block_table,
                      int64_t max_blocks, int block_size, const int32_t* seq_lens, bool settled,
                      NewTokens<T> added, int kv_heads, int group, float scale, float* part_o, float* part_m,
                      float* part_l) {
  using Smem = DecodeMmaSmem<D>;
  constexpr int kLd = Smem::kLd, kPd = Smem::kPd;
  using Gather = PagedGather<T, D, kThreads, kSplit>;
  constexpr int kCols = D / kWarps;  // output columns per warp
  static_assert(kHeadRows % Gather::kStep == 0 && kCols % 16 == 0, "whole copy waves and whole ldmatrix tiles");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* qs = reinterpret_cast<T*>(smem_raw);  // [kHeadRows][kLd]
  T* ks = qs + kHeadRows * kLd;            // [kSplit][kLd]
  T* vs = ks + kSplit * kLd;               // [kSplit][kLd]
  T* ps = vs + kSplit * kLd;               // [kHeadRows][kPd] softmax weights of the split
  float* warp_max = reinterpret_cast<float*>(ps + kHeadRows * kPd);  // [kWarps][kHeadRows]
  float* warp_sum = warp_max + kWarps * kHeadRows;                   // [kWarps][kHeadRows]
  T* newest_k = reinterpret_cast<T*>(warp_sum + kWarps * kHeadRows);  // [D] the newest position's key
  T* newest_v = newest_k + D;                                         // [D] and value
  pdl_launch_dependents();
  if (!settled) pdl_wait();
  const int kvh = blockIdx.x, seq = blockIdx.y, first = blockIdx.z, blocks = gridDim.z;
  const int len = seq_lens[seq];
  if (first * kSplit >= len) {
    if (settled) pdl_wait();
    return;
  }
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int32_t* table = block_table + seq * max_blocks;
  const float scale_log2 = scale * 1.4426950408889634f;  // exp(x) = 2^(x·log2(e))

  Gather gather;  // this split's K and V (K finds the slots, V reuses them)
  // The split at s0's keys or values into dst, but the newest position (tile row len - 1 - s0,
  // if below kSplit); then that one, from newest_k or newest_v. Thread tid copies the elements
  // it wrote there itself, so no barrier comes between.
  const auto older_rows = [&](const T* cache, T* dst, int s0) {
    gather.load_if(cache, kv_heads, kvh, dst, [&](int r) { return r != len - 1 - s0; });
  };
  const auto newest_row = [&](const T* newest, T* dst, int s0) {
    const int r = len - 1 - s0;
    if (r < kSplit)
      for (int i = tid; i < D; i += kThreads) dst[r * kLd + i] = newest[i];
  };
  int split = first;
  gather.find(table, block_size, split * kSplit, len);
  older_rows(k_cache, ks, split * kSplit);
  cp_async_commit();  // group: K
  older_rows(v_cache, vs, split * kSplit);
  cp_async_commit();  // group: V
  // The new token's rope angle for this thread's elements of Q and of the key (every one
  // tid % (D/2)), before pdl_wait where the metadata is settled.
  static_assert(kThreads % (D / 2) == 0, "a thread's elements share their rope angle");
  const float2 cs = added.k ? added.template angle<D>(seq, tid) : float2{};
  if (settled) pdl_wait();
  if (((len - 1) / kSplit - first) % blocks == 0) {  // the block's last split holds the newest position
    const int64_t slot = static_cast<int64_t>(table[(len - 1) / block_size]) * block_size + (len - 1) % block_size;
    for (int i = tid; i < D; i += kThreads)
      added.template newest<D>(seq, kvh, kv_heads, slot, i, cs, newest_k[i], newest_v[i]);
  }
  // Q: the group's heads, zero past it; rotated here where the decode appends.
  const T* q_rows = q + seq * q_stride + static_cast<int64_t>(kvh * group) * D;
  if (added.k) {
    // By 4, so that 4 rows' loads are in flight together; fully unrolled, they would hold
    // registers the rest of the kernel needs.
#pragma unroll 4
    for (int idx = tid; idx < kHeadRows * D; idx += kThreads) {
      const int r = idx / D, i = idx % D;
      qs[r * kLd + i] = r < group ? rope_at<T, D>(q_rows + r * D, i, cs) : T(0.f);
    }
  } else {
#pragma unroll
    for (int r = gather.row0; r < kHeadRows; r += Gather::kStep) {
      const bool ok = r < group;
      cp_async16_or_zero(smem_addr(qs + r * kLd + gather.chunk * 8), ok ? q_rows + r * D + gather.chunk * 8 : q, ok);
    }
  }
  cp_async_commit();  // group: Q
  newest_row(newest_k, ks, split * kSplit);
  newest_row(newest_v, vs, split * kSplit);
  cp_async_wait<0>();
  __syncthreads();  // K, V, Q and the newest row are in

  // Q's A fragments, D/16 k-steps: ldmatrix matrices (rows 0-7 | 8-15) x (columns 0-7 | 8-15).
  const int mrow = (lane % 8) + ((lane / 8) % 2) * 8, mcol = (lane / 16) * 8;
  uint32_t qf[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(qf[kk], smem_addr(qs + mrow * kLd + kk * 16 + mcol));

  float o[kCols / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // rows lane/4 and lane/4 + 8, m in raw score units
  for (;;) {
    const int n = min(len - split * kSplit, kSplit);  // positions of this split
    // S = Q·Kᵀ for this warp's 16 positions: plain ldmatrix of K rows gives B (as in prefill).
    float s[2][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t b[4];
      ldmatrix_x4(b, smem_addr(ks + (warp * 16 + (lane % 8) + (lane / 16) * 8) * kLd + kk * 16 + ((lane / 8) % 2) * 8));
      mma_16816<T>(s[0], qf[kk], b[0], b[1]);
      mma_16816<T>(s[1], qf[kk], b[2], b[3]);
    }
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (warp * 16 + t * 8 + (lane % 4) * 2 + e % 2 >= n) s[t][e] = -INFINITY;
#pragma unroll
    for (int i = 0; i < 2; ++i) {  // this warp's maximum of each row, over the quad that holds it
      float mx = fmaxf(fmaxf(s[0][2 * i], s[0][2 * i + 1]), fmaxf(s[1][2 * i], s[1][2 * i + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      if (lane % 4 == 0) warp_max[warp * kHeadRows + lane / 4 + 8 * i] = mx;
    }
    __syncthreads();  // every warp's maxima are in, and K is consumed
    const int next = split + blocks;
    const bool more = next * kSplit < len;
    if (more) {
      gather.find(table, block_size, next * kSplit, len);
      older_rows(k_cache, ks, next * kSplit);
      newest_row(newest_k, ks, next * kSplit);
    }
    cp_async_commit();  // group: the next split's K (possibly empty)

    // Softmax weights against the running maximum: every row has a score here (n >= 1; heads
    // past the group score 0), so the maximum is finite.
    float alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = lane / 4 + 8 * i;
      float mx = m[i];
#pragma unroll
      for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, warp_max[w * kHeadRows + row]);
      const float base = mx * scale_log2;
      alpha[i] = exp2_approx(m[i] * scale_log2 - base);  // 0 on the first split (m = -inf)
      m[i] = mx;
      float sum = 0.f;
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int e = 2 * i; e < 2 * i + 2; ++e) {
          s[t][e] = exp2_approx(fmaf(s[t][e], scale_log2, -base));
          sum += s[t][e];
        }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      if (lane % 4 == 0) warp_sum[warp * kHeadRows + row] = sum;
#pragma unroll
      for (int t = 0; t < 2; ++t)
        *reinterpret_cast<uint32_t*>(ps + row * kPd + warp * 16 + t * 8 + (lane % 4) * 2) =
            pack2<T>(s[t][2 * i], s[t][2 * i + 1]);
    }
    cp_async_wait<1>();
    __syncthreads();  // V has landed; P and the sums are in
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float sum = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum += warp_sum[w * kHeadRows + lane / 4 + 8 * i];
      l[i] = l[i] * alpha[i] + sum;
#pragma unroll
      for (int c = 0; c < kCols / 8; ++c) o[c][2 * i] *= alpha[i], o[c][2 * i + 1] *= alpha[i];
    }
    // O += P·V over the split for this warp's columns: P's A fragments by ldmatrix, V's B
    // fragments by ldmatrix.trans (V rows are B rows: k = position).
#pragma unroll
    for (int kk = 0; kk < kSplit / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4(a, smem_addr(ps + mrow * kPd + kk * 16 + mcol));
#pragma unroll
      for (int c = 0; c < kCols / 16; ++c) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, smem_addr(vs + (kk * 16 + mrow) * kLd + warp * kCols + c * 16 + mcol));
        mma_16816<T>(o[2 * c], a, b[0], b[1]);
        mma_16816<T>(o[2 * c + 1], a, b[2], b[3]);
      }
    }
    if (!more) break;
    __syncthreads();  // V and P are consumed
    older_rows(v_cache, vs, next * kSplit);
    newest_row(newest_v, vs, next * kSplit);
    cp_async_commit();  // group: the next split's V
    split = next;
    cp_async_wait<1>();
    __syncthreads();  // its K has landed
  }

  const int q_heads = kv_heads * group;
  const int64_t head0 = static_cast<int64_t>(seq) * q_heads + kvh * group;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int g = lane / 4 + 8 * i;
    if (g >= group) continue;
    const int64_t at = (head0 + g) * blocks + first;
    float* dst = part_o + at * D + warp * kCols + (lane % 4) * 2;
#pragma unroll
    for (int c = 0; c < kCols / 8; ++c)
      *reinterpret_cast<float2*>(dst + c * 8) = make_float2(o[c][2 * i], o[c][2 * i + 1]);
    if (warp == 0 && lane % 4 == 0) part_m[at] = m[i] * scale, part_l[at] = l[i];
  }
}

}  // namespace

void attention_decode_splits_mma(ConstRows q, const PagedKv& kv, const int32_t* seq_lens, int64_t num_seqs,
                                 const AttentionShape& shape, const DecodePartials& parts, core::DType dtype,
                                 cudaStream_t stream) {
  const int group = static_cast<int>(shape.q_heads / shape.kv_heads);
  if (group > kHeadRows)
    throw core::Error("attention: tensor-core decode serves at most " + std::to_string(kHeadRows) +
                      " query heads per kv head, not " + std::to_string(group));
  if (!attention_mma_operands_ok(q, kv, shape, dtype))
    throw core::Error("attention: no tensor-core decode for this dtype, head_dim or alignment");
  const dim3 grid(shape.kv_heads, num_seqs, parts.blocks);
  core::dispatch_activation(dtype, [&]<class T>() {
    if constexpr (!std::is_same_v<T, float>) {
      auto launch = [&]<int D>() {
        constexpr size_t smem = DecodeMmaSmem<D>::kBytes;
        static_assert(smem <= 48 * 1024, "within the default dynamic shared memory");
        launch_overlapped(decode_mma_kernel<T, D>, grid, dim3(kThreads), smem, stream, static_cast<const T*>(q.data),
                          q.stride, static_cast<const T*>(kv.k_cache), static_cast<const T*>(kv.v_cache),
                          kv.block_table, kv.max_blocks_per_seq, static_cast<int>(kv.block_size), seq_lens,
                          kv.settled, new_tokens_of<T>(kv), static_cast<int>(shape.kv_heads), group, shape.scale,
                          parts.o, parts.m, parts.l);
      };
      if (shape.head_dim == 64) return launch.template operator()<64>();
      return launch.template operator()<128>();
    }
  });
}

}  // namespace gpulab::kernels
