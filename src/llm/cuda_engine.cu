#include "llm/cuda_engine.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "blas/matmul.h"
#include "comm/symmetric_buffer.h"
#include "core/captured_graph.h"
#include "core/device.h"
#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "core/sanitizer.h"
#include "kernels/argmax.h"
#include "kernels/attention.h"
#include "kernels/bias_add.h"
#include "kernels/embedding.h"
#include "kernels/fp8_quant.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/silu_mul.h"
#include "kernels/skinny_gemm.h"

namespace gpulab::llm {

namespace {

using core::DType;
using bf16 = __nv_bfloat16;

constexpr DType kAct = DType::bf16;          // weights, GEMM inputs, q/k/v, KV cache
constexpr size_t kAlign = 256;               // every weight and buffer starts on this boundary
constexpr size_t kSafetyMargin = 512u << 20;  // left free for the CUDA context, graphs, cuBLASLt
constexpr int kDecodeGemmCandidates = 16;      // cuBLASLt algorithms timed for each decode GEMM

std::string gib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
  return buf;
}

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// A slice of a random tensor: element i is element first + (i / length) · stride + i % length
// of the whole (SliceRuns), so every rank's shard holds the values of the unsharded model.
__global__ void fill_random_kernel(bf16* out, int64_t n, int64_t length, int64_t first, int64_t stride,
                                   RandomFill fill) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16(random_value(fill, first + i / length * stride + i % length));
}

// Bump allocation inside one device buffer: offsets first, one cudaMalloc after.
struct Arena {
  size_t bytes = 0;
  size_t take(size_t n) {
    const size_t at = bytes;
    bytes += align_up(n);
    return at;
  }
};

// A linear layer y = x·Wᵀ, W [n, k] at offset `w` of the weights in `dtype` (bf16 or e4m3); fp8
// weights have n float scales (one per output channel) at offset `scales`.
struct Linear {
  size_t w = 0, scales = 0;
  DType dtype = kAct;
  int64_t n = 0, k = 0;
};

struct Layer {
  size_t attn_norm, qkv_bias, o_bias, mlp_norm;  // offsets into the weights
  Linear qkv, o, gate_up, down;
};

// An open sequence: its KV pages (reserved for its whole length) and how much is cached.
struct Sequence {
  std::vector<int32_t> blocks;
  int64_t reserved = 0;  // tokens
  int64_t kv_len = 0;
};

// One sequence's part of a forward pass: `tokens` appended after what it has cached.
struct Piece {
  Sequence* seq;
  std::span<const int32_t> tokens;
};

// Where a forward pass's results go on the host: logits rows [.., vocab], each row's greedy
// token, or (both null) nowhere.
struct StepOutput {
  float* logits = nullptr;
  int32_t* tokens = nullptr;
};
constexpr size_t kNoRow = SIZE_MAX;  // a pass's piece whose result nobody asked for

}  // namespace

struct CudaEngine::Impl {
  // cfg is this rank's part of the model (its heads, KV heads and MLP rows: shard_config), `model`
  // the whole one that config() reports; equal without tensor parallelism.
  LlamaConfig cfg, model;
  ShardLayout part;
  EngineOptions opt;
  int64_t max_seq_len = 0, max_tokens = 0, max_blocks_per_seq = 0;
  int64_t logit_rows = 0;  // rows of the logits buffer: a batch's last tokens, or logits() passes
  int64_t qd = 0, kvd = 0, qkv_width = 0;
  kernels::AttentionShape shape;

  std::unique_ptr<core::Stream> stream;
  std::unique_ptr<blas::Blas> blas;

  // Weights: one allocation.
  core::DeviceBuffer<std::byte> weights;
  size_t embed = 0, final_norm = 0;
  Linear lm_head;  // bf16 always
  std::vector<Layer> layers;
  core::DeviceBuffer<float2> rope_angles;  // kernels::rope_table of every position up to max_seq_len

  // Activations, sized for max_tokens rows; logits for logit_rows.
  // x, the residual that tensor parallel all-reduces, in NCCL symmetric memory with a comm and
  // residual_wants_symmetric_memory (else a plain device buffer).
  comm::SymmetricBuffer<float> x;
  core::DeviceBuffer<float> x_last, logits;  // logits: [rows, part.vocab_rows] of this rank
  core::DeviceBuffer<float> gathered;        // with a comm: every rank's logits [world, rows, vocab_rows]
  core::DeviceBuffer<bf16> xn, qkv, attn, gate_up, act;
  core::DeviceBuffer<std::byte> decode_ws;
  // fp8 linear layers: the quantized activation, its scales (one per row), the row amaxes of
  // per-tensor scaling, and the bf16 GEMM output of o_proj/down before it joins the residual.
  core::DeviceBuffer<std::byte> act_q;
  core::DeviceBuffer<float> act_scales, row_amax;
  core::DeviceBuffer<bf16> linear_out;
  bool fp8_into_float = false;  // cuBLASLt accumulates fp8 products into the float residual itself
  DecodeSkinny skinny_decode = DecodeSkinny::none;  // decode_skinny_gemm
  std::atomic<int64_t> passes = 0;  // forward passes run (warm-up included)
  core::PinnedBuffer<float> logits_host;
  core::DeviceBuffer<int32_t> greedy;  // a pass's greedy tokens [max_batch], and their host copy
  core::PinnedBuffer<int32_t> greedy_host;

  // Step metadata: one int32 block mirrored in pinned host memory, copied up once per step;
  // the block table comes last so only its used rows travel.
  struct Meta {
    size_t ids, positions, slots, cu_q, seq_lens, last_rows, block_table;
  } meta_at{};
  core::DeviceBuffer<int32_t> meta;
  core::PinnedBuffer<int32_t> meta_host;

  // The paged KV pool: per layer K then V, each [num_blocks, block_size, kv_heads, head_dim].
  core::DeviceBuffer<bf16> kv;
  int64_t num_blocks = 0;
  size_t in_use_at_sizing = 0;  // GPU memory in use (everyone's) when the pool was sized
  std::vector<int32_t> free_blocks;
  std::map<SeqId, Sequence> sequences;
  SeqId next_id = 1;
  std::mutex mutex;  // open/close may come from another thread than step

  core::CapturedGraph decode_graph;  // a pure decode step of max_batch rows
  bool decode_ran_eagerly = false;

  size_t weight_bytes = 0, buffer_bytes = 0;

  bf16* w(size_t offset) const { return reinterpret_cast<bf16*>(weights.get() + offset); }
  bf16* k_cache(int64_t layer) const { return kv.get() + (2 * layer) * layer_kv_elems(); }
  bf16* v_cache(int64_t layer) const { return kv.get() + (2 * layer + 1) * layer_kv_elems(); }
  int64_t layer_kv_elems() const { return num_blocks * opt.block_size * kvd; }
  int32_t* dmeta(size_t at) const { return meta.get() + at; }
  int32_t* hmeta(size_t at) const { return meta_host.get() + at; }
  int64_t blocks_for(int64_t tokens) const { return (tokens + opt.block_size - 1) / opt.block_size; }

  bool fp8() const { return opt.weights == WeightFormat::fp8; }
  DType linear_dtype() const { return fp8() ? DType::f8e4m3 : kAct; }

  // The GEMM scales of fp8 layer L: the activation's per-row scales, L's per-channel ones.
  blas::Fp8Scales fp8_scales(const Linear& L) const {
    return {act_scales.get(), reinterpret_cast<const float*>(weights.get() + L.scales), true};
  }

