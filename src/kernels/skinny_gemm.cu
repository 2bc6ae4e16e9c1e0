#include <cuda_fp8.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/dtype_dispatch.h"
#include "core/error.h"
#include "kernels/mma_ptx.h"
#include "kernels/pdl.h"
#include "kernels/silu.cuh"
#include "kernels/skinny_gemm.h"
#include "kernels/skinny_wgmma.h"

namespace gpulab::kernels {

namespace {

constexpr int kWarps = 8;    // K is split over the warps of a block
constexpr int kBlocksPerSm = 2;  // both tensor-core kernels: their registers and tiles are sized for it
constexpr int kWeightLoads = 16;  // 16-byte weight loads each lane keeps in flight
using e4m3 = __nv_fp8_e4m3;
// Elements of T in one 16-byte load.
template <class T>
constexpr int kPerLoad = 16 / sizeof(T);

// m16n8k16 sums over k, so any order of k serves when W's fragment and x's use the same one. A
// lane (group g = lane / 4, t = lane % 4) loads the 16 bytes at k0 = chunk + 8t of W rows g and
// g + 8 and of x row g: its words .x/.y feed the chunk's first mma (as the fragment's k pairs
// 2t and 2t + 8) and .z/.w its second, so every load is a whole 16-byte piece. e4m3 (m16n8k32)
// is the same with 16 elements a piece and k quads 4t and 4t + 16 a word.
// Volatile: kept in program order, so the first weights are in flight before pdl_wait.
__device__ inline uint4 load_streaming(const void* p) {
  uint4 v;
  asm volatile("ld.global.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

template <class T>
__device__ inline float unpack(uint32_t word, int half) {
  T v[2];
  memcpy(v, &word, 4);
  return static_cast<float>(v[half]);
}

template <class T>
__device__ inline uint4 pack8(const float (&f)[8]) {
  return {pack2<T>(f[0], f[1]), pack2<T>(f[2], f[3]), pack2<T>(f[4], f[5]), pack2<T>(f[6], f[7])};
}

template <class T>
__device__ inline void unpack8(float (&f)[8], uint4 v) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = unpack<T>(w[i / 2], i % 2);
}

// What a lane loads of activation row r at kk..kk+7: the 8 inputs (none), the 8 float32 x
// (rmsnorm), or the 8 gate and 8 up values (swiglu). Fetched with the weights, finished after.
struct RawInput {
  uint4 first, second;
};

template <class T, SkinnyPrologue P>
__device__ inline RawInput fetch_input(const void* x, int64_t r, int64_t k, int64_t kk) {
  const auto at = [](const void* p) { return *static_cast<const uint4*>(p); };
  if constexpr (P == SkinnyPrologue::none) {
    return {at(static_cast<const T*>(x) + r * k + kk), {}};
  } else if constexpr (P == SkinnyPrologue::rmsnorm) {
    const float* row = static_cast<const float*>(x) + r * k + kk;
    return {at(row), at(row + 4)};
  } else {
    const T* gate = static_cast<const T*>(x) + r * 2 * k + kk;
    return {at(gate), at(gate + k)};
  }
}

// The 8 inputs after the prologue, rounded to T where the unfused kernels round them (rmsnorm.cu:
// weight · (x · inv_rms); silu_mul.cu: g / (1 + e^-g) · u). `norm`: the norm weights at kk.
// Every block computes the SwiGLU of all of x again, so it takes the MUFU exp and divide:
// expf and an IEEE divide would make `down` compute-bound; they move the float32 value by a few
// ulp, so an input lands on the other side of a bf16 rounding only rarely.
template <class T, SkinnyPrologue P>
__device__ inline uint4 finish_input(const RawInput& raw, uint4 norm, float inv_rms) {
  if constexpr (P == SkinnyPrologue::none) {
    return raw.first;
  } else if constexpr (P == SkinnyPrologue::rmsnorm) {
    const uint32_t bits[8] = {raw.first.x, raw.first.y, raw.first.z, raw.first.w,
                              raw.second.x, raw.second.y, raw.second.z, raw.second.w};
    float wf[8], f[8];
    unpack8<T>(wf, norm);
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = wf[i] * (__uint_as_float(bits[i]) * inv_rms);
    return pack8<T>(f);
  } else {
    float g[8], u[8], f[8];
    unpack8<T>(g, raw.first);
    unpack8<T>(u, raw.second);
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = __fdividef(g[i], 1.0f + __expf(-g[i])) * u[i];
    return pack8<T>(f);
  }
}

// Chunks a warp loads a step (the prologue kernel): as many as fit in about 108 registers beside
// the accumulators and row pointers (weights 8·S, inputs 8 per row tile, norm weights 4), twice
// over (the next step's loads are in flight while this step's are used), at most 16 weight loads.
constexpr int chunks_per_step(int S, int MT, SkinnyPrologue P) {
  const int per_chunk = 2 * (8 * S + MT * 8 + (P == SkinnyPrologue::rmsnorm ? 4 : 0));
  const int fit = (108 - 4 * S * MT - 4 * S) / per_chunk;
  return fit < 1 ? 1 : fit > kWeightLoads / (2 * S) ? kWeightLoads / (2 * S) : fit;
}

// d += a·b on T's tensor-core tile: m16n8k16 for bf16/fp16, m16n8k32 for e4m3. Both take a
// lane's 16-byte pieces the same way, 8 or 16 elements of k a piece. (sm_90 runs e4m3's mma.sync
// as conversions to f16 and f16 mma: SASS F2FP and HMMA, no QMMA; only wgmma has native e4m3.)
template <class T>
__device__ inline void mma_step(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, e4m3>) mma_16832_e4m3(d, a, b0, b1);
  else mma_16816<T>(d, a, b0, b1);
}

// Columns of y one block of the tensor-core kernels writes: its S slabs of 16 channels, or
// (swiglu) 16 from a gate slab and its up slab. And the columns of y: W's rows, or half of them.
template <int S, SkinnyEpilogue E>
constexpr int kBlockColumns = E == SkinnyEpilogue::swiglu ? 16 : 16 * S;
constexpr int64_t output_width(int64_t n, SkinnyEpilogue e) { return e == SkinnyEpilogue::swiglu ? n / 2 : n; }

// The end of both tensor-core kernels: each warp's sums acc[s][j] (slab s's channels 16s + g, + 8
// for [2] and [3]; rows 8j + 2t, + 1 for [1] and [3]) meet in `partial` (shared memory, free for
// it), are summed in warp order (deterministic), scaled (e4m3: channel and row scales) and
// written or added to y, from column n0 of its `width`. swiglu: slab 0 holds the gate channels
// and slab 1 the matching up channels; each pair, rounded to Out, is gated into one column.
template <class T, class Out, int S, int MT, SkinnyEpilogue E = SkinnyEpilogue::none>
__device__ inline void store_sums(float (*partial)[S * 16][MT * 8 + 1], const float (&acc)[S][MT][4], Out* y,
                                  bool accumulate, const float* w_scales, const float* row_scales, int m,
                                  int64_t width, int64_t n0) {
  static_assert(E == SkinnyEpilogue::none || (S == 2 && std::is_same_v<Out, T>), "swiglu: a gate and an up slab, in T");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int s = 0; s < S; ++s)
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) partial[warp][s * 16 + g + 8 * (i / 2)][j * 8 + 2 * t + i % 2] = acc[s][j][i];
  __syncthreads();
  const auto sum_of = [&](int c, int r) {
    float sum = 0.f;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) sum += partial[v][c][r];
    return sum;
  };
  constexpr int kColumns = kBlockColumns<S, E>;
  for (int i = threadIdx.x; i < m * kColumns; i += kWarps * 32) {
    const int r = i / kColumns, c = i % kColumns;
    if (n0 + c >= width) continue;
    Out* out = y + r * width + n0 + c;
    if constexpr (E == SkinnyEpilogue::swiglu) {
      *out = silu_times(static_cast<T>(sum_of(c, r)), static_cast<T>(sum_of(16 + c, r)));
      continue;
    }
    float sum = sum_of(c, r);
    if constexpr (std::is_same_v<T, e4m3>) sum *= w_scales[n0 + c] * row_scales[r];
    if constexpr (std::is_same_v<Out, float>)
      *out = accumulate ? *out + sum : sum;
    else
      *out = static_cast<Out>(sum);
  }
}

