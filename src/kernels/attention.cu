#include "kernels/attention.h"

#include <cuda_fp8.h>

#include <algorithm>
#include <string>

#include "core/dtype_dispatch.h"
#include "core/error.h"
#include "kernels/attention_mma.h"
#include "kernels/block_reduce.cuh"
#include "kernels/decode_append.cuh"
#include "kernels/fp8_quant.h"
#include "kernels/invariant_divisor.h"
#include "kernels/pdl.h"

namespace gpulab::kernels {

namespace {

// Calls f.template operator()<D>() for the supported head sizes (register arrays need D at
// compile time).
template <class F>
void dispatch_head_dim(int64_t head_dim, F&& f) {
  switch (head_dim) {
    case 32: return f.template operator()<32>();
    case 64: return f.template operator()<64>();
    case 128: return f.template operator()<128>();
    case 256: return f.template operator()<256>();
    default:
      throw core::Error("attention: head_dim " + std::to_string(head_dim) + " is not supported (32, 64, 128, 256)");
  }
}

void check_shape(const AttentionShape& s) {
  if (s.q_heads <= 0 || s.kv_heads <= 0 || s.q_heads % s.kv_heads)
    throw core::Error("attention: q_heads must be a positive multiple of kv_heads");
}

// ---- prefill: one block per (64 query rows, head, sequence); 4 threads per query row ----
// K/V tiles are gathered from the pages into shared memory.

constexpr int kBr = 64, kBc = 64, kPrefillThreads = 256;
static_assert(kBr * 4 == kPrefillThreads, "four threads per query row");

template <int D>
constexpr size_t prefill_smem_bytes() {
  return sizeof(float) * (kBr * (D + 1) + kBc * (D + 1) + kBc * D + kBr * (kBc + 1));
}

template <class T, int D>
__global__ void __launch_bounds__(kPrefillThreads)
    prefill_kernel(T* out, int64_t out_stride, const T* q, int64_t q_stride, const T* k_cache, const T* v_cache,
                   const int32_t* block_table, int64_t max_blocks, int block_size, const int32_t* cu_q,
                   const int32_t* kv_lens, int kv_heads, int group, float scale) {
  constexpr int kLd = D + 1;  // padding keeps rows of Q and K in different banks
  extern __shared__ float smem[];
  float* qs = smem;             // [kBr][kLd], pre-scaled
  float* ks = qs + kBr * kLd;   // [kBc][kLd]
  float* vs = ks + kBc * kLd;   // [kBc][D]
  float* ps = vs + kBc * D;     // [kBr][kBc + 1] probabilities of the current tile

  const int seq = blockIdx.z, h = blockIdx.y, kvh = h / group;
  const int64_t start = cu_q[seq];
  const int len = cu_q[seq + 1] - cu_q[seq], kv_len = kv_lens[seq], past = kv_len - len;
  const int q0 = blockIdx.x * kBr;
  if (q0 >= len) return;
  const int tid = threadIdx.x, r = tid / 4, lane4 = tid % 4, qpos = past + q0 + r;
  const int32_t* table = block_table + seq * max_blocks;

  for (int idx = tid; idx < kBr * D; idx += kPrefillThreads) {
    const int rr = idx / D, i = idx % D;
    qs[rr * kLd + i] = q0 + rr < len ? static_cast<float>(q[(start + q0 + rr) * q_stride + h * D + i]) * scale : 0.f;
  }
  float o[D / 4] = {};
  float m = -INFINITY, l = 0.f;
  const int kv_end = min(kv_len, past + q0 + kBr);  // causal: no key beyond the tile's last query
  for (int k0 = 0; k0 < kv_end; k0 += kBc) {
    __syncthreads();  // the previous tile is consumed; on the first pass, Q is loaded
    for (int idx = tid; idx < kBc * D; idx += kPrefillThreads) {
      const int c = idx / D, i = idx % D, pos = k0 + c;
      float kv = 0.f, vv = 0.f;
      if (pos < kv_len) {
        const int64_t at = ((static_cast<int64_t>(table[pos / block_size]) * block_size + pos % block_size) * kv_heads + kvh) * D + i;
        kv = static_cast<float>(k_cache[at]);
        vv = static_cast<float>(v_cache[at]);
      }
      ks[c * kLd + i] = kv;
      vs[c * D + i] = vv;
    }
    __syncthreads();

    float s[kBc / 4];
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kBc / 4; ++j) {
      const int c = lane4 + 4 * j, key = k0 + c;
      float dot = -INFINITY;
      if (key <= qpos && key < kv_len) {
        dot = 0.f;
#pragma unroll 8
        for (int i = 0; i < D; ++i) dot += qs[r * kLd + i] * ks[c * kLd + i];
      }
      s[j] = dot;
      tile_max = fmaxf(tile_max, dot);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
    const float m_new = fmaxf(m, tile_max);
    const float m_use = m_new == -INFINITY ? 0.f : m_new;  // rows past the end see no key
    const float alpha = expf(m - m_use);
    float tile_sum = 0.f;
#pragma unroll
    for (int j = 0; j < kBc / 4; ++j) {
      const float p = expf(s[j] - m_use);
      ps[r * (kBc + 1) + lane4 + 4 * j] = p;
      tile_sum += p;
    }
    tile_sum += __shfl_xor_sync(0xffffffffu, tile_sum, 1);
    tile_sum += __shfl_xor_sync(0xffffffffu, tile_sum, 2);
    l = l * alpha + tile_sum;
    m = m_new;
    __syncwarp();  // a row's four threads share one warp: its probabilities are visible now
#pragma unroll
    for (int i = 0; i < D / 4; ++i) o[i] *= alpha;
    for (int c = 0; c < kBc; ++c) {
      const float p = ps[r * (kBc + 1) + c];
#pragma unroll
      for (int i = 0; i < D / 4; ++i) o[i] += p * vs[c * D + lane4 + 4 * i];
    }
  }
  if (q0 + r < len) {
    const float inv = 1.0f / l;
#pragma unroll
    for (int i = 0; i < D / 4; ++i)
      out[(start + q0 + r) * out_stride + h * D + lane4 + 4 * i] = static_cast<T>(o[i] * inv);
  }
}

// ---- decode: one block per (kv head, sequence, split of kSplit positions) ----
// Decode reads each cached key and value once, and one step reads little (LLaMA-2-7B at batch 1
// and 200 positions: 3 MB a layer, under 1 us at HBM speed), so its time is memory latency
// unless the loads are in flight together. Keys and values travel in 16-byte loads, kLanes
// threads per row, kRows rows per pass; a thread requests every row of its split, keys and
// values (which do not depend on the softmax), before it waits on any, so a split costs one
// memory round trip after the block table's, not one per pass. Splits are short so that even
// one short sequence spreads over many SMs: 64 positions are 32 KB of keys and values at head
// dim 128, 16 vectors a thread, whole in registers up to group 8. A shorter split would spread
// batch 1 over more SMs but double the partials the combine reads; a longer one would not fit.

constexpr int kSplit = kDecodeSplit, kDecodeThreads = 128, kDecodeWarps = kDecodeThreads / 32;
constexpr int kMaxGroup = 16;        // query heads per kv head that one block serves
constexpr int kMaxSplitBlocks = 64;  // blocks per (kv head, sequence); each merges several splits
constexpr int kDecodeBlocksPerSm = 16;  // bound on the grid, in blocks per SM (a few waves)
// Registers a thread gives to raw keys and values in flight plus its accumulators. ptxas needs
// up to about 100 more (addresses, q, sums): at 136 no instantiation spills (at 144, with the
// newest position's code, 16-bit d 256 at group 16 did).
constexpr int kDecodeRegBudget = 136;

int64_t max_split_blocks(int64_t max_seq_len) {
  return std::min<int64_t>((max_seq_len + kSplit - 1) / kSplit, kMaxSplitBlocks);
}

// The most of `passes` (halving) whose keys and values (regs_per_pass each) fit in the budget
// beside acc_regs accumulators.
constexpr int passes_in_flight(int passes, int regs_per_pass, int acc_regs) {
  while (passes > 1 && passes * regs_per_pass + acc_regs > kDecodeRegBudget) passes /= 2;
  return passes;
}

template <class T, int D, int G>
struct DecodeTile {
  static constexpr int kVec = 16 / sizeof(T);                  // elements per 16-byte load
  static constexpr int kLanes = D / kVec < 32 ? D / kVec : 32;  // threads per key or value row
  static constexpr int kChunks = D / (kVec * kLanes);          // 16-byte loads per thread and row
  static constexpr int kRows = kDecodeThreads / kLanes;        // rows per pass
  static constexpr int kPasses = kSplit / kRows;               // a thread's rows in one split
  // Passes loaded at once (a stage): the whole split where its keys and values (4 registers per
  // 16-byte vector) fit beside the G·kChunks·kVec accumulators, else halves, quarters...
  static constexpr int kStage = passes_in_flight(kPasses, 2 * kChunks * 4, G * kChunks * kVec);
  static constexpr int kStages = kPasses / kStage;
  // One head a kv head at head_dim up to 128 (LLaMA-2-7B) is bound by how many blocks an SM
  // holds: left alone, ptxas takes about 120 registers (4 blocks); at 5 it takes 96, no spills.
  static constexpr int kMinBlocks = sizeof(T) == 2 && G == 1 && D <= 128 ? 5 : 1;
  static_assert(kChunks * kVec * kLanes == D, "whole 16-byte loads per row");
  static_assert(kPasses * kRows == kSplit && kStages * kStage == kPasses, "whole passes per split and stage");
};

static_assert(DecodeTile<__nv_bfloat16, 128, 8>::kStages == 1 && DecodeTile<__half, 128, 8>::kStages == 1,
              "LLaMA shapes (head dim 128, groups up to 8) load a whole split at once");

// The N elements of a raw 16-byte vector, as floats.
template <class T, int N>
__device__ inline void unpack(float (&out)[N], const uint4& raw) {
  static_assert(N * sizeof(T) == 16, "one 16-byte vector");
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = static_cast<float>(e[i]);
}

// One block's part of the attention of the `group` (<= G) query heads of a kv head, so each key
// and value is read once per group: splits blockIdx.z, + gridDim.z, ..., merged with a running
// maximum and sum (online softmax) into one partial output per block. The split index is the
// slowest grid dimension, so blocks are dispatched first splits first, and blocks that find no
// split (max_seq_len far above the lengths) come after every block that has one. The newest
// position goes through shared memory, the others through registers: its key and value come
// from the cache after pdl_wait, or, with `added` (PagedKv::append), from the new token, which the
// block stores in the cache (q is then rotated here too). `settled` (PagedKv::settled): the first
// split's keys and values, and the new token's rope angle, are requested before pdl_wait, so
// that q and the new token take one memory round trip after it, not a chain of them (position,
// then rope table, then the cache store and the value).
template <class T, int D, int G>
__global__ void __launch_bounds__(kDecodeThreads, DecodeTile<T, D, G>::kMinBlocks)
    decode_split_kernel(const T* q, int64_t q_stride, const T* k_cache, const T* v_cache, const int32_t* block_table,
                        int64_t max_blocks, InvariantDivisor pages, const int32_t* seq_lens, bool settled,
                        NewTokens<T> added, int kv_heads, int group, float scale, float* part_o, float* part_m,
                        float* part_l) {
  using Tile = DecodeTile<T, D, G>;
  constexpr int kVec = Tile::kVec, kLanes = Tile::kLanes, kChunks = Tile::kChunks, kRows = Tile::kRows;
  constexpr int kStage = Tile::kStage, kStages = Tile::kStages;
  extern __shared__ float smem[];
  auto qs = reinterpret_cast<float(*)[D]>(smem);                         // [G][D] pre-scaled queries
  auto scores = reinterpret_cast<float(*)[kSplit]>(smem + G * D);        // [G][kSplit], then probabilities
  auto partial = reinterpret_cast<float(*)[G][D]>(smem + G * (D + kSplit));  // [warps][G][D] sums of p·v
  auto run_o = reinterpret_cast<float(*)[D]>(smem + G * (D + kSplit + kDecodeWarps * D));  // [G][D] merged so far
  float* run_m = smem + G * (2 * D + kSplit + kDecodeWarps * D);  // [G] running maximum
  float* run_l = run_m + G;                                          // [G] running sum
  float* rescale = run_l + G;                                        // [G][2] old and new weights
  float* newest_k = rescale + 2 * G;                                 // [D] the newest position's key
  float* newest_v = newest_k + D;                                    // [D] and value
  pdl_launch_dependents();
  if (!settled) pdl_wait();
  const int kvh = blockIdx.x, seq = blockIdx.y, first = blockIdx.z, blocks = gridDim.z;
  const int len = seq_lens[seq];
  if (first * kSplit >= len) {
    if (settled) pdl_wait();
    return;
  }
  const int q_heads = kv_heads * group;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  // The new token's rope angle for this thread's elements of q and of the key (every one
  // tid % (D/2)), before pdl_wait where the metadata is settled.
  static_assert(kDecodeThreads % (D / 2) == 0, "a thread's elements share their rope angle");
  const float2 cs = added.k ? added.template angle<D>(seq, tid) : float2{};
  // This thread's row slot, and its columns: kChunks runs of kVec starting at col(c).
  const int row = tid / kLanes, lane_in_row = tid % kLanes;
  auto col = [&](int c) { return (lane_in_row + c * kLanes) * kVec; };
  const int32_t* table = block_table + seq * max_blocks;
  // Row j of a split is pass j / kRows of thread row j % kRows.
  auto row_of = [&](int stage, int p) { return (stage * kStage + p) * kRows + row; };
  // The cache slot of position pos, by the block table.
  auto slot_of = [&](int pos) {
    const int page = pages.div(pos);
    return table[page] * pages.divisor() + pages.mod(pos, page);
  };
  // Requests this thread's keys or values of one stage of the split at s0, whose first
  // `from_cache` rows come from the cache. Later rows are not used and read row from_cache - 1 again
  // (already on its way): without a branch per row, every load of the stage issues before the
  // first one is waited on. The newest position's slot is not read: it may not be written yet
  // (compute-sanitizer's initcheck flagged those reads, session 30), and a split of the newest
  // position alone loads nothing. The slots come first, so that the block table's loads are in
  // flight together too.
  auto load_stage = [&](uint4 (&raw)[kStage][kChunks], const T* cache, int s0, int from_cache, int stage) {
    if (from_cache == 0) {
#pragma unroll
      for (int p = 0; p < kStage; ++p)
#pragma unroll
        for (int c = 0; c < kChunks; ++c) raw[p][c] = uint4{};
      return;
    }
    int32_t slots[kStage];
#pragma unroll
    for (int p = 0; p < kStage; ++p) slots[p] = slot_of(s0 + min(row_of(stage, p), from_cache - 1));
#pragma unroll
    for (int p = 0; p < kStage; ++p) {
      const T* at = cache + (static_cast<int64_t>(slots[p]) * kv_heads + kvh) * D;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) raw[p][c] = *reinterpret_cast<const uint4*>(at + col(c));
    }
  };