  // y = x·Wᵀ + beta·y for x [m, L.k] bf16, into y [m, L.n] of y_type (beta 1 only into float: the
  // residual). fp8: x is quantized first (scales per token or per tensor), the GEMM scales each
  // output by its row's and its channel's scale and writes bf16 (or, into a float y, straight
  // there where cuBLASLt takes that: fp8_into_float), else a second kernel adds the bf16 product.
  // `w8a8`: the fp8 GEMM is skinny_gemm's tensor-core kernel (skinny_pass w8a8): w8a8_linear.
  void linear(const Linear& L, const bf16* x, void* y, DType y_type, int64_t m, float beta, bool w8a8 = false) {
    const blas::MatmulShape shape{m, L.n, L.k, false, true};
    if (L.dtype == kAct) {
      blas->matmul(shape, {kAct, kAct, y_type}, x, weights.get() + L.w, y, *stream, 1.f, beta);
      return;
    }
    const bool to_float = y_type == DType::f32;
    if (to_float ? false : (y_type != kAct || beta != 0.f))
      throw core::Error("CudaEngine: an fp8 linear layer writes bf16 or adds into float");
    const auto granularity = opt.fp8_activations == Fp8ActivationScale::tensor ? kernels::Fp8Granularity::tensor
                                                                               : kernels::Fp8Granularity::row;
    kernels::fp8_quantize(act_q.get(), act_scales.get(), x, kAct, m, L.k, granularity, row_amax.get(), *stream);
    if (w8a8) return w8a8_linear(L, y, y_type, m, beta);
    if (to_float && fp8_into_float) {
      blas->matmul(shape, {DType::f8e4m3, DType::f8e4m3, DType::f32}, act_q.get(), weights.get() + L.w, y, *stream,
                   1.f, beta, fp8_scales(L));
      return;
    }
    void* out = to_float ? static_cast<void*>(linear_out.get()) : y;
    blas->matmul(shape, {DType::f8e4m3, DType::f8e4m3, kAct}, act_q.get(), weights.get() + L.w, out, *stream, 1.f,
                 0.f, fp8_scales(L));
    if (!to_float) return;
    if (beta == 0.f) GPULAB_CHECK(cudaMemsetAsync(y, 0, m * L.n * sizeof(float), *stream));
    kernels::accumulate(static_cast<float*>(y), out, kAct, m * L.n, *stream);
  }

  // y = x·Wᵀ (+ y with beta 1, into float) on skinny_gemm's W8A8 kernel, x's e4m3 rows and their
  // scales already in act_q and act_scales.
  void w8a8_linear(const Linear& L, void* y, DType y_type, int64_t m, float beta) {
    const kernels::SkinnyInput in{act_q.get(), kernels::SkinnyPrologue::none, nullptr, 0.f, act_scales.get()};
    kernels::skinny_gemm(y, y_type, beta != 0.f, in, skinny_weights(L), m, L.n, L.k, *stream);
  }

  // Whether a pass of n rows, `prefills` of them prefill chunks, runs `which` layers on
  // skinny_gemm (plain: every layer, at least with plain inputs; w8a8: the fp8 layers on its W8A8
  // kernel).
  bool skinny_pass(int64_t n, int64_t prefills, DecodeSkinny which = DecodeSkinny::all) const {
    const bool layers = which == DecodeSkinny::w8a8 || skinny_decode == DecodeSkinny::w8a8
                            ? skinny_decode == which
                            : skinny_decode >= which;
    return layers && prefills == 0 && n <= kernels::kSkinnyMaxRows;
  }

  kernels::SkinnyWeights skinny_weights(const Linear& L) const {
    const float* scales = L.dtype == DType::f8e4m3 ? reinterpret_cast<const float*>(weights.get() + L.scales) : nullptr;
    return {weights.get() + L.w, L.dtype, scales};
  }

  // y = input·Wᵀ (+ y with beta 1, into float) by skinny_gemm, the input through its prologue and
  // the output through its epilogue. fp8 layers run weight-only there (the GEMV): the bf16 input
  // is not quantized.
  void skinny_linear(const Linear& L, const kernels::SkinnyInput& in, void* y, DType y_type, int64_t m, float beta,
                     kernels::SkinnyEpilogue epilogue = kernels::SkinnyEpilogue::none) {
    kernels::skinny_gemm(y, y_type, beta != 0.f, in, skinny_weights(L), m, L.n, L.k, *stream,
                         kernels::SkinnyKernel::automatic, epilogue);
  }

  static Linear plan_linear(Arena& arena, int64_t n, int64_t k, DType dtype) {
    Linear L{arena.take(n * k * core::dtype_size(dtype)), 0, dtype, n, k};
    if (dtype == DType::f8e4m3) L.scales = arena.take(n * 4);
    return L;
  }