// The two tensor-core kernels: one block computes S slabs of 16 output channels for all m rows
// (MT tiles of 8 rows); each warp runs every kWarps-th chunk of K, then the warps' sums meet in
// shared memory. T is the weights' and inputs' type.
//
// The prologue kernel (rmsnorm, swiglu): each lane loads its own fragment pieces of W and x
// straight into registers, the next step's while this one is summed, and builds the input.
template <class T, class Out, SkinnyPrologue P, int S, int MT>
__global__ void __launch_bounds__(kWarps * 32, kBlocksPerSm)
    skinny_gemm_kernel(Out* y, bool accumulate, const void* x, const T* norm_w, float eps, const T* w,
                       const float* w_scales, const float* row_scales, int m, int64_t n, int64_t k) {
  static_assert(P != SkinnyPrologue::none, "plain inputs take skinny_tiles_kernel");
  constexpr int U = chunks_per_step(S, MT, P);
  constexpr int kChunk = 4 * kPerLoad<T>;  // k of one warp step: each lane loads one piece of its rows
  // Padded by one: the sums below read a row of it across a warp's lanes without bank conflicts.
  __shared__ float partial[kWarps][S * 16][MT * 8 + 1];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * S * 16;

  const T* rows[S][2];  // W rows g and g + 8 of each slab; rows past n repeat row n - 1 (not stored)
#pragma unroll
  for (int s = 0; s < S; ++s)
#pragma unroll
    for (int h = 0; h < 2; ++h) rows[s][h] = w + std::min(n0 + s * 16 + g + 8 * h, n - 1) * k;
  const int64_t chunks = (k + kChunk - 1) / kChunk;
  // One step: U chunks (every kWarps-th from c0) of the weights, the input rows and the norm
  // weights; pieces past k are zeros and cost no memory access.
  struct Step {
    uint4 a[U][S][2];
    RawInput raw[U][MT];
    uint4 norm[U];
  };
  const auto piece_at = [&](int64_t c0, int u) { return (c0 + u * kWarps) * kChunk + t * kPerLoad<T>; };
  const auto load_weights = [&](Step& st, int64_t c0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t kk = piece_at(c0, u);  // whole pieces: all in or all out
#pragma unroll
      for (int s = 0; s < S; ++s)
#pragma unroll
        for (int h = 0; h < 2; ++h) st.a[u][s][h] = kk < k ? load_streaming(rows[s][h] + kk) : uint4{0, 0, 0, 0};
    }
  };
  const auto load_inputs = [&](Step& st, int64_t c0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t kk = piece_at(c0, u);
      st.norm[u] = P == SkinnyPrologue::rmsnorm && kk < k ? *reinterpret_cast<const uint4*>(norm_w + kk) : uint4{};
#pragma unroll
      for (int j = 0; j < MT; ++j)
        st.raw[u][j] = kk < k && g + 8 * j < m ? fetch_input<T, P>(x, g + 8 * j, k, kk) : RawInput{};
    }
  };
  Step cur;
  // Launched overlapped (kernels/pdl.h): the next kernel may start its blocks now, and this one
  // reads only weights until the kernel before it has finished and its writes show.
  pdl_launch_dependents();
  load_weights(cur, warp);  // in flight while the norm below waits on x
  pdl_wait();

  float row_scale[MT] = {};
  if constexpr (P == SkinnyPrologue::rmsnorm) {
    // Every block finds the rows' inverse RMS itself (x is a few rows, read from L2), each row
    // split over kWarps / m warps so that its loads are in flight together.
    __shared__ float sum_sq[kSkinnyMaxRows][kWarps];
    const int parts = std::max(1, kWarps / m);
    for (int task = warp; task < m * parts; task += kWarps) {
      const int r = task / parts, part = task % parts;
      const float4* row = reinterpret_cast<const float4*>(static_cast<const float*>(x) + r * k);
      float sum = 0.f;
      // kBatch loads in flight, predicated rather than branched around (a branch per load would
      // wait out each one's latency).
      constexpr int kBatch = 16;
      for (int64_t first = part * 32 + lane; first < k / 4; first += kBatch * parts * 32) {
        float4 v[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          const int64_t i = first + j * parts * 32;
          v[j] = i < k / 4 ? row[i] : float4{0.f, 0.f, 0.f, 0.f};
        }
#pragma unroll
        for (int j = 0; j < kBatch; ++j) sum += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
      }
      for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      if (lane == 0) sum_sq[r][part] = sum;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < MT; ++j) {
      const int r = g + 8 * j;
      if (r >= m) continue;
      float total = 0.f;
      for (int part = 0; part < parts; ++part) total += sum_sq[r][part];
      row_scale[j] = rsqrtf(total / static_cast<float>(k) + eps);
    }
  }
  load_inputs(cur, warp);

  float acc[S][MT][4] = {};
  const auto compute = [&](const Step& st) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int j = 0; j < MT; ++j) {
        const uint4 b = finish_input<T, P>(st.raw[u][j], st.norm[u], row_scale[j]);
#pragma unroll
        for (int s = 0; s < S; ++s) {
          const uint32_t lo[4] = {st.a[u][s][0].x, st.a[u][s][1].x, st.a[u][s][0].y, st.a[u][s][1].y};
          const uint32_t hi[4] = {st.a[u][s][0].z, st.a[u][s][1].z, st.a[u][s][0].w, st.a[u][s][1].w};
          mma_step<T>(acc[s][j], lo, b.x, b.y);
          mma_step<T>(acc[s][j], hi, b.z, b.w);
        }
      }
    }
  };
  // Each step's loads go out before the step before is summed: the weights stream without a
  // gap between steps (session 16: 3-20 % more weight bandwidth than loading after summing).
  constexpr int64_t kStride = kWarps * U;  // chunks between a warp's steps
  for (int64_t c0 = warp; c0 < chunks; c0 += kStride) {
    Step next;
    load_weights(next, c0 + kStride);
    load_inputs(next, c0 + kStride);
    compute(cur);
    cur = next;
  }

  store_sums<T, Out, S, MT>(partial, acc, y, accumulate, w_scales, row_scales, m, n, n0);
}

