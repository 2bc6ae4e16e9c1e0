#include "llm/bench_llm.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

#include "blas/matmul.h"
#include "core/device.h"
#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "core/nvml.h"
#include "kernels/fp8_quant.h"
#include "llm/tensor_parallel.h"

namespace gpulab::llm {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const double rank = p / 100 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(rank), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (rank - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

// Median time in ms of `reps` runs of `fn` on `stream`, after `warmup` untimed ones.
template <class F>
double median_ms(cudaStream_t stream, int warmup, int reps, F&& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> times;
  core::EventTimer timer(stream);
  for (int i = 0; i < reps; ++i) {
    timer.start();
    fn();
    times.push_back(timer.stop());
  }
  return percentile(times, 50);
}

// Median ms of one call of `fn`, timed in samples of back-to-back calls lasting about 2 ms, so the
// host's few µs to enqueue a cuBLASLt call do not count (bench gemm's samples last 5 ms).
template <class F>
double median_call_ms(cudaStream_t stream, F&& fn) {
  const double one = median_ms(stream, 3, 3, fn);
  const int calls = static_cast<int>(std::ceil(2.0 / std::max(one, 2e-3)));  // at most 1000
  return median_ms(stream, 1, 15, [&] { for (int i = 0; i < calls; ++i) fn(); }) / calls;
}

// rows×cols e4m3 and one scale per row, quantized as the engine quantizes its weights and
// activations, from normal bf16 values (one block of rows repeated down the matrix: the values
// do not change the speed, and generating 470 M of them on the host would take seconds).
void fill_fp8_rows(std::byte* q, float* scales, int64_t rows, int64_t cols, std::mt19937_64& rng, cudaStream_t stream) {
  const int64_t block_rows = std::clamp<int64_t>((int64_t{1} << 20) / cols, 1, rows);
  std::vector<uint16_t> host(block_rows * cols);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (uint16_t& v : host) v = core::float_to_bf16_bits(normal(rng));
  core::DeviceBuffer<uint16_t> block(host.size());
  GPULAB_CHECK(cudaMemcpyAsync(block.get(), host.data(), host.size() * 2, cudaMemcpyHostToDevice, stream));
  for (int64_t r = 0; r < rows; r += block_rows)
    kernels::fp8_quantize(q + r * cols, scales + r, block.get(), core::DType::bf16, std::min(block_rows, rows - r), cols,
                          kernels::Fp8Granularity::row, nullptr, stream);
  GPULAB_CHECK(cudaStreamSynchronize(stream));  // before `host` and `block` go
}

}  // namespace

std::vector<LinearShape> fp8_linear_shapes(const LlamaConfig& c) {
  const int64_t h = c.hidden_size;
  return {{"qkv", c.q_dim() + 2 * c.kv_dim(), h, false},
          {"o_proj", h, c.q_dim(), true},
          {"gate_up", 2 * c.intermediate_size, h, false},
          {"down", h, c.intermediate_size, true}};
}

std::vector<LinearGemmFigures> time_fp8_linears(const LlamaConfig& config, int64_t m) {
  if (m < 1) throw core::InputError("bench llm: fp8 GEMMs need at least 1 row");
  core::Stream stream;
  blas::Blas heuristic, autotuned;
  constexpr int kAutotuneCandidates = 16;  // as bench gemm
  autotuned.set_autotune(kAutotuneCandidates);
  int device = 0, l2 = 0;
  GPULAB_CHECK(cudaGetDevice(&device));
  GPULAB_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  std::mt19937_64 rng(1);
  std::vector<LinearGemmFigures> out;
  for (const LinearShape& s : fp8_linear_shapes(config)) {
    const size_t w_bytes = static_cast<size_t>(s.n * s.k);
    const int sets = static_cast<int>(std::clamp<size_t>((2 * static_cast<size_t>(l2) + w_bytes - 1) / w_bytes, 1, 64));
    std::vector<core::DeviceBuffer<std::byte>> w;
    std::vector<core::DeviceBuffer<float>> w_scales;
    for (int i = 0; i < sets; ++i) {
      w.emplace_back(w_bytes);
      w_scales.emplace_back(s.n);
      fill_fp8_rows(w.back().get(), w_scales.back().get(), s.n, s.k, rng, stream);
    }
    core::DeviceBuffer<std::byte> x(m * s.k), y(m * s.n * 4);
    core::DeviceBuffer<float> x_scales(m);
    fill_fp8_rows(x.get(), x_scales.get(), m, s.k, rng, stream);
    GPULAB_CHECK(cudaMemsetAsync(y.get(), 0, y.bytes(), stream));

    LinearGemmFigures f{s, m};
    int next = 0;
    auto run = [&](blas::Blas& blas) {
      blas.matmul({m, s.n, s.k, false, true}, {core::DType::f8e4m3, core::DType::f8e4m3, f.output}, x.get(),
                  w[next].get(), y.get(), stream, 1.f, f.beta, {x_scales.get(), w_scales[next].get(), true});
      next = (next + 1) % sets;
    };
    if (s.into_residual) {  // as CudaEngine's probe: into the float residual if cuBLASLt takes it
      f.output = core::DType::f32;
      f.beta = 1.f;
      try {
        run(heuristic);
        stream.synchronize();
      } catch (const core::Error& e) {
        core::log_info("bench llm: fp8 ", s.name, " writes bf16 (the engine adds it with a kernel): ", e.what());
        f.output = core::DType::bf16;
        f.beta = 0.f;
      }
    }
    const double flop = 2.0 * static_cast<double>(m) * static_cast<double>(s.n) * static_cast<double>(s.k);
    f.ms = median_call_ms(stream, [&] { run(heuristic); });
    f.flop_per_s = flop / (f.ms * 1e-3);
    f.autotuned_flop_per_s = flop / (median_call_ms(stream, [&] { run(autotuned); }) * 1e-3);
    out.push_back(f);
  }
  return out;
}

double decode_bytes_per_step(const LlamaConfig& c, int64_t batch, double kv_tokens, WeightFormat weights) {
  double weight_bytes = 0;
  for (const WeightSpec& w : weight_specs(c)) {
    if (w.name == "model.embed_tokens.weight" && !c.tie_word_embeddings) continue;  // one row a token
    double elements = 1;
    for (int64_t d : w.shape) elements *= static_cast<double>(d);
    // fp8 linear layers: e4m3 weights and a float scale per output channel; lm_head and norms bf16.
    const bool fp8 = weights == WeightFormat::fp8 && is_linear_weight(w.name);
    weight_bytes += fp8 ? elements + 4.0 * static_cast<double>(w.shape[0]) : 2 * elements;
  }
  const double kv_bytes_per_token = 2.0 * c.num_layers * c.kv_dim() * 2;  // K and V, bf16
  return weight_bytes + static_cast<double>(batch * c.hidden_size * 2) + kv_tokens * kv_bytes_per_token;
}

double prefill_flop(const LlamaConfig& c, int64_t tokens) {
  const double t = static_cast<double>(tokens);
  const double linear = static_cast<double>(c.num_layers) * c.hidden_size *
                            (c.q_dim() + 2 * c.kv_dim() + c.q_dim() + 3 * c.intermediate_size) +
                        static_cast<double>(c.vocab_size) * c.hidden_size / t;  // lm_head: the last token only
  const double attention = 2.0 * 2.0 * c.num_layers * c.q_dim() * (t * (t + 1) / 2) / t;  // per token, causal
  return 2.0 * t * linear + t * attention;
}

Ceilings measure_ceilings() {
  Ceilings out;
  core::Stream stream;
  {
    constexpr size_t kBytes = size_t(1) << 30;
    core::DeviceBuffer<std::byte> a(kBytes), b(kBytes);
    GPULAB_CHECK(cudaMemsetAsync(a.get(), 1, kBytes, stream));
    const double ms = median_ms(stream, 3, 10, [&] {
      GPULAB_CHECK(cudaMemcpyAsync(b.get(), a.get(), kBytes, cudaMemcpyDeviceToDevice, stream));
    });
    out.copy_bytes_per_s = 2.0 * kBytes / (ms * 1e-3);
  }
  {
    constexpr int64_t n = 8192;
    core::DeviceBuffer<std::byte> a(n * n * 2), b(n * n * 2), c(n * n * 2);
    GPULAB_CHECK(cudaMemsetAsync(a.get(), 0x3C, a.bytes(), stream));  // bf16 0x3C3C: small and nonzero
    GPULAB_CHECK(cudaMemsetAsync(b.get(), 0x3C, b.bytes(), stream));
    blas::Blas blas;
    const double ms = median_ms(stream, 5, 20, [&] {
      blas.matmul({n, n, n, false, true}, {core::DType::bf16, core::DType::bf16, core::DType::bf16}, a.get(), b.get(),
                  c.get(), stream);
    });
    out.gemm_bf16_flop_per_s = 2.0 * n * n * n / (ms * 1e-3);
  }
  return out;
}

LlmBenchReport bench_llm(const WeightSource& weights, EngineSpec spec, const LlmBenchOptions& o) {
  if (o.input < 1 || o.output < 1 || o.batches.empty() || o.prefill < 0)
    throw core::InputError("bench llm: --input and --output must be at least 1, and --batch must list batch sizes");
  spec.device = "cuda";
  const LlamaConfig& c = weights.config();
  LlmBenchReport report;
  report.ceilings = measure_ceilings();
  if (spec.cuda.weights == WeightFormat::fp8 && o.prefill > 0)  // before the engines take the memory
    report.prefill_gemms = time_fp8_linears(spec.tp > 1 ? shard_config(c, shard_layout(c, {0, spec.tp})) : c, o.prefill);
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> token(1, static_cast<int32_t>(c.vocab_size - 1));
  int device = 0;
  GPULAB_CHECK(cudaGetDevice(&device));
  const std::string bus = core::pci_bus_id(device);

  for (const int64_t batch : o.batches) {
    if (batch < 1) throw core::InputError("bench llm: batch sizes must be at least 1");
    EngineSpec s = spec;
    s.cuda.max_batch = batch;
    s.cuda.max_seq_len = o.input + o.output;
    const std::unique_ptr<Engine> engine = make_engine(weights, s);
    std::vector<std::vector<int32_t>> prompts(batch, std::vector<int32_t>(o.input));
    for (auto& p : prompts) std::generate(p.begin(), p.end(), [&] { return token(rng); });
    std::vector<SeqId> seqs;
    for (int64_t i = 0; i < batch; ++i) {
      const std::optional<SeqId> id = engine->open(o.input + o.output);
      if (!id) throw core::InputError("bench llm: the KV cache has no room for batch " + std::to_string(batch));
      seqs.push_back(*id);
    }
    // Greedy, each step's tokens picked by the engine (on the GPU) and fed back as the next
    // chunks. GPULAB_GPU_GREEDY=0 picks them on the host from the logits instead (the Engine
    // default, what every step did before session 7), for an A/B.
    std::vector<int32_t> tokens(batch);
    std::vector<std::span<const int32_t>> next(batch);
    for (int64_t i = 0; i < batch; ++i) next[i] = std::span<const int32_t>(&tokens[i], 1);
    const bool on_host = core::env_switch("GPULAB_GPU_GREEDY") == false;
    const auto step = [&](std::span<const std::span<const int32_t>> in) {
      if (on_host) engine->Engine::step_greedy(seqs, in, tokens);
      else engine->step_greedy(seqs, in, tokens);  // reads this step's chunks before writing its tokens
    };

    DecodeFigures f;
    f.batch = batch;
    f.decode_gemm = s.tp == 1 ? decode_skinny_gemm(s.cuda, c) : DecodeSkinny::none;
    if (s.tp > 1) f.all_reduce = residual_wants_symmetric_memory(s.cuda) ? "symmetric" : "plain";
    std::vector<std::span<const int32_t>> chunks(prompts.begin(), prompts.end());
    auto t0 = Clock::now();
    step(chunks);
    f.ttft_ms = ms_since(t0);
    std::vector<double> steps;
    core::GpuSampler sampler(core::nvml_reader(bus), std::chrono::milliseconds(50));
    for (int64_t t = 1; t < o.output; ++t) {
      t0 = Clock::now();
      step(next);
      steps.push_back(ms_since(t0));
    }
    f.clocks = core::summarize_clocks(sampler.stop());
    f.power_limit_w = core::Nvml::get().power_limit_watts(bus);
    f.max_sm_clock_mhz = core::Nvml::get().max_sm_clock_mhz(bus);
    for (SeqId id : seqs) engine->close(id);
    double total_ms = f.ttft_ms;
    for (double ms : steps) total_ms += ms;
    f.step_ms_median = steps.empty() ? 0 : percentile(steps, 50);
    f.step_ms_p90 = steps.empty() ? 0 : percentile(steps, 90);
    f.decode_tokens_per_s = f.step_ms_median > 0 ? 1e3 * batch / f.step_ms_median : 0;
    f.end_to_end_tokens_per_s = 1e3 * static_cast<double>(batch * o.output) / total_ms;
    // Decode steps read input .. input + output - 2 cached tokens per sequence: the mean is taken.
    const double mean_kv = static_cast<double>(batch) * (static_cast<double>(o.input) + (o.output - 2) / 2.0 + 1);
    f.bytes_per_step = decode_bytes_per_step(c, batch, mean_kv, s.cuda.weights);
    f.floor_ms = 1e3 * f.bytes_per_step / report.ceilings.copy_bytes_per_s;
    f.fraction_of_floor = f.step_ms_median > 0 ? f.floor_ms / f.step_ms_median : 0;
    core::log_info("bench llm: batch ", batch, ": ", f.step_ms_median, " ms/step, ", f.decode_tokens_per_s,
                   " tokens/s, ", 100 * f.fraction_of_floor, "% of the floor (decode GEMMs: ",
                   to_string(f.decode_gemm), ")");
    report.decode.push_back(f);
  }

  if (o.prefill > 0) {
    EngineSpec s = spec;
    s.cuda.max_batch = 1;
    s.cuda.max_seq_len = o.prefill;
    s.cuda.max_step_tokens = std::max(s.cuda.max_step_tokens, o.prefill);
    const std::unique_ptr<Engine> engine = make_engine(weights, s);
    std::vector<int32_t> prompt(o.prefill);
    std::generate(prompt.begin(), prompt.end(), [&] { return token(rng); });
    std::vector<float> logits(c.vocab_size);
    std::vector<double> times;
    for (int rep = 0; rep < 4; ++rep) {  // the first makes the plans for this shape
      const std::optional<SeqId> id = engine->open(o.prefill);
      if (!id) throw core::InputError("bench llm: the KV cache has no room for a " + std::to_string(o.prefill) + "-token prompt");
      const SeqId seq = *id;
      const std::span<const int32_t> chunk(prompt);
      const auto t0 = Clock::now();
      engine->step(std::span(&seq, 1), std::span(&chunk, 1), logits);
      if (rep > 0) times.push_back(ms_since(t0));
      engine->close(seq);
    }
    PrefillFigures p;
    p.tokens = o.prefill;
    p.ms = percentile(times, 50);
    p.flop = prefill_flop(c, o.prefill);
    p.flop_per_s = p.flop / (p.ms * 1e-3);
    p.fraction_of_gemm = p.flop_per_s / report.ceilings.gemm_bf16_flop_per_s;
    report.prefill = p;
  }
  return report;
}

}  // namespace gpulab::llm