  for (int split = first; split * kSplit < len; split += blocks) {
    const int s0 = split * kSplit, n = min(len - s0, kSplit);
    const bool has_newest = s0 + n == len;
    const int cached = has_newest ? n - 1 : n;  // rows taken from the registers
    uint4 k_raw[kStage][kChunks], v_raw[kStage][kChunks];
    load_stage(k_raw, k_cache, s0, cached, 0);
    load_stage(v_raw, v_cache, s0, cached, 0);
    if (split == first) {  // after the loads above, so q travels with them
      if (settled) pdl_wait();
      constexpr int kQPerThread = (G * D + kDecodeThreads - 1) / kDecodeThreads;
      float qv[kQPerThread];  // all requested before any is stored, the newest row's loads too
#pragma unroll
      for (int i = 0; i < kQPerThread; ++i) {
        const int idx = tid + i * kDecodeThreads;
        qv[i] = idx < group * D ? added.template q_at<D>(q, q_stride, seq, kvh * group + idx / D, idx % D, cs) : 0.f;
      }
      if (((len - 1) / kSplit - first) % blocks == 0) {  // the block's last split holds the newest position
        const int64_t slot = slot_of(len - 1);
        for (int i = tid; i < D; i += kDecodeThreads) {
          T key, value;
          added.template newest<D>(seq, kvh, kv_heads, slot, i, cs, key, value);
          newest_k[i] = static_cast<float>(key), newest_v[i] = static_cast<float>(value);
        }
      }
#pragma unroll
      for (int i = 0; i < kQPerThread; ++i) {
        const int idx = tid + i * kDecodeThreads;
        if (idx < group * D) qs[idx / D][idx % D] = qv[i] * scale, run_o[idx / D][idx % D] = 0.f;
      }
      if (tid < group) run_m[tid] = -INFINITY, run_l[tid] = 0.f;
    }
    __syncthreads();  // q and the newest row are in; the previous split's scores and partials are consumed

    // Scores: every lane of a warp runs every pass (the shuffles need them all).
#pragma unroll
    for (int st = 0; st < kStages; ++st) {
      if (st > 0) load_stage(k_raw, k_cache, s0, cached, st);
#pragma unroll
      for (int p = 0; p < kStage; ++p) {
        const int j = row_of(st, p);
        float kv[kChunks][kVec];
#pragma unroll
        for (int c = 0; c < kChunks; ++c) unpack<T>(kv[c], k_raw[p][c]);
#pragma unroll
        for (int g = 0; g < G; ++g) {
          if (g >= group) break;
          float dot = 0.f;
#pragma unroll
          for (int c = 0; c < kChunks; ++c)
#pragma unroll
            for (int e = 0; e < kVec; ++e) dot += qs[g][col(c) + e] * kv[c][e];
#pragma unroll
          for (int offset = kLanes / 2; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
          if (lane_in_row == 0 && j < cached) scores[g][j] = dot;
        }
      }
    }
    __syncthreads();

    for (int g = warp; g < group; g += kDecodeWarps) {
      float newest = 0.f;  // the newest position's score, in every lane
      if (has_newest) {
        for (int i = lane; i < D; i += 32) newest += qs[g][i] * newest_k[i];
        for (int offset = 16; offset > 0; offset /= 2) newest += __shfl_xor_sync(0xffffffffu, newest, offset);
      }
      float mx = has_newest ? newest : -INFINITY;
      for (int j = lane; j < cached; j += 32) mx = fmaxf(mx, scores[g][j]);
      for (int offset = 16; offset > 0; offset /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, offset));
      float sum = 0.f;
      for (int j = lane; j < cached; j += 32) {
        const float p = expf(scores[g][j] - mx);
        scores[g][j] = p;
        sum += p;
      }
      for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      if (has_newest) {
        const float p = expf(newest - mx);
        sum += p;
        if (lane == 0) scores[g][n - 1] = p;
      }
      if (lane == 0) {
        const float m_new = fmaxf(run_m[g], mx);
        rescale[2 * g] = expf(run_m[g] - m_new);
        rescale[2 * g + 1] = expf(mx - m_new);
        run_l[g] = run_l[g] * rescale[2 * g] + sum * rescale[2 * g + 1];
        run_m[g] = m_new;
      }
    }
    __syncthreads();

    float acc[G][kChunks][kVec] = {};
#pragma unroll
    for (int st = 0; st < kStages; ++st) {
      if (st > 0) load_stage(v_raw, v_cache, s0, cached, st);
#pragma unroll
      for (int p = 0; p < kStage; ++p) {
        const int j = row_of(st, p);
        if (j >= cached) break;  // rows grow with p; past `cached`, the values are stale or repeated
        float vv[kChunks][kVec];
#pragma unroll
        for (int c = 0; c < kChunks; ++c) unpack<T>(vv[c], v_raw[p][c]);
#pragma unroll
        for (int g = 0; g < G; ++g) {
          if (g >= group) break;
          const float w = scores[g][j];
#pragma unroll
          for (int c = 0; c < kChunks; ++c)
#pragma unroll
            for (int e = 0; e < kVec; ++e) acc[g][c][e] += w * vv[c][e];
        }
      }
    }
    // Sum the rows of a warp by shuffles, then the warps through shared memory.
#pragma unroll
    for (int g = 0; g < G; ++g) {
      if (g >= group) break;
#pragma unroll
      for (int c = 0; c < kChunks; ++c)
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          float a = acc[g][c][e];
          for (int offset = 16; offset >= kLanes; offset /= 2) a += __shfl_xor_sync(0xffffffffu, a, offset);
          if (lane < kLanes) partial[warp][g][col(c) + e] = a;
        }
    }
    __syncthreads();
    for (int idx = tid; idx < group * D; idx += kDecodeThreads) {
      const int g = idx / D, i = idx % D;
      float sum = 0.f;
#pragma unroll
      for (int w = 0; w < kDecodeWarps; ++w) sum += partial[w][g][i];
      if (has_newest) sum += scores[g][n - 1] * newest_v[i];
      run_o[g][i] = run_o[g][i] * rescale[2 * g] + sum * rescale[2 * g + 1];
    }
  }
  __syncthreads();
  const int64_t head0 = static_cast<int64_t>(seq) * q_heads + kvh * group;
  for (int idx = tid; idx < group * D; idx += kDecodeThreads)
    part_o[((head0 + idx / D) * blocks + first) * D + idx % D] = run_o[idx / D][idx % D];
  if (tid < group) {
    part_m[(head0 + tid) * blocks + first] = run_m[tid];
    part_l[(head0 + tid) * blocks + first] = run_l[tid];
  }
}