// The tiles kernel (plain inputs: bf16/fp16, or e4m3 beside e4m3 weights, W8A8, each sum then
// scaled by its channel's and its row's scale): a warp's step is a tile of 128 bytes of each of
// its W rows and x rows, copied by cp.async 8 lanes to a row (whole 128-byte lines, 4 rows an
// instruction) into a ring of kStages tiles in shared memory, kStages - 1 in flight; the lanes
// then read their fragment pieces from there. The prologue kernel's loads, a lane's own fragment
// pieces, take 16 rows a 64-byte half line an instruction, and streamed fewer bytes: session 17,
// bench decode at 16 rows, W8A8 TB/s of weights 3.12-3.52 against 2.78-2.99 (o_proj 2.49 / 1.77),
// and a 70B fp8 decode step at batch 16 22.85 against 25.94 ms. (A ring of each lane's own pieces,
// the same loads deeper in flight, was no faster than registers: not the depth, the pattern.)
constexpr int kTileBytes = 128;
constexpr int kTileSmem = 96 * 1024;  // of tiles a block, kBlocksPerSm blocks an SM
static_assert(kBlocksPerSm * (kTileSmem + 1024) <= 228 * 1024,
              "kBlocksPerSm blocks' tiles fit an SM's shared memory (sm_90: 228 KB, 1 KB of it reserved a block)");

