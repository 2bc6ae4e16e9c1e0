#include "kernels/attention.h"

#include <string>

#include "core/dtype_dispatch.h"
#include "core/error.h"

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

constexpr int kBr = 64, kBc = 64, kPrefillThreads = 256;
static_assert(kBr * 4 == kPrefillThreads, "four threads per query row");

template <int D>
constexpr size_t prefill_smem_bytes() {
  return sizeof(float) * (kBr * (D + 1) + kBc * (D + 1) + kBc * D + kBr * (kBc + 1));
}

template <class T, int D>
__global__ void __launch_bounds__(kPrefillThreads)
    prefill_kernel(T* out, int64_t out_stride, const T* q, int64_t q_stride, const T* k, int64_t k_stride,
                   const T* v, int64_t v_stride, const int32_t* cu_seqlens, int group, float scale) {
  constexpr int kLd = D + 1;  // padding keeps rows of Q and K in different banks
  extern __shared__ float smem[];
  float* qs = smem;             // [kBr][kLd], pre-scaled
  float* ks = qs + kBr * kLd;   // [kBc][kLd]
  float* vs = ks + kBc * kLd;   // [kBc][D]
  float* ps = vs + kBc * D;     // [kBr][kBc + 1] probabilities of the current tile

  const int seq = blockIdx.z, h = blockIdx.y, kvh = h / group;
  const int64_t start = cu_seqlens[seq];
  const int len = cu_seqlens[seq + 1] - cu_seqlens[seq];
  const int q0 = blockIdx.x * kBr;
  if (q0 >= len) return;
  const int tid = threadIdx.x, r = tid / 4, lane4 = tid % 4, qpos = q0 + r;

  for (int idx = tid; idx < kBr * D; idx += kPrefillThreads) {
    const int rr = idx / D, i = idx % D;
    qs[rr * kLd + i] = q0 + rr < len ? static_cast<float>(q[(start + q0 + rr) * q_stride + h * D + i]) * scale : 0.f;
  }
  float o[D / 4] = {};
  float m = -INFINITY, l = 0.f;
  const int kv_end = min(len, q0 + kBr);  // causal: no key beyond the tile's last query
  for (int k0 = 0; k0 < kv_end; k0 += kBc) {
    __syncthreads();  // the previous tile is consumed; on the first pass, Q is loaded
    for (int idx = tid; idx < kBc * D; idx += kPrefillThreads) {
      const int c = idx / D, i = idx % D;
      const bool inside = k0 + c < len;
      ks[c * kLd + i] = inside ? static_cast<float>(k[(start + k0 + c) * k_stride + kvh * D + i]) : 0.f;
      vs[c * D + i] = inside ? static_cast<float>(v[(start + k0 + c) * v_stride + kvh * D + i]) : 0.f;
    }
    __syncthreads();

    float s[kBc / 4];
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kBc / 4; ++j) {
      const int c = lane4 + 4 * j, key = k0 + c;
      float dot = -INFINITY;
      if (key <= qpos && key < len) {
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
  if (qpos < len) {
    const float inv = 1.0f / l;
#pragma unroll
    for (int i = 0; i < D / 4; ++i) out[(start + qpos) * out_stride + h * D + lane4 + 4 * i] = static_cast<T>(o[i] * inv);
  }
}

// ---- decode: one block per (split of kSplit positions, kv head, sequence) ----

constexpr int kSplit = 256, kDecodeThreads = 128, kDecodeWarps = kDecodeThreads / 32;

int64_t max_splits(int64_t max_seq_len) { return (max_seq_len + kSplit - 1) / kSplit; }

// Scores and partial outputs of one split for all `group` query heads of a kv head, so each
// key and value is read once per group.
template <class T, int D>
__global__ void __launch_bounds__(kDecodeThreads)
    decode_split_kernel(const T* q, int64_t q_stride, const T* k_cache, const T* v_cache, const int32_t* block_table,
                        int64_t max_blocks, int block_size, const int32_t* seq_lens, int kv_heads, int group,
                        float scale, int splits, float* part_o, float* part_m, float* part_l) {
  static_assert(D % 32 == 0, "lanes split the head dimension");
  extern __shared__ float smem[];
  float* qs = smem;               // [group][D], pre-scaled
  float* scores = qs + group * D;  // [group][kSplit]
  const int seq = blockIdx.z, kvh = blockIdx.y, split = blockIdx.x;
  const int len = seq_lens[seq], s0 = split * kSplit;
  if (s0 >= len) return;
  const int n = min(len - s0, kSplit), q_heads = kv_heads * group;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int32_t* table = block_table + seq * max_blocks;
  auto slot_of = [&](int pos) { return static_cast<int64_t>(table[pos / block_size]) * block_size + pos % block_size; };

  for (int idx = tid; idx < group * D; idx += kDecodeThreads)
    qs[idx] = static_cast<float>(q[seq * q_stride + (kvh * group) * D + idx]) * scale;
  __syncthreads();

  for (int jj = warp; jj < n; jj += kDecodeWarps) {
    const T* kp = k_cache + (slot_of(s0 + jj) * kv_heads + kvh) * D;
    float kv[D / 32];
#pragma unroll
    for (int e = 0; e < D / 32; ++e) kv[e] = static_cast<float>(kp[lane + 32 * e]);
    for (int g = 0; g < group; ++g) {
      float dot = 0.f;
#pragma unroll
      for (int e = 0; e < D / 32; ++e) dot += qs[g * D + lane + 32 * e] * kv[e];
      for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
      if (lane == 0) scores[g * kSplit + jj] = dot;
    }
  }
  __syncthreads();

  for (int g = warp; g < group; g += kDecodeWarps) {
    float mx = -INFINITY;
    for (int jj = lane; jj < n; jj += 32) mx = fmaxf(mx, scores[g * kSplit + jj]);
    for (int offset = 16; offset > 0; offset /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, offset));
    float sum = 0.f;
    for (int jj = lane; jj < n; jj += 32) {
      const float p = expf(scores[g * kSplit + jj] - mx);
      scores[g * kSplit + jj] = p;
      sum += p;
    }
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) {
      const int64_t at = (static_cast<int64_t>(seq) * q_heads + kvh * group + g) * splits + split;
      part_m[at] = mx;
      part_l[at] = sum;
    }
  }
  __syncthreads();

  for (int idx = tid; idx < group * D; idx += kDecodeThreads) {
    const int g = idx / D, i = idx % D;
    float acc = 0.f;
    for (int jj = 0; jj < n; ++jj)
      acc += scores[g * kSplit + jj] * static_cast<float>(v_cache[(slot_of(s0 + jj) * kv_heads + kvh) * D + i]);
    part_o[((static_cast<int64_t>(seq) * q_heads + kvh * group + g) * splits + split) * D + i] = acc;
  }
}

