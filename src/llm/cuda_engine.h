// The CUDA inference engine for LLaMA-family models: bf16 or fp8 weights uploaded once (q/k/v
// and gate/up fused at load), float32 residual stream and accumulation, cuBLASLt GEMMs, a paged KV
// cache sized from free memory, steps of prefill chunks and decode tokens (driven by the
// Scheduler through the Engine interface; decode tokens run together in one CUDA-graph pass of
// max_batch rows, each chunk in passes of its own, so a sequence's tokens do not depend on what
// it is batched with). Every buffer is sized up front; a sequence that cannot fit is refused
// before any work starts.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "llm/engine.h"
#include "llm/tensor_parallel.h"

namespace gpulab::llm {

// Storage of the linear layers' weights (q/k/v/o, gate/up, down; embeddings, norms and lm_head
// stay bf16). fp8: e4m3 with one scale per output channel, quantized at load (or as stored by
// an fp8 checkpoint); activations are quantized every step with dynamic scales.
enum class WeightFormat { bf16, fp8 };
// fp8 activation scales: one per token (a sequence's results do not depend on its batch), or
// one per tensor (the amax over every row of the step, padding rows included).
enum class Fp8ActivationScale { token, tensor };

struct EngineOptions {
  double gpu_memory_fraction = 0.9;  // of the GPU's total memory, for weights + buffers + KV cache
  int64_t max_batch = 64;            // sequences in one step
  int64_t max_seq_len = 0;           // prompt + generated tokens; 0: min(max_position_embeddings, 32768)
  int64_t max_step_tokens = 4096;    // rows of one forward pass; longer steps run in pieces
  int64_t max_kv_tokens = 0;         // cap on the KV pool; 0: as much as memory allows
  int64_t block_size = 16;           // tokens per KV page
  bool cuda_graphs = true;           // replay pure decode steps from CUDA graphs
  // Decode passes of at most 16 rows can run their linear layers on
  // kernels::skinny_gemm (the norms and the SwiGLU gate fused into it) instead of cuBLASLt.
  // Unset (decode_skinny_gemm): every layer where its GEMV kernel takes the decode pass
  // (max_batch ≤ kernels::kGemvMaxRows): on the H200, 7B batch 1, 3.69-3.75 against 4.33-4.37 ms
  // a step on cuBLASLt (session 9); above that, up to 16 rows, every layer on its tensor-core
  // kernel for plain inputs, the norms and the gate as kernels of their own (DecodeSkinny::plain):
  // batch 4 / 8 / 16 3.849 / 4.046 / 4.575 ms against 4.271 / 4.406 / 4.719 on cuBLASLt with o_proj
  // alone on it, LLaMA-3-8B batch 16 4.621 against 4.843 (session 18). With the norms and the gate
  // fused into its other kernel, every layer lost to cuBLASLt there (session 9).
  // true / false: every layer up to 16 rows / none. fp8 weights run on the GEMV weight-only (the
  // bf16 activations not quantized) where it takes max_batch rows, else on the W8A8 tensor-core
  // kernel (DecodeSkinny::w8a8), by default and with true.
  // GPULAB_SKINNY_GEMM=1 or 0 overrides this.
  std::optional<bool> skinny_gemm;
  // Prompt chunks of one step share forward passes (up to max_step_tokens rows and max_batch
  // chunks a pass) instead of running one pass each: a serve step that admits many prompts then
  // reads the weights once per pass rather than once per prompt. A chunk's logits then depend on
  // the chunks packed beside it (the GEMMs change shape), within bf16 rounding; off, every
  // sequence's tokens are independent of its batch. Decode steps are unchanged either way.
  bool pack_chunks = false;
  // The decode GEMMs' cuBLASLt algorithms are timed at warm-up, the fastest of a few candidates
  // kept. The pick rests on timings, so two engines on one GPU may take different algorithms for
  // the same shape and their decode logits then differ in the last bits. Off: the heuristic's
  // first choice, the same in every engine (what a bit-for-bit comparison of two engines needs).
  // Under compute-sanitizer's racecheck always off (blas::Blas::set_autotune).
  bool autotune_decode_gemms = true;
  WeightFormat weights = WeightFormat::bf16;
  Fp8ActivationScale fp8_activations = Fp8ActivationScale::token;
  // Tensor parallel (see llm/tensor_parallel.h): this engine is rank shard.rank of shard.world
  // and holds that shard of the weights; `comm`, its rank of an NCCL communicator of
  // shard.world ranks on the current device, carries the all-reduces, the logits gather and
  // the agreement on sizes. Null: no NCCL (world 1 only). The caller keeps it alive and every
  // rank makes the same calls in the same order (TpEngine does for the GPUs of one process).
  ShardSpec shard;
  ncclComm_t comm = nullptr;
  // With a comm: the residual, all-reduced twice a layer, lives in NCCL symmetric memory
  // (comm/symmetric_buffer.h), so NCCL runs its low-latency symmetric kernels on it (plain
  // memory where NCCL gives no symmetric window). On: with 2 H200s (NVLink) it took a 7B
  // batch-1 decode step from 3.50-3.52 to 3.19-3.27 ms, batch 16 unchanged within 2 %
  // (docs/benchmarks.md). The environment overrides this: GPULAB_NCCL_SYMMETRIC=0 or 1.
  bool nccl_symmetric = true;
};

// Whether a tensor-parallel engine with these options asks for its residual in NCCL symmetric
// memory (nccl_symmetric, unless GPULAB_NCCL_SYMMETRIC says otherwise).
bool residual_wants_symmetric_memory(const EngineOptions& options);

// Which linear layers of an engine's decode passes run on kernels::skinny_gemm rather than
// cuBLASLt (EngineOptions::skinny_gemm, GPULAB_SKINNY_GEMM): only with a single GPU,
// max_batch ≤ 16 and rows of whole 16-byte pieces. none: every layer on cuBLASLt; plain: every
// layer on skinny_gemm, its input normed or gated by a kernel before (the tensor-core kernel for
// plain inputs); all: the same, the norms and the gate fused into skinny_gemm (the GEMV where it
// takes the rows). fp8 weights take all (the GEMV, weight-only) where the GEMV takes max_batch
// rows, and above that w8a8: the four linear layers on skinny_gemm's e4m3 tensor-core kernel,
// their inputs quantized as for cuBLASLt, everything else as with none.
enum class DecodeSkinny { none, plain, all, w8a8 };
DecodeSkinny decode_skinny_gemm(const EngineOptions& options, const LlamaConfig& model);
// "cublaslt", "skinny_plain", "skinny", "cublaslt+skinny_w8a8"
const char* to_string(DecodeSkinny which);

class CudaEngine final : public Engine {
 public:
  // Throws core::NoDeviceError without a GPU, core::InputError when the model or its buffers
  // do not fit in gpu_memory_fraction of the GPU.
  CudaEngine(const WeightSource& weights, const EngineOptions& options = {});
  ~CudaEngine() override;
  // The caller aborted the communicator (ncclCommAbort frees it): the engine's destructor then
  // makes no NCCL call on it.
  void communicator_aborted();