template <int S, int MT>
struct Tiles {
  static constexpr int kRows = 16 * S + 8 * MT;  // a warp's step: W rows, then x rows
  static constexpr int kStepBytes = kRows * kTileBytes;
  static constexpr int kStages = std::clamp(kTileSmem / (kWarps * kStepBytes), 2, 8);
  static constexpr size_t kBytes = size_t{kStages} * kWarps * kStepBytes;
};

template <class T, class Out, int S, int MT, SkinnyEpilogue E>
__global__ void __launch_bounds__(kWarps * 32, kBlocksPerSm)
    skinny_tiles_kernel(Out* y, bool accumulate, const T* x, const T* w, const float* w_scales,
                        const float* row_scales, int m, int64_t n, int64_t k) {
  using L = Tiles<S, MT>;
  constexpr int D = L::kStages, kRows = L::kRows;
  constexpr int64_t kStepK = kTileBytes / sizeof(T);
  constexpr bool kSwiGlu = E == SkinnyEpilogue::swiglu;
  extern __shared__ uint4 ring[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  // The block's first output column: of S · 16 channels, or (swiglu) of 16 gate channels of the
  // first half of W, whose up channels are as far into the second.
  const int64_t width = output_width(n, E);
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBlockColumns<S, E>;
  // W row of tile row r; rows past the output's width repeat its last (not stored).
  const auto w_row = [&](int r) {
    if constexpr (kSwiGlu) return w + ((r / 16) * width + std::min(n0 + r % 16, width - 1)) * k;
    else return w + std::min(n0 + r, n - 1) * k;
  };
  const uint32_t ring_base = smem_addr(ring);
  // Piece p (16 bytes) of this warp's tile row r in `stage`, odd rows' halves swapped: the
  // fragment reads below take a 128-byte line per quarter warp without bank conflicts.
  const auto offset = [&](int stage, int r, int p) {
    return ((stage * kWarps + warp) * kRows + r) * kTileBytes + ((p ^ ((r & 1) << 2)) * 16);
  };
  // Warp step c covers k from c·kStepK; lane l copies piece l % 8 of rows l / 8 + 4i. Pieces past
  // k, and x rows past m, are zeros copied without a memory access.
  const int p_copy = lane % 8;
  const auto copy_w = [&](int stage, int64_t c) {
    const int64_t kk = c * kStepK + p_copy * kPerLoad<T>;
#pragma unroll
    for (int i = 0; i < 4 * S; ++i) {
      const int r = i * 4 + lane / 8;
      cp_async16_or_zero(ring_base + offset(stage, r, p_copy), w_row(r) + (kk < k ? kk : 0), kk < k);
    }
  };
  const auto copy_x = [&](int stage, int64_t c) {
    const int64_t kk = c * kStepK + p_copy * kPerLoad<T>;
#pragma unroll
    for (int i = 0; i < 2 * MT; ++i) {
      const int j = i * 4 + lane / 8;
      const bool in = kk < k && j < m;
      cp_async16_or_zero(ring_base + offset(stage, 16 * S + j, p_copy), x + (in ? j * k + kk : 0), in);
    }
  };
  const int64_t steps = (k + kStepK - 1) / kStepK;
  // Launched overlapped (kernels/pdl.h): the first stages' weights go out before the wait (they
  // join the first stage's commit group), x after it.
  pdl_launch_dependents();
#pragma unroll
  for (int stage = 0; stage < D - 1; ++stage) copy_w(stage, warp + stage * kWarps);
  pdl_wait();
#pragma unroll
  for (int stage = 0; stage < D - 1; ++stage) {
    copy_x(stage, warp + stage * kWarps);
    cp_async_commit();
  }
  const auto piece = [&](int stage, int r, int p) {
    return *reinterpret_cast<const uint4*>(reinterpret_cast<const char*>(ring) + offset(stage, r, p));
  };
  // Step c: copy step c + (D - 1)·kWarps into the stage step c - kWarps used, wait for step c's
  // commit group (at most D - 1 younger ones in flight), sum it: each lane's pieces p = 4u + t,
  // the same k for W's rows and x's, as the prologue kernel takes them.
  float acc[S][MT][4] = {};
  int stage = 0;
  for (int64_t c = warp; c < steps; c += kWarps) {
    const int freed = stage == 0 ? D - 1 : stage - 1;
    __syncwarp();  // every lane has read the freed stage
    copy_w(freed, c + (D - 1) * kWarps);
    copy_x(freed, c + (D - 1) * kWarps);
    cp_async_commit();
    cp_async_wait<D - 1>();
    __syncwarp();  // every lane's copies of this stage have landed
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int p = u * 4 + t;
      uint4 a[S][2];
#pragma unroll
      for (int s = 0; s < S; ++s)
#pragma unroll
        for (int h = 0; h < 2; ++h) a[s][h] = piece(stage, 16 * s + g + 8 * h, p);
#pragma unroll
      for (int j = 0; j < MT; ++j) {
        const uint4 b = piece(stage, 16 * S + 8 * j + g, p);
#pragma unroll
        for (int s = 0; s < S; ++s) {
          const uint32_t lo[4] = {a[s][0].x, a[s][1].x, a[s][0].y, a[s][1].y};
          const uint32_t hi[4] = {a[s][0].z, a[s][1].z, a[s][0].w, a[s][1].w};
          mma_step<T>(acc[s][j], lo, b.x, b.y);
          mma_step<T>(acc[s][j], hi, b.z, b.w);
        }
      }
    }
    stage = stage + 1 == D ? 0 : stage + 1;
  }
  cp_async_wait<0>();  // no copy in flight into the tiles ...
  __syncthreads();     // ... nor a warp reading them: the sums take their place
  using Partial = float[S * 16][MT * 8 + 1];
  static_assert(sizeof(Partial) * kWarps <= L::kBytes);
  store_sums<T, Out, S, MT, E>(reinterpret_cast<Partial*>(ring), acc, y, accumulate, w_scales, row_scales, m, width,
                               n0);
}