  void plan_weights(Arena& arena) {
    const LlamaConfig& c = cfg;
    const int64_t h = c.hidden_size;
    const DType lin = linear_dtype();
    embed = arena.take(c.vocab_size * h * 2);
    final_norm = arena.take(h * 2);
    // lm_head stays bf16: its error lands straight in the logits (and so in top-1), it is ~1.5 %
    // of a 70B model's weights, and tied models share it with the embedding table. The embedding
    // is whole on every rank; a tied lm_head gets a copy of its vocab rows when sharded.
    lm_head = c.tie_word_embeddings && part.shard.world == 1 ? Linear{embed, 0, kAct, part.vocab_rows, h}
                                                             : plan_linear(arena, part.vocab_rows, h, kAct);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      Layer L{};
      L.attn_norm = arena.take(h * 2);
      L.qkv = plan_linear(arena, qkv_width, h, lin);
      if (c.qkv_bias) L.qkv_bias = arena.take(qkv_width * 2);
      L.o = plan_linear(arena, h, qd, lin);
      if (c.o_bias) L.o_bias = arena.take(h * 4);  // float: added to the float residual
      L.mlp_norm = arena.take(h * 2);
      L.gate_up = plan_linear(arena, 2 * c.intermediate_size, h, lin);
      L.down = plan_linear(arena, h, c.intermediate_size, lin);
      layers.push_back(L);
    }
  }

  // Host to device on the engine's stream, done on return. A plain cudaMemcpy goes on the legacy
  // stream, which the engine's non-blocking stream does not wait for, and from pageable memory it
  // may return before the data lands: fp8_quantize could read the staging buffer before it.
  void copy_up(void* dst, const void* src, size_t bytes) {
    GPULAB_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, *stream));
    stream->synchronize();
  }

  // Uploads this rank's slice of HF tensor `name` (all of it without tensor parallelism) to
  // `dst`, as bf16 (or float for `as_float`).
  void upload(const WeightSource& src, const std::string& name, void* dst, bool as_float = false) {
    upload_slice(src, name, shard_slice(part, name), dst, as_float);
  }
  void upload_slice(const WeightSource& src, const std::string& name, const TensorSlice& slice, void* dst,
                    bool as_float) {
    const SliceRuns runs = src.slice_runs(name, slice);
    const int64_t n = runs.numel();
    if (as_float) {
      const std::vector<float> v = src.load_f32(name, slice);
      copy_up(dst, v.data(), n * 4);
    } else if (src.is_random()) {
      fill_random_kernel<<<std::min<int64_t>((n + 255) / 256, 8192), 256, 0, *stream>>>(
          static_cast<bf16*>(dst), n, runs.length, runs.first, runs.stride, random_fill(name, src.seed()));
      GPULAB_CHECK_LAUNCH();
      core::wait_under_racecheck(*stream);  // a 7B model is 291 such launches (core/sanitizer.h)
    } else {
      const std::vector<uint16_t> v = src.load_bf16(name, slice);
      copy_up(dst, v.data(), n * 2);
    }
  }

  // Uploads this rank's slices of the HF tensors `parts` (stacked by row: fused q/k/v, gate/up)
  // into L. fp8 parts of an fp8 checkpoint go as stored with their scales; others are staged in
  // bf16 on the device (random weights are made there) and quantized per row there, so no host
  // copy of a whole model is made in any format.
  void upload_linear(const WeightSource& src, const Linear& L, const std::vector<std::string>& parts,
                     core::DeviceBuffer<bf16>& staging) {
    int64_t row = 0;
    for (const std::string& name : parts) {
      const TensorSlice slice = shard_slice(part, name);
      const SliceRuns runs = src.slice_runs(name, slice);
      const int64_t rows = runs.shape.at(0);
      std::byte* dst = weights.get() + L.w + row * L.k * core::dtype_size(L.dtype);
      float* scales = reinterpret_cast<float*>(weights.get() + L.scales) + row;
      if (L.dtype == kAct) {
        upload_slice(src, name, slice, dst, false);
      } else if (src.is_fp8(name)) {
        const auto bytes = src.fp8_bytes(name);
        std::vector<uint8_t> mine(runs.numel());
        runs.for_each([&](int64_t from, int64_t to, int64_t n) {
          if (n > 0) std::memcpy(mine.data() + to, bytes.data() + from, n);
        });
        const std::vector<float> all = src.fp8_row_scales(name);  // a row slice takes its rows' scales
        const int64_t first_row = slice.dim == 0 ? slice.begin : 0;
        copy_up(dst, mine.data(), mine.size());
        copy_up(scales, all.data() + first_row, rows * 4);
      } else {
        if (staging.size() < static_cast<size_t>(rows * L.k)) staging = core::DeviceBuffer<bf16>(rows * L.k);
        upload_slice(src, name, slice, staging.get(), false);
        kernels::fp8_quantize(dst, scales, staging.get(), kAct, rows, L.k, kernels::Fp8Granularity::row, nullptr,
                              *stream);
        stream->synchronize();  // before the next part overwrites the staging buffer
      }
      row += rows;
    }
  }

  void upload_weights(const WeightSource& src) {
    const LlamaConfig& c = cfg;
    const int64_t h = c.hidden_size;
    core::DeviceBuffer<bf16> staging;  // fp8 quantization at load; freed before the KV cache is sized
    upload(src, "model.embed_tokens.weight", weights.get() + embed);
    upload(src, "model.norm.weight", weights.get() + final_norm);
    if (!c.tie_word_embeddings) upload_linear(src, lm_head, {"lm_head.weight"}, staging);
    if (c.tie_word_embeddings && lm_head.w != embed)
      upload_slice(src, "model.embed_tokens.weight", shard_slice(part, "lm_head.weight"), weights.get() + lm_head.w,
                   false);
    if (part.vocab_count < part.vocab_rows)  // the last rank's padding rows: zero logits, never read
      GPULAB_CHECK(cudaMemsetAsync(weights.get() + lm_head.w + part.vocab_count * h * 2, 0,
                                   (part.vocab_rows - part.vocab_count) * h * 2, *stream));
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const Layer& L = layers[l];
      auto name = [&](const std::string& suffix) { return layer_weight(l, suffix); };
      auto up = [&](const std::string& suffix, size_t offset, bool as_float = false) {
        upload(src, name(suffix), weights.get() + offset, as_float);
      };
      up("input_layernorm.weight", L.attn_norm);
      upload_linear(src, L.qkv, {name("self_attn.q_proj.weight"), name("self_attn.k_proj.weight"),
                                 name("self_attn.v_proj.weight")}, staging);
      if (c.qkv_bias) {
        up("self_attn.q_proj.bias", L.qkv_bias);
        up("self_attn.k_proj.bias", L.qkv_bias + qd * 2);
        up("self_attn.v_proj.bias", L.qkv_bias + (qd + kvd) * 2);
      }
      upload_linear(src, L.o, {name("self_attn.o_proj.weight")}, staging);
      if (c.o_bias) up("self_attn.o_proj.bias", L.o_bias, true);
      up("post_attention_layernorm.weight", L.mlp_norm);
      upload_linear(src, L.gate_up, {name("mlp.gate_proj.weight"), name("mlp.up_proj.weight")}, staging);
      upload_linear(src, L.down, {name("mlp.down_proj.weight")}, staging);
    }
    stream->synchronize();
  }

  Meta plan_meta(Arena& m) const {
    const int64_t B = opt.max_batch;
    Meta at{};
    at.ids = m.take(max_tokens * 4) / 4;
    at.positions = m.take(max_tokens * 4) / 4;
    at.slots = m.take(max_tokens * 4) / 4;
    at.cu_q = m.take((B + 1) * 4) / 4;
    at.seq_lens = m.take(B * 4) / 4;
    at.last_rows = m.take(max_tokens * 4) / 4;
    at.block_table = m.take(B * max_blocks_per_seq * 4) / 4;
    return at;
  }

  size_t buffer_bytes_needed() const {
    const LlamaConfig& c = cfg;
    const int64_t h = c.hidden_size, B = opt.max_batch;
    Arena meta_arena;
    plan_meta(meta_arena);
    size_t n = 0;
    n += align_up(max_tokens * h * 4) + align_up(logit_rows * h * 4) + align_up(logit_rows * part.vocab_rows * 4);
    if (opt.comm) n += align_up(part.shard.world * logit_rows * part.vocab_rows * 4);
    n += align_up(max_tokens * h * 2) + align_up(max_tokens * qkv_width * 2) + align_up(max_tokens * qd * 2);
    n += align_up(max_tokens * 2 * c.intermediate_size * 2) + align_up(max_tokens * c.intermediate_size * 2);
    n += align_up(kernels::attention_decode_workspace(B, max_seq_len, shape)) + align_up(B * 4);
    if (fp8())
      n += align_up(max_tokens * fp8_act_width()) + 2 * align_up(max_tokens * 4) + align_up(max_tokens * h * 2);
    return n + meta_arena.bytes;
  }

  // The widest input of an fp8 linear layer.
  int64_t fp8_act_width() const { return std::max({cfg.hidden_size, qd, cfg.intermediate_size}); }

  // The bf16 staging buffer of fp8 quantization at load: the largest single HF tensor.
  size_t staging_bytes() const {
    return fp8() ? std::max(qd, cfg.intermediate_size) * cfg.hidden_size * 2 : 0;
  }

  void allocate_buffers() {
    const LlamaConfig& c = cfg;
    const int64_t h = c.hidden_size, B = opt.max_batch;
    x = comm::SymmetricBuffer<float>(residual_wants_symmetric_memory(opt) ? opt.comm : nullptr, max_tokens * h);
    x_last = core::DeviceBuffer<float>(logit_rows * h);
    logits = core::DeviceBuffer<float>(logit_rows * part.vocab_rows);
    if (opt.comm) gathered = core::DeviceBuffer<float>(part.shard.world * logit_rows * part.vocab_rows);
    logits_host = core::PinnedBuffer<float>(B * c.vocab_size);
    greedy = core::DeviceBuffer<int32_t>(B);
    greedy_host = core::PinnedBuffer<int32_t>(B);
    xn = core::DeviceBuffer<bf16>(max_tokens * h);
    qkv = core::DeviceBuffer<bf16>(max_tokens * qkv_width);
    attn = core::DeviceBuffer<bf16>(max_tokens * qd);
    gate_up = core::DeviceBuffer<bf16>(max_tokens * 2 * c.intermediate_size);
    act = core::DeviceBuffer<bf16>(max_tokens * c.intermediate_size);
    decode_ws = core::DeviceBuffer<std::byte>(kernels::attention_decode_workspace(B, max_seq_len, shape));
    if (fp8()) {
      act_q = core::DeviceBuffer<std::byte>(max_tokens * fp8_act_width());
      act_scales = core::DeviceBuffer<float>(max_tokens);
      row_amax = core::DeviceBuffer<float>(max_tokens);
      linear_out = core::DeviceBuffer<bf16>(max_tokens * h);
    }
    Arena m;
    meta_at = plan_meta(m);
    meta = core::DeviceBuffer<int32_t>(m.bytes / 4);
    meta_host = core::PinnedBuffer<int32_t>(m.bytes / 4);
  }

  // Whether cuBLASLt accumulates fp8 products with outer-vector scales into float C (saving the
  // add kernel after o_proj and down): tried once, on their shapes at 1, max_batch and max_tokens
  // rows, before any step (the result lands in x, which every pass overwrites).
  bool probe_fp8_into_float() {
    GPULAB_CHECK(cudaMemsetAsync(act_q.get(), 0, act_q.bytes(), *stream));
    GPULAB_CHECK(cudaMemsetAsync(act_scales.get(), 0, act_scales.bytes(), *stream));
    try {
      for (const Linear* L : {&layers.at(0).o, &layers.at(0).down})
        for (int64_t m : {int64_t{1}, opt.max_batch, max_tokens})
          blas->matmul({m, L->n, L->k, false, true}, {DType::f8e4m3, DType::f8e4m3, DType::f32}, act_q.get(),
                       weights.get() + L->w, x.get(), *stream, 1.f, 1.f, fp8_scales(*L));
      stream->synchronize();
      return true;
    } catch (const core::Error& e) {
      core::log_info("fp8 o_proj/down write bf16 and a kernel adds them to the residual: ", e.what());
      return false;
    }
  }

  void size_kv_pool() {
    size_t free_bytes = 0, total = 0;
    GPULAB_CHECK(cudaMemGetInfo(&free_bytes, &total));
    in_use_at_sizing = total - free_bytes;
    const double budget = opt.gpu_memory_fraction * static_cast<double>(total) -
                          static_cast<double>(in_use_at_sizing) - static_cast<double>(kSafetyMargin);
    const size_t block_bytes = 2 * cfg.num_layers * opt.block_size * kvd * 2;
    num_blocks = budget > 0 ? static_cast<int64_t>(budget / static_cast<double>(block_bytes)) : 0;
    if (opt.max_kv_tokens > 0) num_blocks = std::min(num_blocks, blocks_for(opt.max_kv_tokens));
    num_blocks = std::min(num_blocks, opt.max_batch * max_blocks_per_seq);  // more could never be used
    num_blocks = min_over_ranks(num_blocks);  // every rank holds the same pages
    if (num_blocks < 1)
      throw core::InputError("no GPU memory left for the KV cache at --gpu-memory-fraction " +
                             std::to_string(opt.gpu_memory_fraction) + ": weights take " + gib(weight_bytes) +
                             ", buffers " + gib(buffer_bytes) + ", " + gib(free_bytes) + " free of " + gib(total) +
                             " (raise the fraction, or lower --max-batch / --max-seq-len)");
    kv = core::DeviceBuffer<bf16>(2 * cfg.num_layers * num_blocks * opt.block_size * kvd);
    for (int64_t b = num_blocks - 1; b >= 0; --b) free_blocks.push_back(static_cast<int32_t>(b));
    if (part.shard.rank == 0)  // ranks size alike: one line for all
      core::log_info("KV cache: ", num_blocks, " pages of ", opt.block_size, " tokens (", num_blocks * opt.block_size,
                     " tokens, ", gib(kv.bytes()), "); weights ", gib(weight_bytes), ", buffers ", gib(buffer_bytes),
                     part.shard.world > 1 ? " per GPU" : "");
  }

  // The least of `value` over the tensor-parallel ranks (each calls this at the same point), so
  // they size alike and refuse alike instead of leaving the others waiting in a collective.
  int64_t min_over_ranks(int64_t value) {
    if (!opt.comm) return value;
    core::DeviceBuffer<int64_t> v(1);
    GPULAB_CHECK(cudaMemcpyAsync(v.get(), &value, 8, cudaMemcpyHostToDevice, *stream));
    GPULAB_CHECK(ncclAllReduce(v.get(), v.get(), 1, ncclInt64, ncclMin, opt.comm, *stream));
    GPULAB_CHECK(cudaMemcpyAsync(&value, v.get(), 8, cudaMemcpyDeviceToHost, *stream));
    stream->synchronize();
    return value;
  }

  // Row-parallel o/down GEMMs: every rank's partial sum of the residual update goes into x, rank 0
  // adding it to the residual (beta 1) and the others overwriting (beta 0); the all-reduce then
  // leaves x = residual + the whole update on every rank. Captured into the decode graph too.
  float residual_beta() const { return part.shard.rank == 0 ? 1.f : 0.f; }
  void all_reduce_residual(int64_t n) {
    if (opt.comm) GPULAB_CHECK(ncclAllReduce(x.get(), x.get(), n * cfg.hidden_size, ncclFloat, ncclSum, opt.comm, *stream));
  }

  int32_t slot_of(const Sequence& s, int64_t pos) const {
    return s.blocks[pos / opt.block_size] * static_cast<int32_t>(opt.block_size) +
           static_cast<int32_t>(pos % opt.block_size);
  }

  // The transformer layers over `n` packed rows whose metadata is on the device: first
  // `decodes` single-token rows (one per sequence, split-K attention over their pages), then
  // the rows of `prefills` chunks (tiled attention over their pages, none longer than
  // max_chunk).
  void layers_forward(int64_t n, int64_t decodes, int64_t prefills, int64_t max_chunk) {
    const LlamaConfig& c = cfg;
    const int64_t h = c.hidden_size, inter = c.intermediate_size;
    const float eps = static_cast<float>(c.rms_norm_eps);
    const bool skinny = skinny_pass(n, prefills);  // the norms and the SwiGLU gate go into the GEMMs
    const bool w8a8 = skinny_pass(n, prefills, DecodeSkinny::w8a8);
    // W8A8 with a scale per token: the norms, decode attention and the SwiGLU gate write their e4m3
    // rows themselves (rmsnorm_fp8, attention_decode_fp8, silu_mul_fp8: bit for bit the separate
    // quantization, one kernel fewer each).
    const bool fused_fp8 = w8a8 && opt.fp8_activations == Fp8ActivationScale::token;
    // y = in·Wᵀ for an input already normed or gated: on skinny_gemm where the pass takes its
    // plain inputs (DecodeSkinny::plain), else linear().
    const bool plain = skinny_pass(n, prefills, DecodeSkinny::plain);
    const auto dense = [&](const Linear& L, const bf16* in, void* y, DType y_type, float beta) {
      if (plain) skinny_linear(L, {in}, y, y_type, n, beta);
      else linear(L, in, y, y_type, n, beta, w8a8);
    };
    const auto normed = [&](size_t norm) {
      return kernels::SkinnyInput{x.get(), kernels::SkinnyPrologue::rmsnorm, w(norm), eps};
    };
    kernels::embedding(x.get(), DType::f32, w(embed), kAct, dmeta(meta_at.ids), n, h, *stream);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      core::wait_under_racecheck(*stream);  // a layer's launches at a time (core/sanitizer.h)
      const Layer& L = layers[l];
      if (skinny) {
        skinny_linear(L.qkv, normed(L.attn_norm), qkv.get(), kAct, n, 0.f);
      } else if (fused_fp8) {
        kernels::rmsnorm_fp8(act_q.get(), act_scales.get(), kAct, x.get(), DType::f32, w(L.attn_norm), n, h, eps,
                             *stream);
        w8a8_linear(L.qkv, qkv.get(), kAct, n, 0.f);
      } else {
        kernels::rmsnorm(xn.get(), kAct, x.get(), DType::f32, w(L.attn_norm), n, h, eps, *stream);
        dense(L.qkv, xn.get(), qkv.get(), kAct, 0.f);
      }
      if (c.qkv_bias) kernels::bias_add(qkv.get(), w(L.qkv_bias), n, qkv_width, kAct, *stream);
      bf16* q = qkv.get();
      bf16* k = q + qd;
      bf16* v = k + kvd;
      // The decode rows' rope and cache store happen in the decode attention (PagedKv::append),
      // which also finds their earlier positions cached by earlier passes and the metadata copied
      // before this pass's first kernel (PagedKv::settled); rope() takes the chunk rows after them.
      const int64_t at = decodes * qkv_width;
      const kernels::RopeCacheWrite cache{k_cache(l), v_cache(l), v + at, qkv_width, dmeta(meta_at.slots) + decodes};
      kernels::rope({q + at, qkv_width, c.num_heads}, {k + at, qkv_width, c.num_kv_heads},
                    dmeta(meta_at.positions) + decodes, rope_angles.get(), n - decodes, c.head_dim, kAct, *stream,
                    &cache);
      const kernels::DecodeAppend append{{k, qkv_width}, {v, qkv_width}, dmeta(meta_at.positions),
                                         dmeta(meta_at.slots), rope_angles.get()};
      kernels::PagedKv paged{k_cache(l), v_cache(l), dmeta(meta_at.block_table), max_blocks_per_seq, opt.block_size};
      paged.settled = true;
      paged.append = &append;
      if (decodes > 0 && fused_fp8)  // o_proj's e4m3 input straight from the combine (all rows decode here)
        kernels::attention_decode_fp8(act_q.get(), act_scales.get(), {q, qkv_width}, paged, dmeta(meta_at.seq_lens),
                                      decodes, max_seq_len, shape, decode_ws.get(), kAct, *stream);
      else if (decodes > 0)
        kernels::attention_decode({attn.get(), qd}, {q, qkv_width}, paged, dmeta(meta_at.seq_lens), decodes,
                                  max_seq_len, shape, decode_ws.get(), kAct, *stream);
      if (prefills > 0) {
        kernels::PagedKv rest{k_cache(l), v_cache(l), dmeta(meta_at.block_table) + decodes * max_blocks_per_seq,
                              max_blocks_per_seq, opt.block_size};
        kernels::attention_prefill({attn.get() + decodes * qd, qd}, {q + decodes * qkv_width, qkv_width}, rest,
                                   dmeta(meta_at.cu_q), dmeta(meta_at.seq_lens) + decodes, prefills, max_chunk, shape,
                                   kAct, *stream);
      }
      if (fused_fp8) w8a8_linear(L.o, x.get(), DType::f32, n, residual_beta());  // x += attn · Woᵀ
      else dense(L.o, attn.get(), x.get(), DType::f32, residual_beta());
      if (c.o_bias && part.shard.rank == 0) kernels::bias_add(x.get(), weights.get() + L.o_bias, n, h, DType::f32, *stream);
      all_reduce_residual(n);
      if (skinny) {  // x += mlp
        skinny_linear(L.gate_up, normed(L.mlp_norm), gate_up.get(), kAct, n, 0.f);
        skinny_linear(L.down, {gate_up.get(), kernels::SkinnyPrologue::swiglu}, x.get(), DType::f32, n,
                      residual_beta());
      } else if (fused_fp8) {
        kernels::rmsnorm_fp8(act_q.get(), act_scales.get(), kAct, x.get(), DType::f32, w(L.mlp_norm), n, h, eps,
                             *stream);
        w8a8_linear(L.gate_up, gate_up.get(), kAct, n, 0.f);
        kernels::silu_mul_fp8(act_q.get(), act_scales.get(), gate_up.get(), n, inter, kAct, *stream);
        w8a8_linear(L.down, x.get(), DType::f32, n, residual_beta());  // x += mlp
      } else {
        kernels::rmsnorm(xn.get(), kAct, x.get(), DType::f32, w(L.mlp_norm), n, h, eps, *stream);
        // The SwiGLU gate in gate_up's epilogue (the same bits, one kernel fewer) where the pass
        // takes the tiles kernel; passes the GEMV takes (1-2 rows) keep it and silu_mul.
        if (plain && !kernels::skinny_gemv_fits(n, h)) {
          skinny_linear(L.gate_up, {xn.get()}, act.get(), kAct, n, 0.f, kernels::SkinnyEpilogue::swiglu);
        } else {
          dense(L.gate_up, xn.get(), gate_up.get(), kAct, 0.f);
          kernels::silu_mul(act.get(), gate_up.get(), n, inter, kAct, *stream);
        }
        dense(L.down, act.get(), x.get(), DType::f32, residual_beta());  // x += mlp
      }
      all_reduce_residual(n);
    }
  }

  // Final norm and lm_head of the rows listed in meta last_rows, into `logits` [rows, vocab
  // rows of this rank], then with a comm gathered from every rank. `skinny`: the pass's skinny_pass.
  void logits_of_rows(int64_t rows, bool skinny) {
    const int64_t h = cfg.hidden_size;
    const float eps = static_cast<float>(cfg.rms_norm_eps);
    kernels::embedding(x_last.get(), DType::f32, x.get(), DType::f32, dmeta(meta_at.last_rows), rows, h, *stream);
    if (skinny) {
      skinny_linear(lm_head, {x_last.get(), kernels::SkinnyPrologue::rmsnorm, w(final_norm), eps}, logits.get(),
                    DType::f32, rows, 0.f);
    } else {
      kernels::rmsnorm(xn.get(), kAct, x_last.get(), DType::f32, w(final_norm), rows, h, eps, *stream);
      linear(lm_head, xn.get(), logits.get(), DType::f32, rows, 0.f);
    }
    if (opt.comm)
      GPULAB_CHECK(ncclAllGather(logits.get(), gathered.get(), rows * part.vocab_rows, ncclFloat, opt.comm, *stream));
  }

  // `copy_rows` rows of logits [.., vocab] to `host` from a pass that computed `rows`: one
  // strided copy per rank's block of vocab rows, leaving out the padding.
  void copy_logits(float* host, int64_t copy_rows, int64_t rows) {
    const float* from = opt.comm ? gathered.get() : logits.get();
    const int64_t V = cfg.vocab_size, P = part.vocab_rows;
    for (int64_t r = 0; r < part.shard.world; ++r) {
      const int64_t cols = std::min(P, V - r * P);
      GPULAB_CHECK(cudaMemcpy2DAsync(host + r * P, V * 4, from + r * rows * P, P * 4, cols * 4, copy_rows,
                                     cudaMemcpyDeviceToHost, *stream));
    }
  }

  void upload_meta(int64_t table_rows) {
    const size_t count = meta_at.block_table + table_rows * max_blocks_per_seq;
    GPULAB_CHECK(cudaMemcpyAsync(meta.get(), meta_host.get(), count * 4, cudaMemcpyHostToDevice, *stream));
  }

  // One forward pass over `pieces` (at most max_batch, at most max_tokens rows in all). Writes
  // the logits of piece i's last token to out.logits[r · vocab] and its greedy token to
  // out.tokens[r] (picked on the GPU; not with all_rows or tensor parallelism), r = out_rows[i]
  // (kNoRow: no result) or i where out_rows is empty; with all_rows, the logits of every token
  // to out.logits (a single piece of at most logit_rows). Advances each sequence's cached length.
  void forward(const std::vector<Piece>& pieces, StepOutput out, bool all_rows,
               std::span<const size_t> out_rows = {}) {
    const int64_t b = static_cast<int64_t>(pieces.size()), V = cfg.vocab_size;
    // A pass of pieces that are none of them a chunk's last copies back no logits and picks no tokens.
    if (!out_rows.empty() && std::ranges::all_of(out_rows, [](size_t r) { return r == kNoRow; })) out = {};
    // Rows: single-token pieces first (decode attention), then the chunks (prefill attention).
    std::vector<int64_t> order;
    for (int64_t i = 0; i < b; ++i)
      if (pieces[i].tokens.size() == 1) order.push_back(i);
    const int64_t decodes = static_cast<int64_t>(order.size());
    for (int64_t i = 0; i < b; ++i)
      if (pieces[i].tokens.size() != 1) order.push_back(i);
    const bool pure_decode = decodes == b && !all_rows;
    // Pure decode steps always run max_batch rows: one CUDA graph covers every batch, and each
    // sequence's tokens do not depend on what it is batched with (the GEMMs see one shape).
    // Decode is bound by reading the weights, so the padding rows cost little; they write no
    // KV (slot -1) and read page 0.
    const int64_t padded = pure_decode ? opt.max_batch : b;
    std::fill_n(hmeta(meta_at.block_table), padded * max_blocks_per_seq, 0);
    int64_t n = 0, max_chunk = 0;
    hmeta(meta_at.cu_q)[0] = 0;
    for (int64_t j = 0; j < padded; ++j) {
      if (j >= b) {  // padding
        hmeta(meta_at.ids)[n] = 0;
        hmeta(meta_at.positions)[n] = 0;
        hmeta(meta_at.slots)[n] = -1;
        hmeta(meta_at.seq_lens)[j] = 1;
        hmeta(meta_at.last_rows)[j] = static_cast<int32_t>(n);
        ++n;
        continue;
      }
      const Piece& p = pieces[order[j]];
      const Sequence& s = *p.seq;
      const int64_t len = static_cast<int64_t>(p.tokens.size());
      for (int64_t t = 0; t < len; ++t, ++n) {
        hmeta(meta_at.ids)[n] = p.tokens[t];
        hmeta(meta_at.positions)[n] = static_cast<int32_t>(s.kv_len + t);
        hmeta(meta_at.slots)[n] = slot_of(s, s.kv_len + t);
        if (all_rows) hmeta(meta_at.last_rows)[n] = static_cast<int32_t>(n);
      }
      hmeta(meta_at.seq_lens)[j] = static_cast<int32_t>(s.kv_len + len);
      if (j >= decodes) {
        hmeta(meta_at.cu_q)[j - decodes + 1] = static_cast<int32_t>(n - decodes);  // chunk rows follow the decodes
        max_chunk = std::max(max_chunk, len);
      }
      if (!all_rows) hmeta(meta_at.last_rows)[order[j]] = static_cast<int32_t>(n - 1);
      std::copy(s.blocks.begin(), s.blocks.end(), hmeta(meta_at.block_table) + j * max_blocks_per_seq);
    }
    upload_meta(padded);
    const int64_t rows = all_rows ? n : padded;
    if (pure_decode && decode_graph.captured()) {
      decode_graph.launch(*stream);
    } else {
      layers_forward(n, decodes == b ? padded : decodes, b - decodes, max_chunk);
      logits_of_rows(rows, skinny_pass(n, b - decodes));
      // After one eager run (cuBLASLt plans made), capture the decode step.
      if (pure_decode && opt.cuda_graphs && !std::exchange(decode_ran_eagerly, true)) capture_decode(padded);
    }
    if (out.logits) copy_logits(all_rows ? out.logits : logits_host.get(), all_rows ? n : b, rows);
    if (out.tokens) {
      if (all_rows || opt.comm) throw core::Error("CudaEngine: greedy tokens of a single-GPU last-token pass only");
      kernels::argmax(greedy.get(), logits.get(), b, V, DType::f32, *stream);
      GPULAB_CHECK(cudaMemcpyAsync(greedy_host.get(), greedy.get(), b * 4, cudaMemcpyDeviceToHost, *stream));
    }
    stream->synchronize();
    for (int64_t i = 0; i < b && !all_rows; ++i) {
      const size_t r = out_rows.empty() ? static_cast<size_t>(i) : out_rows[i];
      if (r == kNoRow) continue;
      if (out.logits) std::copy_n(logits_host.get() + i * V, V, out.logits + r * V);
      if (out.tokens) out.tokens[r] = greedy_host.get()[i];
    }
    for (const Piece& p : pieces) p.seq->kv_len += static_cast<int64_t>(p.tokens.size());
    ++passes;
  }

  void capture_decode(int64_t padded) {
    stream->synchronize();
    decode_graph.capture(*stream, [&] {
      layers_forward(padded, padded, 0, 0);
      logits_of_rows(padded, skinny_pass(padded, 0));
    });
  }

  // Makes the first request as fast as the rest: loads the lazily loaded kernels, makes the
  // cuBLASLt plans and captures the decode graph, on a scratch sequence whose pages go back.
  void warm_up() {
    Sequence s;
    s.reserved = 3;
    const int64_t need = blocks_for(s.reserved);
    if (need > static_cast<int64_t>(free_blocks.size())) return;
    s.blocks.assign(free_blocks.end() - need, free_blocks.end());
    const std::vector<int32_t> ids = {0, 0};
    std::vector<float> out(cfg.vocab_size);
    forward({{&s, std::span(ids)}}, {out.data()}, false);           // a prefill chunk
    // The decode step's GEMMs (every step has their shapes) are worth timing cuBLASLt's
    // candidates for once; prefill shapes change with each prompt, so they keep the heuristic's.
    if (opt.autotune_decode_gemms) blas->set_autotune(kDecodeGemmCandidates);
    forward({{&s, std::span(ids).first(1)}}, {out.data()}, false);  // a decode step (captured)
    blas->set_autotune(0);
  }

  Sequence& sequence(SeqId id) {
    std::lock_guard lock(mutex);
    auto it = sequences.find(id);
    if (it == sequences.end()) throw core::Error("CudaEngine: unknown sequence " + std::to_string(id));
    return it->second;
  }

  // CudaEngine::step and step_greedy: the decodes in one pass, then the longer chunks (packed
  // together with pack_chunks).
  void step(std::span<const SeqId> seqs, std::span<const std::span<const int32_t>> chunks, StepOutput out);
};

