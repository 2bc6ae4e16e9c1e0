#include "llm/cuda_engine.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <string>

#include "blas/matmul.h"
#include "core/device.h"
#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "kernels/argmax.h"
#include "kernels/attention.h"
#include "kernels/bias_add.h"
#include "kernels/embedding.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/silu_mul.h"

namespace gpulab::llm {

namespace {

using core::DType;
using bf16 = __nv_bfloat16;

constexpr DType kAct = DType::bf16;          // weights, GEMM inputs, q/k/v, KV cache
constexpr size_t kAlign = 256;               // every weight and buffer starts on this boundary
constexpr size_t kSafetyMargin = 512u << 20;  // left free for the CUDA context, graphs, cuBLASLt

std::string gib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
  return buf;
}

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

__global__ void fill_random_kernel(bf16* out, int64_t n, RandomFill fill) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16(random_value(fill, i));
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

struct Layer {
  size_t attn_norm, qkv, qkv_bias, o, o_bias, mlp_norm, gate_up, down;  // offsets into the weights
};

// A sequence in flight: its tokens so far and its KV pages.
struct Sequence {
  std::vector<int32_t> tokens;
  std::vector<int32_t> blocks;
  size_t prompt_len = 0;
  int64_t max_new = 0;
  bool stop_at_eos = false;
};

}  // namespace

struct CudaEngine::Impl {
  LlamaConfig cfg;
  EngineOptions opt;
  int64_t max_seq_len = 0, max_tokens = 0, max_blocks_per_seq = 0, logit_rows = 0;
  int64_t qd = 0, kvd = 0, qkv_width = 0;
  kernels::AttentionShape shape;

  std::unique_ptr<core::Stream> stream;
  std::unique_ptr<blas::Blas> blas;

  // Weights: one allocation.
  core::DeviceBuffer<std::byte> weights;
  size_t embed = 0, final_norm = 0, lm_head = 0;
  std::vector<Layer> layers;
  core::DeviceBuffer<float> inv_freq;

  // Activations, sized for max_tokens rows.
  core::DeviceBuffer<float> x, x_last, logits;
  core::DeviceBuffer<bf16> xn, qkv, attn, gate_up, act;
  core::DeviceBuffer<std::byte> decode_ws;

  // Step metadata: one int32 block mirrored in pinned host memory, copied up once per step.
  struct Meta {
    size_t ids, positions, slots, cu_seqlens, seq_lens, last_rows, block_table, next, total;
  } meta_at{};
  core::DeviceBuffer<int32_t> meta;
  core::PinnedBuffer<int32_t> meta_host;

  // The paged KV pool: per layer K then V, each [num_blocks, block_size, kv_heads, head_dim].
  core::DeviceBuffer<bf16> kv;
  int64_t num_blocks = 0;
  std::vector<int32_t> free_blocks;

  std::map<int64_t, cudaGraphExec_t> decode_graphs;  // by padded batch size
  std::map<int64_t, int> decode_runs;               // eager runs seen per padded batch size

  size_t weight_bytes = 0, buffer_bytes = 0;

  ~Impl() {
    for (auto& [b, exec] : decode_graphs) GPULAB_CHECK_NOTHROW(cudaGraphExecDestroy(exec));
  }

  bf16* w(size_t offset) const { return reinterpret_cast<bf16*>(weights.get() + offset); }
  bf16* k_cache(int64_t layer) const { return kv.get() + (2 * layer) * layer_kv_elems(); }
  bf16* v_cache(int64_t layer) const { return kv.get() + (2 * layer + 1) * layer_kv_elems(); }
  int64_t layer_kv_elems() const { return num_blocks * opt.block_size * kvd; }
  int32_t* dmeta(size_t at) const { return meta.get() + at; }
  int32_t* hmeta(size_t at) const { return meta_host.get() + at; }

  void gemm(const bf16* a, const bf16* weight, void* c, DType c_type, int64_t m, int64_t n, int64_t k, float beta) {
    blas->matmul({m, n, k, false, true}, {kAct, kAct, c_type}, a, weight, c, *stream, 1.f, beta);
  }