// The GEMV for m ≤ kGemvMaxRows: one warp per output channel at a time, plain FMAs (a 16-byte
// weight piece costs 8·m of them, cheap at one or two rows, where m16n8k16 would waste most of
// its 16-row side on padding). The block first writes its input rows, after the prologue, to
// shared memory; then each warp runs over its channels (every gridDim·kGemvWarps-th) in batches
// of kGemvLoads 16-byte loads a lane, the next batch in flight while this one is summed, so the
// weights stream without a gap between channels. One warp sums a channel in a fixed order:
// deterministic. Weights Wt are the activations' T, or e4m3 (16 to a load) whose channel sum is
// multiplied by the channel's scale at the end.
constexpr int kGemvWarps = 16;
constexpr int kGemvLoads = 8;

// The weights of one 16-byte load as floats: 8 of T, or 16 e4m3 (the hardware's e4m3x2 → f16x2
// conversion, exact, then to float).
template <class T, class Wt>
__device__ inline void unpack_weights(float (&f)[kPerLoad<Wt>], uint4 v) {
  if constexpr (std::is_same_v<Wt, T>) {
    unpack8<T>(f, v);
  } else {
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const auto pair = static_cast<__nv_fp8x2_storage_t>(words[i / 2] >> (16 * (i % 2)));
      const float2 two = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
      f[2 * i] = two.x;
      f[2 * i + 1] = two.y;
    }
  }
}

template <class T, class Wt, class Out, SkinnyPrologue P, int M>
__global__ void __launch_bounds__(kGemvWarps * 32, 1)
    gemv_kernel(Out* y, bool accumulate, const void* x, const T* norm_w, float eps, const Wt* w,
                const float* w_scales, int64_t n, int64_t k) {
  extern __shared__ uint4 inputs[];  // [M][k / 8]: the rows the GEMM multiplies, in T
  constexpr int kPer = kPerLoad<Wt>, kInputsPerLoad = kPer / 8;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t pieces = k / kPer, input_pieces = k / 8, step = static_cast<int64_t>(gridDim.x) * kGemvWarps;
  constexpr int64_t kBatch = 32 * kGemvLoads;  // pieces of a row one batch covers

  // The warp's next batch to load: channel `next_row`, pieces next_piece + 32u.
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp;
  int64_t next_row = first_row, next_piece = lane;
  uint4 next[kGemvLoads];
  const auto load_next = [&] {
    const uint4* row = reinterpret_cast<const uint4*>(w + next_row * k);
#pragma unroll
    for (int u = 0; u < kGemvLoads; ++u) {
      const int64_t p = next_piece + 32 * u;
      next[u] = p < pieces ? load_streaming(row + p) : uint4{0, 0, 0, 0};
    }
    next_piece += kBatch;
    if (next_piece >= pieces) next_piece = lane, next_row += step;
  };
  pdl_launch_dependents();
  if (next_row < n) load_next();  // weights in flight while the prologue waits on x
  pdl_wait();

  float inv_rms[M] = {};
  if constexpr (P == SkinnyPrologue::rmsnorm) {
    __shared__ float sum_sq[kGemvWarps][M];
    float sums[M] = {};
    for (int64_t i = threadIdx.x; i < k / 4; i += blockDim.x)
#pragma unroll
      for (int r = 0; r < M; ++r) {
        const float4 v = reinterpret_cast<const float4*>(static_cast<const float*>(x) + r * k)[i];
        sums[r] += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
      }
#pragma unroll
    for (int r = 0; r < M; ++r) {
      for (int offset = 16; offset > 0; offset /= 2) sums[r] += __shfl_xor_sync(0xffffffffu, sums[r], offset);
      if (lane == 0) sum_sq[warp][r] = sums[r];
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < M; ++r) {
      float total = 0.f;
      for (int v = 0; v < kGemvWarps; ++v) total += sum_sq[v][r];
      inv_rms[r] = rsqrtf(total / static_cast<float>(k) + eps);
    }
  }
#pragma unroll
  for (int r = 0; r < M; ++r)
    for (int64_t p = threadIdx.x; p < input_pieces; p += blockDim.x) {
      const uint4 norm = P == SkinnyPrologue::rmsnorm ? reinterpret_cast<const uint4*>(norm_w)[p] : uint4{};
      inputs[r * input_pieces + p] = finish_input<T, P>(fetch_input<T, P>(x, r, k, 8 * p), norm, inv_rms[r]);
    }
  __syncthreads();

  float acc[M] = {};
  for (int64_t row = first_row, piece = lane; row < n;) {  // `next` holds this batch
    uint4 batch[kGemvLoads];
#pragma unroll
    for (int u = 0; u < kGemvLoads; ++u) batch[u] = next[u];
    if (next_row < n) load_next();
#pragma unroll
    for (int u = 0; u < kGemvLoads; ++u) {
      const int64_t p = piece + 32 * u;
      if (p >= pieces) continue;
      float wf[kPer];
      unpack_weights<T, Wt>(wf, batch[u]);
#pragma unroll
      for (int r = 0; r < M; ++r)
#pragma unroll
        for (int h = 0; h < kInputsPerLoad; ++h) {
          float xf[8];
          unpack8<T>(xf, inputs[r * input_pieces + p * kInputsPerLoad + h]);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[r] = fmaf(wf[8 * h + i], xf[i], acc[r]);
        }
    }
    piece += kBatch;
    if (piece < pieces) continue;
#pragma unroll
    for (int r = 0; r < M; ++r) {
      for (int offset = 16; offset > 0; offset /= 2) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], offset);
      if constexpr (!std::is_same_v<Wt, T>) acc[r] *= w_scales[row];
      if (lane == 0) {
        Out* out = y + r * n + row;
        if constexpr (std::is_same_v<Out, float>)
          *out = accumulate ? *out + acc[r] : acc[r];
        else
          *out = static_cast<Out>(acc[r]);
      }
      acc[r] = 0.f;
    }
    row += step, piece = lane;
  }
}