CudaEngine::CudaEngine(const WeightSource& src, const EngineOptions& options) : impl_(std::make_unique<Impl>()) {
  if (const std::string why = core::why_no_device(); !why.empty())
    throw core::NoDeviceError("the CUDA engine needs a CUDA device: " + why);
  Impl& m = *impl_;
  m.model = src.config();
  m.opt = options;
  if (options.comm) {
    int count = 0, rank = 0;
    GPULAB_CHECK(ncclCommCount(options.comm, &count));
    GPULAB_CHECK(ncclCommUserRank(options.comm, &rank));
    if (count != options.shard.world || rank != options.shard.rank)
      throw core::Error("CudaEngine: shard " + std::to_string(options.shard.rank) + " of " +
                        std::to_string(options.shard.world) + " given the communicator's rank " + std::to_string(rank) +
                        " of " + std::to_string(count));
  } else if (options.shard.world != 1) {
    throw core::Error("CudaEngine: tensor parallel over " + std::to_string(options.shard.world) +
                      " ranks needs an NCCL communicator");
  }
  m.part = shard_layout(m.model, options.shard);
  m.cfg = shard_config(m.model, m.part);
  const LlamaConfig& c = m.cfg;
  if (options.gpu_memory_fraction <= 0 || options.gpu_memory_fraction > 1)
    throw core::InputError("--gpu-memory-fraction must be in (0, 1]");
  if (options.max_batch < 1 || options.block_size < 1 || options.max_step_tokens < 1)
    throw core::InputError("max batch, max step tokens and block size must be positive");
  m.max_seq_len = options.max_seq_len > 0 ? options.max_seq_len : std::min<int64_t>(c.max_position_embeddings, 32768);
  if (m.max_seq_len > c.max_position_embeddings)
    throw core::InputError("--max-seq-len " + std::to_string(m.max_seq_len) + " exceeds the model's " +
                           std::to_string(c.max_position_embeddings) + " positions");
  m.max_tokens = std::max(options.max_step_tokens, options.max_batch);
  m.logit_rows = std::min(m.max_tokens, std::max<int64_t>(options.max_batch, 256));
  m.max_blocks_per_seq = m.blocks_for(m.max_seq_len);
  m.qd = c.q_dim();
  m.kvd = c.kv_dim();
  m.qkv_width = m.qd + 2 * m.kvd;
  m.shape = {c.num_heads, c.num_kv_heads, c.head_dim, 1.0f / std::sqrt(static_cast<float>(c.head_dim))};
  if (m.fp8()) {
    int device = 0, major = 0, minor = 0;
    GPULAB_CHECK(cudaGetDevice(&device));
    GPULAB_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    GPULAB_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    if (major * 10 + minor < 89)
      throw core::InputError("--weights fp8 needs fp8 tensor cores (compute capability 8.9 or newer); this GPU has " +
                             std::to_string(major) + "." + std::to_string(minor));
    // cuBLASLt fp8: rows of 16-byte multiples in, bf16 rows of 16-byte multiples out.
    if (c.hidden_size % 16 || m.qd % 16 || m.kvd % 16 || c.intermediate_size % 16)
      throw core::InputError("--weights fp8 needs hidden, attention and intermediate sizes that are multiples of 16");
  }

  m.stream = std::make_unique<core::Stream>();
  Arena arena;
  m.plan_weights(arena);
  m.weight_bytes = arena.bytes;
  m.buffer_bytes = m.buffer_bytes_needed();
  size_t free_bytes = 0, total = 0;
  GPULAB_CHECK(cudaMemGetInfo(&free_bytes, &total));
  const double allowed = options.gpu_memory_fraction * static_cast<double>(total) -
                         static_cast<double>(total - free_bytes) - static_cast<double>(kSafetyMargin);
  if (m.min_over_ranks(static_cast<double>(m.weight_bytes + m.buffer_bytes + m.staging_bytes()) <= allowed) == 0)
    throw core::InputError("the model does not fit: weights need " + gib(m.weight_bytes) + " and buffers " +
                           gib(m.buffer_bytes) + ", but --gpu-memory-fraction " +
                           std::to_string(options.gpu_memory_fraction) + " leaves " +
                           gib(allowed > 0 ? static_cast<size_t>(allowed) : 0) + " (" + gib(free_bytes) + " free of " +
                           gib(total) + ")");

  m.blas = std::make_unique<blas::Blas>();
  m.weights = core::DeviceBuffer<std::byte>(m.weight_bytes);
  m.upload_weights(src);
  if (m.fp8())
    core::log_info("fp8 linear layers (e4m3, per-channel weight scales, per-",
                   options.fp8_activations == Fp8ActivationScale::token ? "token" : "tensor", " activation scales)");
  else if (c.num_layers > 0 && src.is_fp8(layer_weight(0, "self_attn.q_proj.weight")))
    core::log_info("the checkpoint holds fp8 weights, dequantized to bf16 here; --weights fp8 keeps them in fp8");
  const std::vector<float> inv = rope_inv_freq(c.rope, c.head_dim, c.dtype);
  core::DeviceBuffer<float> inv_freq(inv.size());
  m.copy_up(inv_freq.get(), inv.data(), inv.size() * 4);
  m.rope_angles = core::DeviceBuffer<float2>(m.max_seq_len * (c.head_dim / 2));
  kernels::rope_table(m.rope_angles.get(), inv_freq.get(), m.max_seq_len, c.head_dim, *m.stream);
  m.stream->synchronize();  // before inv_freq goes
  m.skinny_decode = decode_skinny_gemm(options, m.model);
  m.allocate_buffers();
  if (options.comm && m.part.shard.rank == 0)
    core::log_info("tensor parallel: the residual's all-reduces run over ",
                   m.x.symmetric() ? "NCCL symmetric memory" : "a plain buffer");
  if (m.fp8()) m.fp8_into_float = m.probe_fp8_into_float();
  m.size_kv_pool();
  m.warm_up();
}