// Calls f.template operator()<G>() with the smallest supported group bound G >= group.
template <class F>
void dispatch_group(int group, F&& f) {
  if (group <= 1) return f.template operator()<1>();
  if (group <= 2) return f.template operator()<2>();
  if (group <= 4) return f.template operator()<4>();
  if (group <= 8) return f.template operator()<8>();
  if (group <= kMaxGroup) return f.template operator()<kMaxGroup>();
  throw core::Error("attention: " + std::to_string(group) + " query heads per kv head is not supported (at most " +
                    std::to_string(kMaxGroup) + ")");
}

// Output elements i, i + 32, ... (N of them) of one (head, sequence) from the blocks' partials
// at base.. (`used` of them), merged with a running maximum as within a block, in one pass so that
// the loads of several partials are in flight together rather than three rounds of them. The
// elements share the running maximum and total, so a split's m and l load once for all N.
template <int N>
__device__ inline void combine_partials(float (&out)[N], const float* part_o, const float* part_m,
                                        const float* part_l, int64_t base, int used, int head_dim, int i) {
  float mx = -INFINITY, total = 0.f, acc[N] = {};
#pragma unroll 4
  for (int s = 0; s < used; ++s) {
    const float m = part_m[base + s], l = part_l[base + s];
    float o[N];
#pragma unroll
    for (int k = 0; k < N; ++k) o[k] = part_o[(base + s) * head_dim + i + 32 * k];
    const float m_new = fmaxf(mx, m), old_weight = expf(mx - m_new), weight = expf(m - m_new);
    // Explicit fmaf: left to contraction, the N = 1 and N = D/32 instantiations fused these
    // differently (one float ulp apart), and the two kernels' bits parted (session 26).
    total = fmaf(total, old_weight, l * weight);
#pragma unroll
    for (int k = 0; k < N; ++k) acc[k] = fmaf(acc[k], old_weight, o[k] * weight);
    mx = m_new;
  }
#pragma unroll
  for (int k = 0; k < N; ++k) out[k] = used ? acc[k] / total : 0.f;
}