template <class T, class Wt, class Out, SkinnyPrologue P>
void launch_gemv(void* y, bool accumulate, const SkinnyInput& in, const SkinnyWeights& w, int64_t m, int64_t n,
                 int64_t k, cudaStream_t stream) {
  const auto run = [&]<int M>() {
    const auto kernel = gemv_kernel<T, Wt, Out, P, M>;
    const size_t smem = M * k * sizeof(T);
    if (smem > 48 * 1024)
      GPULAB_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    int per_sm = 0;
    GPULAB_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kGemvWarps * 32, smem));
    if (per_sm < 1)
      throw core::Error("skinny_gemm: this GPU cannot hold " + std::to_string(smem) + " bytes of input rows in a block");
    // Every block resident at once (no second wave), none without a channel.
    const int64_t blocks =
        std::min<int64_t>(static_cast<int64_t>(current_sm_count()) * per_sm, (n + kGemvWarps - 1) / kGemvWarps);
    launch_overlapped(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kGemvWarps * 32), smem, stream,
                      static_cast<Out*>(y), accumulate, in.x, static_cast<const T*>(in.norm_weight), in.eps,
                      static_cast<const Wt*>(w.w), w.scales, n, k);
  };
  static_assert(kGemvMaxRows == 2);
  if (m == 1) run.template operator()<1>();
  else run.template operator()<2>();
}

// Slabs per block (a block: 16 · S channels; each block reads all of x, L2 traffic beside W's).
// bf16 takes one slab while that fits the grid in one wave (kBlocksPerSm an SM), else two: fewer,
// longer blocks rather than a second, mostly empty wave. Session 21, bench llm batch 16, this
// rule against the earlier one (two slabs only where that still fills a wave), same binary:
// 13B (o_proj/down: 320 one-slab blocks for 264 places) 8.426-8.461 → 8.164-8.171 ms a step, 8B
// (qkv: 384) 4.511-4.524 → 4.494-4.495; two slabs where one fits (7B/8B o_proj/down) lost 3 %.
// e4m3 keeps the earlier rule, and past 8 rows one slab: two measured no faster there (session
// 17, 16 rows: qkv 3.02 against 3.12 TB/s, gate_up 3.43 against 3.31, a 70B step 22.88 against
// 22.85 ms). (Four did not pay at any size in sessions 9-16.)
int slabs_per_block(int64_t m, int64_t n, bool fp8) {
  const int64_t places = kBlocksPerSm * static_cast<int64_t>(current_sm_count());
  if (fp8) return m <= 8 && (n + 31) / 32 >= places ? 2 : 1;
  return (n + 15) / 16 > places ? 2 : 1;
}