CudaEngine::~CudaEngine() = default;

void CudaEngine::communicator_aborted() { impl_->x.forget_communicator(); }

bool residual_wants_symmetric_memory(const EngineOptions& options) {
  static const std::optional<bool> env = core::env_switch("GPULAB_NCCL_SYMMETRIC");
  return env.value_or(options.nccl_symmetric);
}

DecodeSkinny decode_skinny_gemm(const EngineOptions& options, const LlamaConfig& model) {
  static const std::optional<bool> env = core::env_switch("GPULAB_SKINNY_GEMM");
  const DType w = options.weights == WeightFormat::fp8 ? DType::f8e4m3 : DType::bf16;
  const auto takes = [&](bool (*fits)(int64_t, int64_t, DType)) {
    return fits(options.max_batch, model.hidden_size, w) && fits(options.max_batch, model.q_dim(), w) &&
           fits(options.max_batch, model.intermediate_size, w);
  };
  if (options.shard.world != 1 || !takes(kernels::skinny_gemm_fits)) return DecodeSkinny::none;
  const std::optional<bool> all = env ? env : options.skinny_gemm;
  if (all == false) return DecodeSkinny::none;
  if (w == DType::f8e4m3) return takes(kernels::skinny_gemv_fits) ? DecodeSkinny::all : DecodeSkinny::w8a8;
  if (all == true) return DecodeSkinny::all;
  return takes(kernels::skinny_gemv_fits) ? DecodeSkinny::all : DecodeSkinny::plain;
}

