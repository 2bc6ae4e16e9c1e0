// `gpulab bench llm`: how close LLM inference comes to what the GPU allows. Decode reads every
// weight (and each sequence's KV cache) once per step, so its floor is those bytes over the
// measured copy bandwidth; prefill is GEMM work, measured against cuBLASLt's bf16 rate in the
// same run. With fp8 weights each linear layer's GEMM is also timed alone at the prefill's rows
// (the caller sets them beside bench gemm's fp8 figure: bench/ sits beside llm/, not below it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/gpu_sampler.h"
#include "llm/make_engine.h"
#include "llm/weights.h"

namespace gpulab::llm {

struct LlmBenchOptions {
  std::vector<int64_t> batches{1, 16};
  int64_t input = 128;    // prompt tokens per sequence
  int64_t output = 128;   // generated tokens per sequence
  int64_t prefill = 2048; // one prompt of this many tokens, timed alone (0: skip)
  uint64_t seed = 1;      // prompt token ids
};

// The ceilings the figures are measured against, measured in the same run.
struct Ceilings {
  double copy_bytes_per_s = 0;    // device-to-device copy, read + write bytes
  double gemm_bf16_flop_per_s = 0;  // cuBLASLt bf16, 8192³
};

struct DecodeFigures {
  int64_t batch = 0;
  double ttft_ms = 0;            // the batch's prompts prefilled, first tokens sampled
  double step_ms_median = 0;     // one decode step of the whole batch
  double step_ms_p90 = 0;
  double decode_tokens_per_s = 0;      // batch / median step
  double end_to_end_tokens_per_s = 0;  // batch · output / (TTFT + all steps)
  double bytes_per_step = 0;     // weights read + mean KV read per step
  double floor_ms = 0;           // bytes_per_step over the copy bandwidth
  double fraction_of_floor = 0;  // floor_ms / step_ms_median
  DecodeSkinny decode_gemm = DecodeSkinny::none;  // decode layers on kernels::skinny_gemm (else cuBLASLt)
  // The residual's all-reduce: "none" (one GPU), "symmetric" (NCCL symmetric memory asked for;
  // the log says whether NCCL gave the window) or "plain".
  const char* all_reduce = "none";
  // The SM clock and board power over the decode steps (NVML every 50 ms on the current GPU, rank
  // 0's; empty without NVML), beside the board's power limit and highest SM clock: a step below
  // the floor may be one the power cap slowed (the 70B fp8 decode on the H200, session 25).
  std::optional<core::ClockSummary> clocks;
  std::optional<double> power_limit_w;
  std::optional<unsigned> max_sm_clock_mhz;
};

struct PrefillFigures {
  int64_t tokens = 0;
  double ms = 0;
  double flop = 0;  // GEMMs plus causal attention
  double flop_per_s = 0;
  double fraction_of_gemm = 0;  // of Ceilings::gemm_bf16_flop_per_s
};

// One linear layer of the CUDA engine as a GEMM: y[m, n] = x[m, k]·W[n, k]ᵀ.
struct LinearShape {
  std::string name;  // qkv, o_proj, gate_up, down
  int64_t n = 0, k = 0;
  bool into_residual = false;  // adds into the float residual (o_proj, down); else writes bf16
};

// One fp8 linear layer's cuBLASLt GEMM at m rows.
struct LinearGemmFigures {
  LinearShape shape;
  int64_t m = 0;
  // As the engine calls it: bf16 out with beta 0, or f32 with beta 1 into the residual where
  // cuBLASLt takes that (else bf16, and the engine adds it with a kernel not timed here).
  core::DType output = core::DType::bf16;
  float beta = 0;
  // Median of a call among back-to-back ones, with the cuBLASLt heuristic's algorithm: the
  // engine's choice at prefill.
  double ms = 0;
  double flop_per_s = 0;
  double autotuned_flop_per_s = 0;  // the fastest of the heuristic's candidates, as bench gemm picks
};

struct LlmBenchReport {
  Ceilings ceilings;
  std::vector<DecodeFigures> decode;
  std::optional<PrefillFigures> prefill;
  std::vector<LinearGemmFigures> prefill_gemms;  // --weights fp8 with a prefill: at its rows
};

Ceilings measure_ceilings();

// Runs each batch on a CUDA engine sized for it (so decode steps carry exactly that batch),
// greedy, every sequence generating `output` tokens.
LlmBenchReport bench_llm(const WeightSource& weights, EngineSpec spec, const LlmBenchOptions& options);

// The linear layers CudaEngine runs in fp8 under --weights fp8, for `config` as one rank holds it
// (shard_config under tensor parallel), fused as the engine lays them out (q/k/v; gate/up).
// lm_head stays bf16 in the engine and is not among them.
std::vector<LinearShape> fp8_linear_shapes(const LlamaConfig& config);
// Times each of those GEMMs at m rows with the call CudaEngine::linear makes: e4m3 activations
// (per-token scales) times e4m3 weights (per-channel scales) as cuBLASLt outer-vector scales,
// B transposed, bf16 or float out. The weights rotate among copies past twice the L2, as the
// engine's layers each have their own; the activations stay hot, as the engine's were just written.
std::vector<LinearGemmFigures> time_fp8_linears(const LlamaConfig& config, int64_t m);

// Bytes a decode step must read: every weight but the embedding table (one row a token), in the
// engine's format (fp8: the linear layers' e4m3 weights and per-channel float scales, the rest
// bf16), plus `kv_tokens` cached tokens' keys and values.
double decode_bytes_per_step(const LlamaConfig& c, int64_t batch, double kv_tokens,
                             WeightFormat weights = WeightFormat::bf16);
// FLOPs of a forward pass over a `tokens`-token prompt: 2 per weight per token, plus causal
// attention's QKᵀ and PV.
double prefill_flop(const LlamaConfig& c, int64_t tokens);

}  // namespace gpulab::llm