template <class T, class Out, SkinnyPrologue P, SkinnyEpilogue E = SkinnyEpilogue::none>
void launch_mma(void* y, bool accumulate, const SkinnyInput& in, const SkinnyWeights& w, int64_t m, int64_t n,
                int64_t k, cudaStream_t stream) {
  constexpr bool fp8 = std::is_same_v<T, e4m3>, swiglu = E == SkinnyEpilogue::swiglu;
  const int s = swiglu ? 2 : slabs_per_block(m, n, fp8);  // swiglu: a gate slab and its up slab
  const auto run = [&]<int S, int MT>() {
    launch_overlapped(skinny_gemm_kernel<T, Out, P, S, MT>, dim3(static_cast<unsigned>((n + 16 * S - 1) / (16 * S))),
                      dim3(kWarps * 32), 0, stream, static_cast<Out*>(y), accumulate, in.x,
                      static_cast<const T*>(in.norm_weight), in.eps, static_cast<const T*>(w.w), w.scales,
                      in.row_scales, static_cast<int>(m), n, k);
  };
  const auto run_tiles = [&]<int S, int MT>() {
    const auto kernel = skinny_tiles_kernel<T, Out, S, MT, E>;
    constexpr size_t smem = Tiles<S, MT>::kBytes;
    constexpr int kColumns = kBlockColumns<S, E>;
    const int64_t blocks = (output_width(n, E) + kColumns - 1) / kColumns;
    GPULAB_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    launch_overlapped(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kWarps * 32), smem,
                      stream, static_cast<Out*>(y), accumulate, static_cast<const T*>(in.x),
                      static_cast<const T*>(w.w), w.scales, in.row_scales, static_cast<int>(m), n, k);
  };
  const auto with_slabs = [&]<int MT>() {
    if constexpr (swiglu) {
      run_tiles.template operator()<2, MT>();
    } else if constexpr (P == SkinnyPrologue::none) {
      if (s == 2) run_tiles.template operator()<2, MT>();
      else run_tiles.template operator()<1, MT>();
    } else {
      if (s == 2) run.template operator()<2, MT>();
      else run.template operator()<1, MT>();
    }
  };
  if (m <= 8) with_slabs.template operator()<1>();
  else with_slabs.template operator()<2>();
}

template <class T, class Wt, class Out, SkinnyPrologue P>
void launch(void* y, bool accumulate, const SkinnyInput& in, const SkinnyWeights& w, int64_t m, int64_t n, int64_t k,
            cudaStream_t stream, bool gemv) {
  if (gemv) return launch_gemv<T, Wt, Out, P>(y, accumulate, in, w, m, n, k, stream);
  // e4m3 weights beside T inputs never get here: skinny_gemm sends them to the GEMV or refuses.
  if constexpr (std::is_same_v<Wt, T>) launch_mma<T, Out, P>(y, accumulate, in, w, m, n, k, stream);
}

// The W8A8 weights (bytes) from which `automatic` takes wgmma, at more than 8 rows. Session 26
// (H200): alone (bench decode, the GPU below its power cap) LLaMA-2-7B's GEMMs streamed slower
// on wgmma than on mma.sync at 16 rows, much slower where small (o_proj 1.55 against 2.57 TB/s,
// down 2.39 / 3.51: 64 tiles of 64 channels, in clusters of 4) and a little where large (qkv
// 3.06 / 3.14, gate_up 3.28 / 3.30). In the decode step with wgmma from 64 MiB, the 70B step at
// batch 16 (its GEMMs all that large, the GPU at its 700 W cap) went 20.80-20.84 → 19.71 ms;
// 13B 5.455-5.478 → 5.400-5.404 and 7B 3.201-3.208 → 3.155-3.170 at batch 16, but 7B at batch
// 4 2.423-2.440 → 2.506-2.523 (wgmma multiplies 16 rows whatever m; mma.sync 8 up to 8).
// wgmma spends less a weight byte: no conversions to f16, no fragments through registers, the
// activations read once per 64 channels rather than 16; where power sets the clock, that buys
// speed.
constexpr int64_t kWgmmaMinWeights = int64_t{64} << 20;

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int64_t weights_per_load(core::DType w_dtype) { return 16 / static_cast<int64_t>(core::dtype_size(w_dtype)); }

}  // namespace

bool skinny_gemv_fits(int64_t m, int64_t k, core::DType w_dtype) {
  return m >= 1 && m <= kGemvMaxRows && k > 0 && k % weights_per_load(w_dtype) == 0 && 2 * m * k <= kGemvMaxInputBytes;
}

bool skinny_gemm_fits(int64_t m, int64_t k, core::DType w_dtype) {
  return m >= 1 && m <= kSkinnyMaxRows && k > 0 && k % weights_per_load(w_dtype) == 0;
}