const char* to_string(DecodeSkinny which) {
  switch (which) {
    case DecodeSkinny::none: return "cublaslt";
    case DecodeSkinny::plain: return "skinny_plain";
    case DecodeSkinny::all: return "skinny";
    case DecodeSkinny::w8a8: return "cublaslt+skinny_w8a8";
  }
  return "?";
}

const LlamaConfig& CudaEngine::config() const { return impl_->model; }
int64_t CudaEngine::max_batch() const { return impl_->opt.max_batch; }
// The most one sequence can hold: the pool, or the max sequence length when that is less (so
// the scheduler refuses longer requests up front).
int64_t CudaEngine::kv_capacity_tokens() const { return impl_->num_blocks * impl_->opt.block_size; }

int64_t CudaEngine::max_sequence_tokens() const {
  return std::min(impl_->num_blocks * impl_->opt.block_size, impl_->max_seq_len);
}

int64_t CudaEngine::kv_free_tokens() const {
  std::lock_guard lock(impl_->mutex);
  return static_cast<int64_t>(impl_->free_blocks.size()) * impl_->opt.block_size;
}

CudaEngine::Capacity CudaEngine::capacity() const {
  const Impl& m = *impl_;
  return {m.num_blocks, m.opt.block_size, m.max_seq_len, m.weight_bytes, m.buffer_bytes, m.kv.bytes(), m.in_use_at_sizing};
}