  const LlamaConfig& config() const override;
  const char* device_name() const override { return "cuda"; }
  int64_t max_batch() const override;
  // min(KV pool, max sequence length): the most one sequence can hold.
  int64_t kv_capacity_tokens() const override;
  int64_t kv_free_tokens() const override;
  int64_t max_sequence_tokens() const override;
  // Throws core::InputError when max_tokens exceeds the engine's max sequence length.
  std::optional<SeqId> open(int64_t max_tokens) override;
  void close(SeqId seq) override;
  // An empty `logits` computes the step without copying logits to the host (the ranks of a
  // tensor-parallel group other than 0).
  void step(std::span<const SeqId> seqs, std::span<const std::span<const int32_t>> chunks,
            std::span<float> logits) override;
  // Picks each row's greedy token on the GPU (on the host from the logits with tensor parallelism).
  void step_greedy(std::span<const SeqId> seqs, std::span<const std::span<const int32_t>> chunks,
                   std::span<int32_t> tokens) override;

  // Logits [ids.size(), vocab] in float32 of every position of one prompt.
  std::vector<float> logits(std::span<const int32_t> ids);
  // Forward passes run so far (each one read of the weights): what pack_chunks saves.
  int64_t forward_passes() const;

  struct Capacity {
    int64_t kv_blocks = 0;
    int64_t block_size = 0;
    int64_t max_seq_len = 0;
    size_t weight_bytes = 0;
    size_t buffer_bytes = 0;
    size_t kv_bytes = 0;
    // GPU memory in use when the pool was sized (this engine's weights and buffers, the rest of
    // the process, other processes): the pool takes the fraction's budget less this.
    size_t in_use_bytes = 0;
  };
  Capacity capacity() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpulab::llm