// Blocks of a sequence that had a split (the others found the sequence shorter).
__device__ inline int used_blocks(const int32_t* seq_lens, int seq, int blocks) {
  return min(blocks, (seq_lens[seq] + kSplit - 1) / kSplit);
}

// Combines the blocks' partial outputs of one (head, sequence): thread i owns output element i.
template <class T, int D>
__global__ void __launch_bounds__(D) decode_combine_kernel(T* out, int64_t out_stride, const int32_t* seq_lens,
                                                           int q_heads, int blocks, const float* part_o,
                                                           const float* part_m, const float* part_l) {
  pdl_launch_dependents();
  pdl_wait();
  const int h = blockIdx.x, seq = blockIdx.y, i = threadIdx.x;
  const int64_t base = (static_cast<int64_t>(seq) * q_heads + h) * blocks;
  float value[1];
  combine_partials(value, part_o, part_m, part_l, base, used_blocks(seq_lens, seq, blocks), D, i);
  out[seq * out_stride + h * D + i] = static_cast<T>(value[0]);
}

// decode_combine_kernel for an e4m3 output (a W8A8 o_proj's input): the values it would write in
// T, each row then quantized with its own scale as fp8_quantize does, bit for bit, in one kernel
// rather than two. A cluster of kCombineCluster blocks per sequence, each a share of the row's
// heads; the shares' maxima meet through distributed shared memory. A warp merges one head at a
// time, a lane D / 32 of its elements (d, d + 32, ...), so that a split's m and l load once and
// its partial loads are in flight together. A warp's first head (a LLaMA-2-70B row: 64 heads,
// 8 a block, 1 a warp) stays in registers between the maximum and the bytes; any further ones are
// merged again, so that any number of heads fits.
constexpr int kCombineCluster = 8, kCombineThreads = 256, kCombineWarps = kCombineThreads / 32;