// Combines the splits of one (head, sequence) with their maxima and sums.
template <class T, int D>
__global__ void decode_combine_kernel(T* out, int64_t out_stride, const int32_t* seq_lens, int q_heads, int splits,
                                      const float* part_o, const float* part_m, const float* part_l) {
  const int h = blockIdx.x, seq = blockIdx.y;
  const int used = (seq_lens[seq] + kSplit - 1) / kSplit;
  const int64_t base = (static_cast<int64_t>(seq) * q_heads + h) * splits;
  float mx = -INFINITY;
  for (int s = 0; s < used; ++s) mx = fmaxf(mx, part_m[base + s]);
  float total = 0.f;
  for (int s = 0; s < used; ++s) total += part_l[base + s] * expf(part_m[base + s] - mx);
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    float acc = 0.f;
    for (int s = 0; s < used; ++s) acc += part_o[(base + s) * D + i] * expf(part_m[base + s] - mx);
    out[seq * out_stride + h * D + i] = static_cast<T>(used ? acc / total : 0.f);
  }
}

template <class T>
__global__ void kv_write_kernel(T* k_cache, T* v_cache, const T* k, int64_t k_stride, const T* v, int64_t v_stride,
                                const int32_t* slots, int64_t width) {
  const int64_t t = blockIdx.x, slot = slots[t];
  if (slot < 0) return;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
    k_cache[slot * width + i] = k[t * k_stride + i];
    v_cache[slot * width + i] = v[t * v_stride + i];
  }
}

}  // namespace