  void plan_weights(Arena& arena) {
    const LlamaConfig& c = cfg;
    const int64_t h = c.hidden_size;
    embed = arena.take(c.vocab_size * h * 2);
    final_norm = arena.take(h * 2);
    lm_head = c.tie_word_embeddings ? embed : arena.take(c.vocab_size * h * 2);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      Layer L{};
      L.attn_norm = arena.take(h * 2);
      L.qkv = arena.take(qkv_width * h * 2);
      if (c.qkv_bias) L.qkv_bias = arena.take(qkv_width * 2);
      L.o = arena.take(h * qd * 2);
      if (c.o_bias) L.o_bias = arena.take(h * 4);  // float: added to the float residual
      L.mlp_norm = arena.take(h * 2);
      L.gate_up = arena.take(2 * c.intermediate_size * h * 2);
      L.down = arena.take(h * c.intermediate_size * 2);
      layers.push_back(L);
    }
  }

  // Uploads HF tensor `name` to `offset`, as bf16 (or float for `as_float`). Fused tensors
  // are stacked by row, so each part lands at its row offset.
  void upload(const WeightSource& src, const std::string& name, size_t offset, bool as_float = false) {
    void* dst = weights.get() + offset;
    const int64_t n = numel(src.spec(name).shape);
    if (as_float) {
      const std::vector<float> v = src.load_f32(name);
      GPULAB_CHECK(cudaMemcpy(dst, v.data(), n * 4, cudaMemcpyHostToDevice));
    } else if (src.is_random()) {
      fill_random_kernel<<<std::min<int64_t>((n + 255) / 256, 8192), 256, 0, *stream>>>(
          static_cast<bf16*>(dst), n, random_fill(name, src.seed()));
      GPULAB_CHECK_LAUNCH();
    } else {
      const std::vector<uint16_t> v = src.load_bf16(name);
      GPULAB_CHECK(cudaMemcpy(dst, v.data(), n * 2, cudaMemcpyHostToDevice));
    }
  }

  void upload_weights(const WeightSource& src) {
    const LlamaConfig& c = cfg;
    const int64_t h = c.hidden_size;
    upload(src, "model.embed_tokens.weight", embed);
    upload(src, "model.norm.weight", final_norm);
    if (!c.tie_word_embeddings) upload(src, "lm_head.weight", lm_head);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const Layer& L = layers[l];
      auto up = [&](const std::string& suffix, size_t offset, bool as_float = false) {
        upload(src, layer_weight(l, suffix), offset, as_float);
      };
      up("input_layernorm.weight", L.attn_norm);
      up("self_attn.q_proj.weight", L.qkv);
      up("self_attn.k_proj.weight", L.qkv + qd * h * 2);
      up("self_attn.v_proj.weight", L.qkv + (qd + kvd) * h * 2);
      if (c.qkv_bias) {
        up("self_attn.q_proj.bias", L.qkv_bias);
        up("self_attn.k_proj.bias", L.qkv_bias + qd * 2);
        up("self_attn.v_proj.bias", L.qkv_bias + (qd + kvd) * 2);
      }
      up("self_attn.o_proj.weight", L.o);
      if (c.o_bias) up("self_attn.o_proj.bias", L.o_bias, true);
      up("post_attention_layernorm.weight", L.mlp_norm);
      up("mlp.gate_proj.weight", L.gate_up);
      up("mlp.up_proj.weight", L.gate_up + c.intermediate_size * h * 2);
      up("mlp.down_proj.weight", L.down);
    }
    stream->synchronize();
  }

  void allocate_buffers() {
    const LlamaConfig& c = cfg;
    const int64_t h = c.hidden_size, B = opt.max_batch;
    x = core::DeviceBuffer<float>(max_tokens * h);
    x_last = core::DeviceBuffer<float>(std::max(B, logit_rows) * h);
    logits = core::DeviceBuffer<float>(std::max(B, logit_rows) * c.vocab_size);
    xn = core::DeviceBuffer<bf16>(max_tokens * h);
    qkv = core::DeviceBuffer<bf16>(max_tokens * qkv_width);
    attn = core::DeviceBuffer<bf16>(max_tokens * qd);
    gate_up = core::DeviceBuffer<bf16>(max_tokens * 2 * c.intermediate_size);
    act = core::DeviceBuffer<bf16>(max_tokens * c.intermediate_size);
    decode_ws = core::DeviceBuffer<std::byte>(kernels::attention_decode_workspace(B, max_seq_len, shape));
    Arena m;
    meta_at.ids = m.take(max_tokens * 4) / 4;
    meta_at.positions = m.take(max_tokens * 4) / 4;
    meta_at.slots = m.take(max_tokens * 4) / 4;
    meta_at.cu_seqlens = m.take((B + 1) * 4) / 4;
    meta_at.seq_lens = m.take(B * 4) / 4;
    meta_at.last_rows = m.take(B * 4) / 4;
    meta_at.block_table = m.take(B * max_blocks_per_seq * 4) / 4;
    meta_at.next = m.take(B * 4) / 4;
    meta_at.total = m.bytes / 4;
    meta = core::DeviceBuffer<int32_t>(meta_at.total);
    meta_host = core::PinnedBuffer<int32_t>(meta_at.total);
  }

  size_t buffer_bytes_needed() const {
    const LlamaConfig& c = cfg;
    const int64_t h = c.hidden_size, B = opt.max_batch, rows = std::max(B, logit_rows);
    size_t n = 0;
    n += align_up(max_tokens * h * 4) + align_up(rows * h * 4) + align_up(rows * c.vocab_size * 4);
    n += align_up(max_tokens * h * 2) + align_up(max_tokens * qkv_width * 2) + align_up(max_tokens * qd * 2);
    n += align_up(max_tokens * 3 * c.intermediate_size * 2);
    n += align_up(kernels::attention_decode_workspace(B, max_seq_len, shape));
    return n;
  }

  void size_kv_pool() {
    size_t free_bytes = 0, total = 0;
    GPULAB_CHECK(cudaMemGetInfo(&free_bytes, &total));
    const double budget = opt.gpu_memory_fraction * static_cast<double>(total) -
                          static_cast<double>(total - free_bytes) - static_cast<double>(kSafetyMargin);
    const size_t block_bytes = 2 * cfg.num_layers * opt.block_size * kvd * 2;
    num_blocks = budget > 0 ? static_cast<int64_t>(budget / static_cast<double>(block_bytes)) : 0;
    if (opt.max_kv_tokens > 0)
      num_blocks = std::min(num_blocks, (opt.max_kv_tokens + opt.block_size - 1) / opt.block_size);
    if (num_blocks < 1)
      throw core::InputError("no GPU memory left for the KV cache at --gpu-memory-fraction " +
                             std::to_string(opt.gpu_memory_fraction) + ": weights take " + gib(weight_bytes) +
                             ", buffers " + gib(buffer_bytes) + ", " + gib(free_bytes) + " free of " + gib(total) +
                             " (raise the fraction, or lower --max-batch / --max-seq-len)");
    kv = core::DeviceBuffer<bf16>(2 * cfg.num_layers * num_blocks * opt.block_size * kvd);
    free_blocks.clear();
    for (int64_t b = num_blocks - 1; b >= 0; --b) free_blocks.push_back(static_cast<int32_t>(b));
    core::log_info("KV cache: ", num_blocks, " pages of ", opt.block_size, " tokens (", num_blocks * opt.block_size,
                   " tokens, ", gib(kv.bytes()), "); weights ", gib(weight_bytes), ", buffers ", gib(buffer_bytes));
  }

  int64_t blocks_for(int64_t tokens) const { return (tokens + opt.block_size - 1) / opt.block_size; }

  // Refuses, with the reason, a request that could never run on this engine.
  void check_fits(const std::vector<int32_t>& prompt, int64_t max_new, const std::string& what) const {
    if (prompt.empty()) throw core::InputError(what + ": the prompt is empty");
    for (int32_t id : prompt)
      if (id < 0 || id >= cfg.vocab_size)
        throw core::InputError(what + ": token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                               std::to_string(cfg.vocab_size) + ")");
    const int64_t total = static_cast<int64_t>(prompt.size()) + max_new;
    if (total > max_seq_len)
      throw core::InputError(what + ": " + std::to_string(prompt.size()) + " prompt + " + std::to_string(max_new) +
                             " new tokens exceed the engine's max sequence length " + std::to_string(max_seq_len));
    if (blocks_for(total) > num_blocks)
      throw core::InputError(what + ": needs " + std::to_string(total) + " tokens of KV cache but the pool holds " +
                             std::to_string(num_blocks * opt.block_size) +
                             " (raise --gpu-memory-fraction or shorten the request)");
  }

  void release(Sequence& s) {
    free_blocks.insert(free_blocks.end(), s.blocks.rbegin(), s.blocks.rend());
    s.blocks.clear();
  }

  int32_t slot_of(const Sequence& s, int64_t pos) const {
    return s.blocks[pos / opt.block_size] * static_cast<int32_t>(opt.block_size) +
           static_cast<int32_t>(pos % opt.block_size);
  }

  // The transformer layers over `n` packed rows whose metadata is on the device. Prefill
  // attends within each of `b` sequences (none longer than `max_len`); decode reads each
  // sequence's pages.
  void layers_forward(int64_t n, int64_t b, bool prefill, int64_t max_len) {
    const LlamaConfig& c = cfg;
    const int64_t h = c.hidden_size, inter = c.intermediate_size;
    const float eps = static_cast<float>(c.rms_norm_eps);
    kernels::embedding(x.get(), DType::f32, w(embed), kAct, dmeta(meta_at.ids), n, h, *stream);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const Layer& L = layers[l];
      kernels::rmsnorm(xn.get(), kAct, x.get(), DType::f32, w(L.attn_norm), n, h, eps, *stream);
      gemm(xn.get(), w(L.qkv), qkv.get(), kAct, n, qkv_width, h, 0.f);
      if (c.qkv_bias) kernels::bias_add(qkv.get(), w(L.qkv_bias), n, qkv_width, kAct, *stream);
      bf16* q = qkv.get();
      bf16* k = q + qd;
      bf16* v = k + kvd;
      kernels::rope({q, qkv_width, c.num_heads}, {k, qkv_width, c.num_kv_heads}, dmeta(meta_at.positions),
                    inv_freq.get(), n, c.head_dim, kAct, *stream);
      kernels::kv_cache_write(k_cache(l), v_cache(l), {k, qkv_width}, {v, qkv_width}, dmeta(meta_at.slots), n,
                              c.num_kv_heads, c.head_dim, kAct, *stream);
      if (prefill) {
        kernels::attention_prefill({attn.get(), qd}, {q, qkv_width}, {k, qkv_width}, {v, qkv_width},
                                   dmeta(meta_at.cu_seqlens), b, max_len, shape, kAct, *stream);
      } else {
        const kernels::PagedKv paged{k_cache(l), v_cache(l), dmeta(meta_at.block_table), max_blocks_per_seq,
                                     opt.block_size};
        kernels::attention_decode({attn.get(), qd}, {q, qkv_width}, paged, dmeta(meta_at.seq_lens), b, max_seq_len,
                                  shape, decode_ws.get(), kAct, *stream);
      }
      gemm(attn.get(), w(L.o), x.get(), DType::f32, n, h, qd, 1.f);  // x += attn · Woᵀ
      if (c.o_bias)
        kernels::bias_add(x.get(), weights.get() + L.o_bias, n, h, DType::f32, *stream);
      kernels::rmsnorm(xn.get(), kAct, x.get(), DType::f32, w(L.mlp_norm), n, h, eps, *stream);
      gemm(xn.get(), w(L.gate_up), gate_up.get(), kAct, n, 2 * inter, h, 0.f);
      kernels::silu_mul(act.get(), gate_up.get(), n, inter, kAct, *stream);
      gemm(act.get(), w(L.down), x.get(), DType::f32, n, h, inter, 1.f);  // x += mlp
    }
  }

  // Final norm and lm_head for the last row of each sequence, then argmax into meta `next`.
  void sample_last_rows(int64_t b) {
    const int64_t h = cfg.hidden_size;
    kernels::embedding(x_last.get(), DType::f32, x.get(), DType::f32, dmeta(meta_at.last_rows), b, h, *stream);
    kernels::rmsnorm(xn.get(), kAct, x_last.get(), DType::f32, w(final_norm), b, h,
                     static_cast<float>(cfg.rms_norm_eps), *stream);
    gemm(xn.get(), w(lm_head), logits.get(), DType::f32, b, cfg.vocab_size, h, 0.f);
    kernels::argmax(dmeta(meta_at.next), logits.get(), b, cfg.vocab_size, DType::f32, *stream);
  }

  void upload_meta() {
    GPULAB_CHECK(cudaMemcpyAsync(meta.get(), meta_host.get(), meta_at.total * 4, cudaMemcpyHostToDevice, *stream));
  }

  // Next token of each sequence, read back after the step.
  std::vector<int32_t> read_next(int64_t b) {
    GPULAB_CHECK(cudaMemcpyAsync(hmeta(meta_at.next), dmeta(meta_at.next), b * 4, cudaMemcpyDeviceToHost, *stream));
    stream->synchronize();
    return std::vector<int32_t>(hmeta(meta_at.next), hmeta(meta_at.next) + b);
  }

  // Prefill of fresh sequences (their whole token lists); all_logits: copy every row's logits.
  std::vector<int32_t> prefill(const std::vector<Sequence*>& seqs, std::vector<float>* all_logits) {
    const int64_t b = static_cast<int64_t>(seqs.size());
    int64_t n = 0, max_len = 0;
    hmeta(meta_at.cu_seqlens)[0] = 0;
    for (int64_t s = 0; s < b; ++s) {
      const Sequence& seq = *seqs[s];
      max_len = std::max(max_len, static_cast<int64_t>(seq.tokens.size()));
      for (size_t t = 0; t < seq.tokens.size(); ++t, ++n) {
        hmeta(meta_at.ids)[n] = seq.tokens[t];
        hmeta(meta_at.positions)[n] = static_cast<int32_t>(t);
        hmeta(meta_at.slots)[n] = slot_of(seq, t);
      }
      hmeta(meta_at.cu_seqlens)[s + 1] = static_cast<int32_t>(n);
      hmeta(meta_at.last_rows)[s] = static_cast<int32_t>(n - 1);
    }
    upload_meta();
    layers_forward(n, b, true, max_len);
    if (all_logits) {
      const int64_t h = cfg.hidden_size, V = cfg.vocab_size;
      all_logits->resize(n * V);
      for (int64_t r0 = 0; r0 < n; r0 += logit_rows) {
        const int64_t rows = std::min(logit_rows, n - r0);
        kernels::rmsnorm(xn.get(), kAct, x.get() + r0 * h, DType::f32, w(final_norm), rows, h,
                         static_cast<float>(cfg.rms_norm_eps), *stream);
        gemm(xn.get(), w(lm_head), logits.get(), DType::f32, rows, V, h, 0.f);
        GPULAB_CHECK(cudaMemcpyAsync(all_logits->data() + r0 * V, logits.get(), rows * V * 4, cudaMemcpyDeviceToHost,
                                     *stream));
        stream->synchronize();
      }
    }
    sample_last_rows(b);
    return read_next(b);
  }

  // One decode step: the last token of each sequence. Batches are padded to a power of two
  // so a few CUDA graphs cover every size; padding rows write no KV and are ignored.
  std::vector<int32_t> decode(const std::vector<Sequence*>& seqs) {
    const int64_t b = static_cast<int64_t>(seqs.size());
    int64_t padded = 1;
    while (padded < b) padded *= 2;
    padded = std::min(padded, opt.max_batch);
    std::fill_n(hmeta(meta_at.block_table), padded * max_blocks_per_seq, 0);
    for (int64_t s = 0; s < padded; ++s) {
      const bool real = s < b;
      const int64_t pos = real ? static_cast<int64_t>(seqs[s]->tokens.size()) - 1 : 0;
      hmeta(meta_at.ids)[s] = real ? seqs[s]->tokens.back() : 0;
      hmeta(meta_at.positions)[s] = static_cast<int32_t>(pos);
      hmeta(meta_at.slots)[s] = real ? slot_of(*seqs[s], pos) : -1;
      hmeta(meta_at.seq_lens)[s] = static_cast<int32_t>(pos + 1);
      hmeta(meta_at.last_rows)[s] = static_cast<int32_t>(s);
      if (real) std::copy(seqs[s]->blocks.begin(), seqs[s]->blocks.end(), hmeta(meta_at.block_table) + s * max_blocks_per_seq);
    }
    upload_meta();
    auto graph = decode_graphs.find(padded);
    if (graph != decode_graphs.end()) {
      GPULAB_CHECK(cudaGraphLaunch(graph->second, *stream));
    } else {
      layers_forward(padded, padded, false, max_seq_len);
      sample_last_rows(padded);
      // After one eager run (cuBLASLt plans made), capture the step for this batch size.
      if (opt.cuda_graphs && ++decode_runs[padded] == 1) capture_decode(padded);
    }
    std::vector<int32_t> next = read_next(padded);
    next.resize(b);
    return next;
  }

  void capture_decode(int64_t padded) {
    stream->synchronize();
    cudaGraph_t graph = nullptr;
    GPULAB_CHECK(cudaStreamBeginCapture(*stream, cudaStreamCaptureModeThreadLocal));
    try {
      layers_forward(padded, padded, false, max_seq_len);
      sample_last_rows(padded);
    } catch (...) {
      cudaStreamEndCapture(*stream, &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    GPULAB_CHECK(cudaStreamEndCapture(*stream, &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
    GPULAB_CHECK(cudaGraphDestroy(graph));
    GPULAB_CHECK(status);
    decode_graphs[padded] = exec;
  }

  static bool finished(const Sequence& s, const LlamaConfig& cfg) {
    const int64_t generated = static_cast<int64_t>(s.tokens.size() - s.prompt_len);
    if (generated >= s.max_new) return true;
    return s.stop_at_eos && std::count(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end(), s.tokens.back());
  }
};

CudaEngine::CudaEngine(const WeightSource& src, const EngineOptions& options) : impl_(std::make_unique<Impl>()) {
  if (const std::string why = core::why_no_device(); !why.empty())
    throw core::NoDeviceError("the CUDA engine needs a CUDA device: " + why);
  Impl& m = *impl_;
  m.cfg = src.config();
  m.opt = options;
  const LlamaConfig& c = m.cfg;
  if (options.gpu_memory_fraction <= 0 || options.gpu_memory_fraction > 1)
    throw core::InputError("--gpu-memory-fraction must be in (0, 1]");
  if (options.max_batch < 1 || options.block_size < 1) throw core::InputError("max batch and block size must be positive");
  m.max_seq_len = options.max_seq_len > 0 ? options.max_seq_len : std::min<int64_t>(c.max_position_embeddings, 8192);
  if (m.max_seq_len > c.max_position_embeddings)
    throw core::InputError("--max-seq-len " + std::to_string(m.max_seq_len) + " exceeds the model's " +
                           std::to_string(c.max_position_embeddings) + " positions");
  m.max_tokens = std::max(m.max_seq_len, options.max_batch);
  m.max_blocks_per_seq = m.blocks_for(m.max_seq_len);
  m.logit_rows = 256;
  m.qd = c.q_dim();
  m.kvd = c.kv_dim();
  m.qkv_width = m.qd + 2 * m.kvd;
  m.shape = {c.num_heads, c.num_kv_heads, c.head_dim, 1.0f / std::sqrt(static_cast<float>(c.head_dim))};

  Arena arena;
  m.plan_weights(arena);
  m.weight_bytes = arena.bytes;
  m.buffer_bytes = m.buffer_bytes_needed();
  size_t free_bytes = 0, total = 0;
  GPULAB_CHECK(cudaMemGetInfo(&free_bytes, &total));
  const double allowed = options.gpu_memory_fraction * static_cast<double>(total) -
                         static_cast<double>(total - free_bytes) - static_cast<double>(kSafetyMargin);
  if (static_cast<double>(m.weight_bytes + m.buffer_bytes) > allowed)
    throw core::InputError("the model does not fit: weights need " + gib(m.weight_bytes) + " and buffers " +
                           gib(m.buffer_bytes) + ", but --gpu-memory-fraction " +
                           std::to_string(options.gpu_memory_fraction) + " leaves " +
                           gib(allowed > 0 ? static_cast<size_t>(allowed) : 0) + " (" + gib(free_bytes) + " free of " +
                           gib(total) + ")");

  m.stream = std::make_unique<core::Stream>();
  m.blas = std::make_unique<blas::Blas>();
  m.weights = core::DeviceBuffer<std::byte>(m.weight_bytes);
  m.upload_weights(src);
  const std::vector<float> inv = rope_inv_freq(c.rope, c.head_dim, c.dtype);
  m.inv_freq = core::DeviceBuffer<float>(inv.size());
  GPULAB_CHECK(cudaMemcpy(m.inv_freq.get(), inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
  m.allocate_buffers();
  m.size_kv_pool();
}

CudaEngine::~CudaEngine() = default;

const LlamaConfig& CudaEngine::config() const { return impl_->cfg; }

CudaEngine::Capacity CudaEngine::capacity() const {
  const Impl& m = *impl_;
  return {m.num_blocks, m.opt.block_size, m.opt.max_batch, m.max_seq_len, m.weight_bytes, m.buffer_bytes, m.kv.bytes()};
}

std::vector<float> CudaEngine::logits(std::span<const int32_t> ids) {
  Impl& m = *impl_;
  Sequence seq;
  seq.tokens.assign(ids.begin(), ids.end());
  seq.prompt_len = seq.tokens.size();
  m.check_fits(seq.tokens, 0, "logits");
  for (int64_t i = 0; i < m.blocks_for(static_cast<int64_t>(ids.size())); ++i) {
    seq.blocks.push_back(m.free_blocks.back());
    m.free_blocks.pop_back();
  }
  std::vector<float> out;
  try {
    m.prefill({&seq}, &out);
  } catch (...) {
    m.release(seq);
    throw;
  }
  m.release(seq);
  return out;
}

std::vector<std::vector<int32_t>> CudaEngine::generate_greedy(const std::vector<GenerationRequest>& requests) {
  Impl& m = *impl_;
  std::vector<Sequence> seqs(requests.size());
  std::deque<size_t> waiting;
  for (size_t i = 0; i < requests.size(); ++i) {
    m.check_fits(requests[i].prompt, requests[i].max_new_tokens, "request " + std::to_string(i));
    seqs[i].tokens = requests[i].prompt;
    seqs[i].prompt_len = requests[i].prompt.size();
    seqs[i].max_new = requests[i].max_new_tokens;
    seqs[i].stop_at_eos = requests[i].stop_at_eos;
    if (seqs[i].max_new > 0) waiting.push_back(i);
  }
  std::vector<size_t> running;
  try {
    while (!waiting.empty() || !running.empty()) {
      // Admit waiting requests while a batch slot, their pages and prefill rows are free.
      std::vector<size_t> admitted;
      int64_t rows = 0;
      while (!waiting.empty() && static_cast<int64_t>(running.size() + admitted.size()) < m.opt.max_batch) {
        Sequence& s = seqs[waiting.front()];
        const int64_t need = m.blocks_for(static_cast<int64_t>(s.prompt_len) + s.max_new);
        if (need > static_cast<int64_t>(m.free_blocks.size()) || rows + static_cast<int64_t>(s.prompt_len) > m.max_tokens)
          break;
        for (int64_t b = 0; b < need; ++b) {
          s.blocks.push_back(m.free_blocks.back());
          m.free_blocks.pop_back();
        }
        rows += static_cast<int64_t>(s.prompt_len);
        admitted.push_back(waiting.front());
        waiting.pop_front();
      }
      std::vector<size_t>& stepping = admitted.empty() ? running : admitted;
      if (stepping.empty()) throw core::Error("scheduler stalled: no request can start");  // check_fits prevents this
      std::vector<Sequence*> batch;
      for (size_t i : stepping) batch.push_back(&seqs[i]);
      const std::vector<int32_t> next = admitted.empty() ? m.decode(batch) : m.prefill(batch, nullptr);
      std::vector<size_t> still;
      for (size_t j = 0; j < stepping.size(); ++j) {
        Sequence& s = seqs[stepping[j]];
        s.tokens.push_back(next[j]);
        if (Impl::finished(s, m.cfg))
          m.release(s);
        else
          still.push_back(stepping[j]);
      }
      if (admitted.empty()) {
        running = std::move(still);
      } else {
        running.insert(running.end(), still.begin(), still.end());
      }
    }
  } catch (...) {
    for (Sequence& s : seqs) m.release(s);
    throw;
  }
  std::vector<std::vector<int32_t>> out(requests.size());
  for (size_t i = 0; i < seqs.size(); ++i) out[i].assign(seqs[i].tokens.begin() + seqs[i].prompt_len, seqs[i].tokens.end());
  return out;
}

}  // namespace gpulab::llm