void skinny_gemm(void* y, core::DType y_dtype, bool accumulate, const SkinnyInput& in, const SkinnyWeights& w,
                 int64_t m, int64_t n, int64_t k, cudaStream_t stream, SkinnyKernel kernel,
                 SkinnyEpilogue epilogue) {
  using core::DType;
  const bool fp8 = w.dtype == DType::f8e4m3, w8a8 = in.row_scales != nullptr;
  if (w.dtype != DType::bf16 && w.dtype != DType::f16 && !fp8)
    throw core::Error("skinny_gemm: weights must be bf16, fp16 or e4m3");
  if (fp8 != (w.scales != nullptr))
    throw core::Error("skinny_gemm: e4m3 weights need their per-channel scales, and other weights take none");
  if (w8a8 && (!fp8 || in.prologue != SkinnyPrologue::none))
    throw core::Error("skinny_gemm: e4m3 inputs (row scales) go with e4m3 weights and no prologue");
  const std::string sizes = "m " + std::to_string(m) + ", n " + std::to_string(n) + ", k " + std::to_string(k);
  const bool weight_only = fp8 && !w8a8;  // the GEMV's, bf16 inputs
  if (!(weight_only ? skinny_gemv_fits(m, k, w.dtype) : skinny_gemm_fits(m, k, w.dtype)) || n < 1)
    throw core::Error(weight_only ? "skinny_gemm: takes e4m3 weights beside bf16 inputs on the GEMV only (1 to " +
                                        std::to_string(kGemvMaxRows) + " rows, k a multiple of 16), not " + sizes
                                  : "skinny_gemm: takes 1 to 16 rows and k a multiple of " +
                                        std::to_string(weights_per_load(w.dtype)) + ", not " + sizes);
  const DType narrow = fp8 ? DType::bf16 : w.dtype;
  if (y_dtype != DType::f32 && (y_dtype != narrow || accumulate))
    throw core::Error("skinny_gemm: writes " + std::string(core::dtype_name(narrow)) +
                      " or float32 (which it may add to)");
  if (kernel == SkinnyKernel::gemv && (w8a8 || !skinny_gemv_fits(m, k, w.dtype)))
    throw core::Error("skinny_gemm: the GEMV kernel takes at most " + std::to_string(kGemvMaxRows) + " rows of " +
                      std::to_string(kGemvMaxInputBytes / 1024) + " KiB of bf16 or fp16 inputs together, not " + sizes);
  if (kernel == SkinnyKernel::mma && weight_only)
    throw core::Error("skinny_gemm: e4m3 weights beside bf16 inputs run on the GEMV only");
  if (kernel == SkinnyKernel::wgmma && (!w8a8 || epilogue != SkinnyEpilogue::none || !skinny_wgmma_runs_here()))
    throw core::Error("skinny_gemm: the wgmma kernel takes e4m3 inputs and weights (W8A8), no epilogue, on a "
                      "compute 9.0 GPU");
  const bool swiglu = epilogue == SkinnyEpilogue::swiglu;
  if (swiglu && (fp8 || in.prologue != SkinnyPrologue::none || y_dtype != w.dtype || n % 2 != 0 ||
                 kernel == SkinnyKernel::gemv))
    throw core::Error("skinny_gemm: the swiglu epilogue takes bf16 or fp16 weights, plain inputs and an even n (" +
                      sizes + ") on the tiles kernel, and writes the weights' dtype");
  const bool gemv = !w8a8 && (kernel == SkinnyKernel::gemv ||
                              (kernel == SkinnyKernel::automatic && skinny_gemv_fits(m, k, w.dtype)));
  const bool norm = in.prologue == SkinnyPrologue::rmsnorm;
  if (!aligned16(y) || !aligned16(in.x) || !aligned16(w.w) || (norm && !aligned16(in.norm_weight)))
    throw core::Error("skinny_gemm: x, w, y and the norm weight must start on 16-byte boundaries");
  if (swiglu) {
    core::dispatch_activation(w.dtype, [&]<class T>() {
      if constexpr (!std::is_same_v<T, float>)
        launch_mma<T, T, SkinnyPrologue::none, SkinnyEpilogue::swiglu>(y, false, in, w, m, n, k, stream);
    });
    return;
  }
  if (w8a8) {
    if (kernel == SkinnyKernel::wgmma ||
        (kernel == SkinnyKernel::automatic && m > 8 && n * k >= kWgmmaMinWeights && skinny_wgmma_runs_here()))
      return skinny_w8a8_wgmma(y, y_dtype == DType::f32, accumulate, in.x, in.row_scales, w.w, w.scales, m, n, k,
                               stream);
    if (y_dtype == DType::f32) launch_mma<e4m3, float, SkinnyPrologue::none>(y, accumulate, in, w, m, n, k, stream);
    else launch_mma<e4m3, __nv_bfloat16, SkinnyPrologue::none>(y, accumulate, in, w, m, n, k, stream);
    return;
  }
  core::dispatch_activation(narrow, [&]<class T>() {
    if constexpr (!std::is_same_v<T, float>) {
      core::dispatch_activation(y_dtype, [&]<class Out>() {
        if constexpr (std::is_same_v<Out, float> || std::is_same_v<Out, T>) {
          const auto with_weights = [&]<class Wt>() {
            switch (in.prologue) {
              case SkinnyPrologue::none:
                return launch<T, Wt, Out, SkinnyPrologue::none>(y, accumulate, in, w, m, n, k, stream, gemv);
              case SkinnyPrologue::rmsnorm:
                return launch<T, Wt, Out, SkinnyPrologue::rmsnorm>(y, accumulate, in, w, m, n, k, stream, gemv);
              case SkinnyPrologue::swiglu:
                return launch<T, Wt, Out, SkinnyPrologue::swiglu>(y, accumulate, in, w, m, n, k, stream, gemv);
            }
          };
          if (!fp8) with_weights.template operator()<T>();
          else if constexpr (std::is_same_v<T, __nv_bfloat16>) with_weights.template operator()<e4m3>();
        }
      });
    }
  });
}

}  // namespace gpulab::kernels