void attention_prefill(Rows out, ConstRows q, ConstRows k, ConstRows v, const int32_t* cu_seqlens, int64_t num_seqs,
                       int64_t max_seqlen, const AttentionShape& shape, core::DType dtype, cudaStream_t stream) {
  check_shape(shape);
  if (num_seqs == 0 || max_seqlen == 0) return;
  const dim3 grid((max_seqlen + kBr - 1) / kBr, shape.q_heads, num_seqs);
  const int group = static_cast<int>(shape.q_heads / shape.kv_heads);
  core::dispatch_activation(dtype, [&]<class T>() {
    dispatch_head_dim(shape.head_dim, [&]<int D>() {
      constexpr size_t smem = prefill_smem_bytes<D>();
      GPULAB_CHECK(cudaFuncSetAttribute(prefill_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      prefill_kernel<T, D><<<grid, kPrefillThreads, smem, stream>>>(
          static_cast<T*>(out.data), out.stride, static_cast<const T*>(q.data), q.stride,
          static_cast<const T*>(k.data), k.stride, static_cast<const T*>(v.data), v.stride, cu_seqlens, group,
          shape.scale);
      GPULAB_CHECK_LAUNCH();
    });
  });
}

size_t attention_decode_workspace(int64_t num_seqs, int64_t max_seq_len, const AttentionShape& shape) {
  return sizeof(float) * num_seqs * shape.q_heads * max_splits(max_seq_len) * (shape.head_dim + 2);
}

void attention_decode(Rows out, ConstRows q, const PagedKv& kv, const int32_t* seq_lens, int64_t num_seqs,
                      int64_t max_seq_len, const AttentionShape& shape, void* workspace, core::DType dtype,
                      cudaStream_t stream) {
  check_shape(shape);
  if (num_seqs == 0) return;
  const int splits = static_cast<int>(max_splits(max_seq_len));
  const int group = static_cast<int>(shape.q_heads / shape.kv_heads);
  const int64_t partials = num_seqs * shape.q_heads * splits;
  float* part_o = static_cast<float*>(workspace);
  float* part_m = part_o + partials * shape.head_dim;
  float* part_l = part_m + partials;
  core::dispatch_activation(dtype, [&]<class T>() {
    dispatch_head_dim(shape.head_dim, [&]<int D>() {
      const size_t smem = sizeof(float) * group * (D + kSplit);
      if (smem > 48 * 1024)
        GPULAB_CHECK(cudaFuncSetAttribute(decode_split_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      decode_split_kernel<T, D><<<dim3(splits, shape.kv_heads, num_seqs), kDecodeThreads, smem, stream>>>(
          static_cast<const T*>(q.data), q.stride, static_cast<const T*>(kv.k_cache), static_cast<const T*>(kv.v_cache),
          kv.block_table, kv.max_blocks_per_seq, static_cast<int>(kv.block_size), seq_lens,
          static_cast<int>(shape.kv_heads), group, shape.scale, splits, part_o, part_m, part_l);
      GPULAB_CHECK_LAUNCH();
      decode_combine_kernel<T, D><<<dim3(shape.q_heads, num_seqs), D, 0, stream>>>(
          static_cast<T*>(out.data), out.stride, seq_lens, static_cast<int>(shape.q_heads), splits, part_o, part_m,
          part_l);
      GPULAB_CHECK_LAUNCH();
    });
  });
}

void kv_cache_write(void* k_cache, void* v_cache, ConstRows k, ConstRows v, const int32_t* slots, int64_t tokens,
                    int64_t kv_heads, int64_t head_dim, core::DType dtype, cudaStream_t stream) {
  if (tokens == 0) return;
  core::dispatch_activation(dtype, [&]<class T>() {
    kv_write_kernel<T><<<tokens, 256, 0, stream>>>(static_cast<T*>(k_cache), static_cast<T*>(v_cache),
                                                  static_cast<const T*>(k.data), k.stride,
                                                  static_cast<const T*>(v.data), v.stride, slots, kv_heads * head_dim);
    GPULAB_CHECK_LAUNCH();
  });
}

}  // namespace gpulab::kernels