template <class T, int D>
__global__ void __cluster_dims__(kCombineCluster, 1, 1) __launch_bounds__(kCombineThreads)
    decode_combine_fp8_kernel(__nv_fp8_storage_t* out, float* scales, const int32_t* seq_lens, int q_heads,
                              int blocks, const float* part_o, const float* part_m, const float* part_l) {
  pdl_launch_dependents();
  pdl_wait();
  const cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  const int seq = blockIdx.x / kCombineCluster, used = used_blocks(seq_lens, seq, blocks);
  const int share = (q_heads + kCombineCluster - 1) / kCombineCluster;
  const int end = min(q_heads, static_cast<int>(cluster.block_rank() + 1) * share);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int first = static_cast<int>(cluster.block_rank()) * share + warp;
  // Head h's elements lane, lane + 32, ..., rounded to T as decode_combine_kernel writes them.
  const auto head_values = [&](int h, float(&values)[D / 32]) {
    combine_partials(values, part_o, part_m, part_l, (static_cast<int64_t>(seq) * q_heads + h) * blocks, used, D,
                     lane);
#pragma unroll
    for (int k = 0; k < D / 32; ++k) values[k] = static_cast<float>(static_cast<T>(values[k]));
  };
  float held[D / 32], amax = 0.f;
  if (first < end) {
    head_values(first, held);
#pragma unroll
    for (int k = 0; k < D / 32; ++k) amax = fmaxf(amax, fabsf(held[k]));
  }
  for (int h = first + kCombineWarps; h < end; h += kCombineWarps) {
    float values[D / 32];
    head_values(h, values);
#pragma unroll
    for (int k = 0; k < D / 32; ++k) amax = fmaxf(amax, fabsf(values[k]));
  }
  const float scale = fp8_scale_for_amax(cluster_max<kCombineThreads, kCombineCluster>(amax));
  if (cluster.block_rank() == 0 && threadIdx.x == 0) scales[seq] = scale;
  __nv_fp8_storage_t* row = out + static_cast<int64_t>(seq) * q_heads * D;
  const auto store = [&](int h, const float(&values)[D / 32]) {
#pragma unroll
    for (int k = 0; k < D / 32; ++k) row[h * D + lane + 32 * k] = fp8_quantize_value(values[k], scale);
  };
  if (first < end) store(first, held);
  for (int h = first + kCombineWarps; h < end; h += kCombineWarps) {
    float values[D / 32];
    head_values(h, values);
    store(h, values);
  }
}