std::optional<SeqId> CudaEngine::open(int64_t max_tokens) {
  Impl& m = *impl_;
  if (max_tokens < 1 || max_tokens > m.max_seq_len)
    throw core::InputError("a sequence of " + std::to_string(max_tokens) +
                           " tokens exceeds the engine's max sequence length " + std::to_string(m.max_seq_len) +
                           " (raise --max-seq-len, up to the model's " + std::to_string(m.cfg.max_position_embeddings) +
                           ")");
  const int64_t need = m.blocks_for(max_tokens);
  if (need > m.num_blocks)
    throw core::InputError("a sequence of " + std::to_string(max_tokens) + " tokens needs more KV cache than the " +
                           std::to_string(m.num_blocks * m.opt.block_size) +
                           " tokens the pool holds (raise --gpu-memory-fraction or shorten the request)");
  std::lock_guard lock(m.mutex);
  if (need > static_cast<int64_t>(m.free_blocks.size())) return std::nullopt;
  Sequence s;
  s.reserved = max_tokens;
  s.blocks.assign(m.free_blocks.end() - need, m.free_blocks.end());
  m.free_blocks.resize(m.free_blocks.size() - need);
  const SeqId id = m.next_id++;
  m.sequences.emplace(id, std::move(s));
  return id;
}