template <class T>
__global__ void kv_write_kernel(T* k_cache, T* v_cache, const T* k, int64_t k_stride, const T* v, int64_t v_stride,
                                const int32_t* slots, int64_t width) {
  const int64_t t = blockIdx.x, slot = slots[t];
  if (slot < 0) return;
  for (int64_t i = blockIdx.y * int64_t(blockDim.x) + threadIdx.x; i < width; i += int64_t(gridDim.y) * blockDim.x) {
    k_cache[slot * width + i] = k[t * k_stride + i];
    v_cache[slot * width + i] = v[t * v_stride + i];
  }
}

}  // namespace

void attention_prefill(Rows out, ConstRows q, const PagedKv& kv, const int32_t* cu_q, const int32_t* kv_lens,
                       int64_t num_seqs, int64_t max_q_len, const AttentionShape& shape, core::DType dtype,
                       cudaStream_t stream) {
  check_shape(shape);
  if (num_seqs == 0 || max_q_len == 0) return;
  if (attention_prefill_uses_tensor_cores(out, q, kv, shape, dtype))
    return attention_prefill_mma(out, q, kv, cu_q, kv_lens, num_seqs, max_q_len, shape, dtype, stream);
  attention_prefill_scalar(out, q, kv, cu_q, kv_lens, num_seqs, max_q_len, shape, dtype, stream);
}