void CudaEngine::close(SeqId seq) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mutex);
  auto it = m.sequences.find(seq);
  if (it == m.sequences.end()) return;
  m.free_blocks.insert(m.free_blocks.end(), it->second.blocks.rbegin(), it->second.blocks.rend());
  m.sequences.erase(it);
}

void CudaEngine::step(std::span<const SeqId> seqs, std::span<const std::span<const int32_t>> chunks,
                      std::span<float> logits) {
  if (!logits.empty() && logits.size() < seqs.size() * static_cast<size_t>(impl_->cfg.vocab_size))
    throw core::Error("CudaEngine::step: sizes of seqs, chunks and logits disagree");
  impl_->step(seqs, chunks, {logits.empty() ? nullptr : logits.data()});
}

void CudaEngine::step_greedy(std::span<const SeqId> seqs, std::span<const std::span<const int32_t>> chunks,
                             std::span<int32_t> tokens) {
  // A tensor-parallel rank holds its vocabulary rows apart (gathered [world, rows, part]): the
  // host picks from the logits the step puts back together.
  if (impl_->opt.comm) return Engine::step_greedy(seqs, chunks, tokens);
  if (tokens.size() < seqs.size()) throw core::Error("CudaEngine::step_greedy: fewer token slots than sequences");
  impl_->step(seqs, chunks, {nullptr, tokens.data()});
}

void CudaEngine::Impl::step(std::span<const SeqId> seqs, std::span<const std::span<const int32_t>> chunks,
                            StepOutput out) {
  const int64_t V = cfg.vocab_size;
  if (chunks.size() != seqs.size()) throw core::Error("CudaEngine::step: sizes of seqs and chunks disagree");
  if (static_cast<int64_t>(seqs.size()) > opt.max_batch)
    throw core::Error("CudaEngine::step: more sequences than max_batch");
  std::vector<Piece> decodes;
  std::vector<size_t> decode_rows;
  for (size_t i = 0; i < seqs.size(); ++i) {
    Sequence& s = sequence(seqs[i]);
    if (chunks[i].empty()) throw core::Error("CudaEngine::step: an empty chunk");
    if (s.kv_len + static_cast<int64_t>(chunks[i].size()) > s.reserved)
      throw core::Error("CudaEngine::step: sequence grew past the length it reserved");
    for (int32_t id : chunks[i])
      if (id < 0 || id >= V)
        throw core::InputError("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                               std::to_string(V) + ")");
    if (chunks[i].size() == 1) {
      decodes.push_back({&s, chunks[i]});
      decode_rows.push_back(i);
    }
  }
  // Single tokens go together in one decode pass of max_batch rows. Longer chunks run in pieces
  // of at most max_tokens rows (each over the part already cached): one pass each, so every GEMM
  // a sequence sees has the same shape whatever it is batched with and its tokens do not depend
  // on the batch; or with pack_chunks, as many pieces a pass as fit. Only a chunk's last piece
  // has a result, and only it can be shorter than max_tokens: a sequence's pieces never share a
  // pass, so each pass sees the sequence's cache up to its own piece.
  if (!decodes.empty()) forward(decodes, out, false, decode_rows);
  std::vector<Piece> pass;
  std::vector<size_t> pass_rows;
  int64_t pass_tokens = 0;
  const auto run_pass = [&] {
    if (pass.empty()) return;
    forward(pass, out, false, pass_rows);
    pass.clear(), pass_rows.clear(), pass_tokens = 0;
  };
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (chunks[i].size() == 1) continue;
    Sequence& s = sequence(seqs[i]);
    for (size_t t0 = 0; t0 < chunks[i].size(); t0 += static_cast<size_t>(max_tokens)) {
      const int64_t n = std::min<int64_t>(static_cast<int64_t>(chunks[i].size() - t0), max_tokens);
      const bool fits =
          opt.pack_chunks && pass_tokens + n <= max_tokens && static_cast<int64_t>(pass.size()) < opt.max_batch;
      if (!fits) run_pass();
      pass.push_back({&s, chunks[i].subspan(t0, n)});
      pass_rows.push_back(t0 + n == chunks[i].size() ? i : kNoRow);
      pass_tokens += n;
    }
  }
  run_pass();
}

int64_t CudaEngine::forward_passes() const { return impl_->passes; }

std::vector<float> CudaEngine::logits(std::span<const int32_t> ids) {
  Impl& m = *impl_;
  const int64_t T = static_cast<int64_t>(ids.size()), V = m.cfg.vocab_size;
  if (T == 0) throw core::InputError("logits: no token ids");
  for (int32_t id : ids)
    if (id < 0 || id >= V)
      throw core::InputError("token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
  const std::optional<SeqId> id = open(T);
  if (!id) throw core::InputError("logits: the KV cache has no room for " + std::to_string(T) + " tokens now");
  std::vector<float> out(T * V);
  try {
    Sequence& s = m.sequence(*id);
    for (int64_t t0 = 0; t0 < T; t0 += m.logit_rows) {  // passes over the cached past
      const int64_t n = std::min(m.logit_rows, T - t0);
      m.forward({{&s, ids.subspan(t0, n)}}, {out.data() + t0 * V}, true);
    }
  } catch (...) {
    close(*id);
    throw;
  }
  close(*id);
  return out;
}

}  // namespace gpulab::llm