void attention_prefill_scalar(Rows out, ConstRows q, const PagedKv& kv, const int32_t* cu_q, const int32_t* kv_lens,
                              int64_t num_seqs, int64_t max_q_len, const AttentionShape& shape, core::DType dtype,
                              cudaStream_t stream) {
  check_shape(shape);
  if (num_seqs == 0 || max_q_len == 0) return;
  const dim3 grid((max_q_len + kBr - 1) / kBr, shape.q_heads, num_seqs);
  const int group = static_cast<int>(shape.q_heads / shape.kv_heads);
  core::dispatch_activation(dtype, [&]<class T>() {
    dispatch_head_dim(shape.head_dim, [&]<int D>() {
      constexpr size_t smem = prefill_smem_bytes<D>();
      GPULAB_CHECK(cudaFuncSetAttribute(prefill_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      prefill_kernel<T, D><<<grid, kPrefillThreads, smem, stream>>>(
          static_cast<T*>(out.data), out.stride, static_cast<const T*>(q.data), q.stride,
          static_cast<const T*>(kv.k_cache), static_cast<const T*>(kv.v_cache), kv.block_table, kv.max_blocks_per_seq,
          static_cast<int>(kv.block_size), cu_q, kv_lens, static_cast<int>(shape.kv_heads), group, shape.scale);
      GPULAB_CHECK_LAUNCH();
    });
  });
}

size_t attention_decode_workspace(int64_t num_seqs, int64_t max_seq_len, const AttentionShape& shape) {
  return sizeof(float) * num_seqs * shape.q_heads * max_split_blocks(max_seq_len) * (shape.head_dim + 2);
}

namespace {

enum class DecodePath { automatic, cuda_cores, tensor_cores };

// The output: rows of dtype, or (fp8 set) e4m3 rows and a scale per row.
struct DecodeOut {
  Rows rows;
  void* fp8 = nullptr;
  float* scales = nullptr;
};

void decode(DecodePath path, const DecodeOut& out, ConstRows q, const PagedKv& kv, const int32_t* seq_lens,
            int64_t num_seqs, int64_t max_seq_len, const AttentionShape& shape, void* workspace, core::DType dtype,
            cudaStream_t stream) {
  check_shape(shape);
  if (num_seqs == 0) return;
  const int group = static_cast<int>(shape.q_heads / shape.kv_heads);
  // One split per block where the workspace (one partial per block) allows, so a block's chain
  // is one split's round trip (LLaMA-2-7B at batch 16 and 256 positions: 4 blocks of 32 heads x
  // 16 sequences); but about kDecodeBlocksPerSm blocks per SM at most, since blocks past a
  // sequence's end (max_seq_len far above the lengths) still cost a launch and a read of its
  // length, although after the others. Past that, blocks merge several splits.
  const int64_t heads_seqs = shape.kv_heads * num_seqs;
  const int blocks = static_cast<int>(std::clamp<int64_t>(
      (kDecodeBlocksPerSm * current_sm_count() + heads_seqs - 1) / heads_seqs, 1, max_split_blocks(max_seq_len)));
  const int64_t partials = num_seqs * shape.q_heads * blocks;
  float* part_o = static_cast<float*>(workspace);
  float* part_m = part_o + partials * shape.head_dim;
  float* part_l = part_m + partials;
  const bool tensor_cores = path == DecodePath::tensor_cores ||
                            (path == DecodePath::automatic && attention_decode_uses_tensor_cores(q, kv, shape, dtype));
  if (tensor_cores)
    attention_decode_splits_mma(q, kv, seq_lens, num_seqs, shape, {part_o, part_m, part_l, blocks}, dtype, stream);
  core::dispatch_activation(dtype, [&]<class T>() {
    dispatch_head_dim(shape.head_dim, [&]<int D>() {
      if (!tensor_cores)
        dispatch_group(group, [&]<int G>() {
          constexpr size_t smem = sizeof(float) * (G * (2 * D + kSplit + kDecodeWarps * D + 4) + 2 * D);
          if constexpr (smem > 48 * 1024)
            GPULAB_CHECK(cudaFuncSetAttribute(decode_split_kernel<T, D, G>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
          launch_overlapped(decode_split_kernel<T, D, G>, dim3(shape.kv_heads, num_seqs, blocks),
                            dim3(kDecodeThreads), smem, stream, static_cast<const T*>(q.data), q.stride,
                            static_cast<const T*>(kv.k_cache), static_cast<const T*>(kv.v_cache), kv.block_table,
                            kv.max_blocks_per_seq, InvariantDivisor(kv.block_size), seq_lens, kv.settled,
                            new_tokens_of<T>(kv), static_cast<int>(shape.kv_heads), group, shape.scale, part_o,
                            part_m, part_l);
        });
      if (out.fp8)
        launch_overlapped(decode_combine_fp8_kernel<T, D>, dim3(num_seqs * kCombineCluster), dim3(kCombineThreads),
                          0, stream, static_cast<__nv_fp8_storage_t*>(out.fp8), out.scales, seq_lens,
                          static_cast<int>(shape.q_heads), blocks, part_o, part_m, part_l);
      else
        launch_overlapped(decode_combine_kernel<T, D>, dim3(shape.q_heads, num_seqs), dim3(D), 0, stream,
                          static_cast<T*>(out.rows.data), out.rows.stride, seq_lens, static_cast<int>(shape.q_heads),
                          blocks, part_o, part_m, part_l);
    });
  });
}

}  // namespace

bool attention_decode_uses_tensor_cores(ConstRows q, const PagedKv& kv, const AttentionShape& shape,
                                        core::DType dtype) {
  const int64_t group = shape.kv_heads > 0 ? shape.q_heads / shape.kv_heads : 0;
  return group >= 2 && group <= 16 && attention_mma_operands_ok(q, kv, shape, dtype);
}

void attention_decode(Rows out, ConstRows q, const PagedKv& kv, const int32_t* seq_lens, int64_t num_seqs,
                      int64_t max_seq_len, const AttentionShape& shape, void* workspace, core::DType dtype,
                      cudaStream_t stream) {
  decode(DecodePath::automatic, {out}, q, kv, seq_lens, num_seqs, max_seq_len, shape, workspace, dtype, stream);
}

void attention_decode_fp8(void* out, float* scales, ConstRows q, const PagedKv& kv, const int32_t* seq_lens,
                          int64_t num_seqs, int64_t max_seq_len, const AttentionShape& shape, void* workspace,
                          core::DType dtype, cudaStream_t stream) {
  decode(DecodePath::automatic, {{nullptr, 0}, out, scales}, q, kv, seq_lens, num_seqs, max_seq_len, shape, workspace,
         dtype, stream);
}

void attention_decode_cuda_cores(Rows out, ConstRows q, const PagedKv& kv, const int32_t* seq_lens, int64_t num_seqs,
                                 int64_t max_seq_len, const AttentionShape& shape, void* workspace, core::DType dtype,
                                 cudaStream_t stream) {
  decode(DecodePath::cuda_cores, {out}, q, kv, seq_lens, num_seqs, max_seq_len, shape, workspace, dtype, stream);
}

void attention_decode_tensor_cores(Rows out, ConstRows q, const PagedKv& kv, const int32_t* seq_lens,
                                   int64_t num_seqs, int64_t max_seq_len, const AttentionShape& shape, void* workspace,
                                   core::DType dtype, cudaStream_t stream) {
  decode(DecodePath::tensor_cores, {out}, q, kv, seq_lens, num_seqs, max_seq_len, shape, workspace, dtype, stream);
}

void kv_cache_write(void* k_cache, void* v_cache, ConstRows k, ConstRows v, const int32_t* slots, int64_t tokens,
                    int64_t kv_heads, int64_t head_dim, core::DType dtype, cudaStream_t stream) {
  if (tokens == 0) return;
  core::dispatch_activation(dtype, [&]<class T>() {
    // A token's row spreads over several blocks: decode writes few tokens.
    const dim3 grid(static_cast<unsigned>(tokens),
                    static_cast<unsigned>(std::min<int64_t>((kv_heads * head_dim + 255) / 256, 64)));
    kv_write_kernel<T><<<grid, 256, 0, stream>>>(static_cast<T*>(k_cache), static_cast<T*>(v_cache),
                                                  static_cast<const T*>(k.data), k.stride,
                                                  static_cast<const T*>(v.data), v.stride, slots, kv_heads * head_dim);
    GPULAB_CHECK_LAUNCH();
  });
}

}  // namespace gpulab::kernels
