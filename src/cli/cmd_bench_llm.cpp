// gpulab bench llm: decode and prefill speed of the CUDA engine beside the floors this GPU sets
// (weights + KV bytes over the measured copy bandwidth; cuBLASLt's bf16 GEMM rate), and with
// --weights fp8 the engine's fp8 GEMMs at prefill rows beside bench gemm's own fp8 figure.
#include <iostream>
#include <memory>
#include <optional>

#include "bench/suite.h"
#include "cli/command.h"
#include "cli/model_options.h"
#include "cli/table.h"
#include "core/device.h"
#include "core/error.h"
#include "core/result.h"
#include "llm/bench_llm.h"

namespace gpulab::cli {

namespace {

struct BenchLlmOptions {
  ModelOptions model;
  llm::LlmBenchOptions bench;
  std::string json_path;
};

// What the fp8 prefill GEMMs are measured against: bench gemm's own row, run in this process.
constexpr const char* kFp8GemmVariant = "cublaslt_fp8e4m3_rowwise";
constexpr int64_t kFp8GemmSize = 8192;

std::string prefill_gemm_name(const llm::LinearGemmFigures& f) {
  return "prefill_gemm_fp8_" + f.shape.name + "_m" + std::to_string(f.m);
}

void add_results(core::ResultLog& log, const llm::LlmBenchReport& r, const llm::LlmBenchOptions& o,
                 const std::string& model, const std::optional<nlohmann::json>& fp8_gemm, int tp) {
  const nlohmann::json base = {{"model", model}, {"input", o.input}, {"output", o.output}};
  log.add({"llm", "ceiling_copy", "bandwidth", r.ceilings.copy_bytes_per_s / 1e9, "GB/s", std::nullopt,
           {{"what", "device-to-device cudaMemcpy, read + write bytes, 1 GiB"}}});
  log.add({"llm", "ceiling_cublaslt_bf16_8192", "throughput", r.ceilings.gemm_bf16_flop_per_s / 1e12, "TFLOP/s",
           std::nullopt, {{"what", "cuBLASLt bf16 GEMM 8192^3, bf16 out"}}});
  for (const llm::DecodeFigures& f : r.decode) {
    nlohmann::json p = base;
    p.update({{"batch", f.batch}, {"ttft_ms", f.ttft_ms}, {"step_ms_median", f.step_ms_median},
              {"step_ms_p90", f.step_ms_p90}, {"end_to_end_tokens_per_s", f.end_to_end_tokens_per_s},
              {"bytes_per_step", f.bytes_per_step}, {"floor_ms", f.floor_ms},
              {"decode_gemm", to_string(f.decode_gemm)}, {"all_reduce", f.all_reduce}});
    if (f.clocks)
      p.update({{"clock_samples", f.clocks->samples}, {"sm_clock_mhz_median", f.clocks->sm_clock_mhz_median},
                {"sm_clock_mhz_min", f.clocks->sm_clock_mhz_min}, {"sm_clock_mhz_max", f.clocks->sm_clock_mhz_max},
                {"power_cap_share", f.clocks->power_cap_share}, {"thermal_share", f.clocks->thermal_share},
                {"power_brake_share", f.clocks->power_brake_share}});
    if (f.clocks && f.clocks->power_w_median) p["power_w_median"] = *f.clocks->power_w_median;
    if (f.power_limit_w) p["power_limit_w"] = *f.power_limit_w;
    if (f.max_sm_clock_mhz) p["max_sm_clock_mhz"] = *f.max_sm_clock_mhz;
    const std::string name = "decode_b" + std::to_string(f.batch);
    // The peak is the floor's token rate, so `fraction` is the fraction of the floor.
    log.add({"llm", name, "tokens_per_second", f.decode_tokens_per_s, "tokens/s", 1e3 * f.batch / f.floor_ms, p});
    log.add({"llm", name + "_ttft", "latency", f.ttft_ms, "ms", std::nullopt, p});
  }
  if (r.prefill) {
    const llm::PrefillFigures& f = *r.prefill;
    nlohmann::json p = base;
    p.update({{"tokens", f.tokens}, {"ms", f.ms}, {"flop", f.flop}});
    log.add({"llm", "prefill_" + std::to_string(f.tokens), "throughput", f.flop_per_s / 1e12, "TFLOP/s",
             r.ceilings.gemm_bf16_flop_per_s / 1e12, p});
  }
  if (!fp8_gemm) return;
  const double ceiling = (*fp8_gemm)["value"].get<double>();
  nlohmann::json suite_params = (*fp8_gemm)["params"];
  suite_params["what"] = "bench gemm's " + (*fp8_gemm)["name"].get<std::string>() + ", measured in this run";
  log.add({"llm", "ceiling_" + (*fp8_gemm)["name"].get<std::string>(), "throughput", ceiling, "TFLOP/s", std::nullopt,
           suite_params});
  for (const llm::LinearGemmFigures& f : r.prefill_gemms) {
    nlohmann::json p = {{"model", model}, {"layer", f.shape.name}, {"m", f.m}, {"n", f.shape.n}, {"k", f.shape.k},
                        {"tp", tp}, {"input", "fp8e4m3"}, {"output", std::string(core::dtype_name(f.output))}, {"beta", f.beta},
                        {"scales", "per-token activations x per-channel weights (cuBLASLt outer vector)"},
                        {"median_ms", f.ms}, {"algorithm", "cuBLASLt heuristic's first choice, as the engine's prefill"},
                        {"autotuned_tflops", f.autotuned_flop_per_s / 1e12},
                        {"autotuned_fraction", f.autotuned_flop_per_s / 1e12 / ceiling},
                        {"ceiling", (*fp8_gemm)["name"]}};
    // The peak is the suite's fp8 figure, so `fraction` is the fraction of it.
    log.add({"llm", prefill_gemm_name(f), "throughput", f.flop_per_s / 1e12, "TFLOP/s", ceiling, p});
  }
}

// "clocks over batch 16's decode: SM 1620 MHz median (1455-1785; highest 1980), board 696 W of
// 700 W; power cap in 98 % of readings". Words first, so scripts reading the table's rows by
// their leading batch number pass over it.
std::string describe_clocks(const llm::DecodeFigures& f) {
  const core::ClockSummary& c = *f.clocks;
  std::string s = "clocks over batch " + std::to_string(f.batch) + "'s decode: SM " +
                  format_double(c.sm_clock_mhz_median, 0) + " MHz median (" + format_double(c.sm_clock_mhz_min, 0) +
                  "-" + format_double(c.sm_clock_mhz_max, 0) +
                  (f.max_sm_clock_mhz ? "; highest " + std::to_string(*f.max_sm_clock_mhz) : std::string()) + ")";
  if (c.power_w_median)
    s += ", board " + format_double(*c.power_w_median, 0) + " W" +
         (f.power_limit_w ? " of " + format_double(*f.power_limit_w, 0) + " W" : std::string());
  const auto share = [&](const char* what, double v) {
    if (v > 0) s += std::string("; ") + what + " in " + format_double(100 * v, 0) + " % of readings";
  };
  share("power cap", c.power_cap_share);
  share("thermal slowdown", c.thermal_share);
  share("power brake", c.power_brake_share);
  return s;
}

void print_report(std::ostream& out, const llm::LlmBenchReport& r, const llm::LlmBenchOptions& o,
                  const std::optional<nlohmann::json>& fp8_gemm) {
  out << "ceilings: copy " << format_double(r.ceilings.copy_bytes_per_s / 1e12, 2) << " TB/s, cuBLASLt bf16 "
      << format_double(r.ceilings.gemm_bf16_flop_per_s / 1e12, 1) << " TFLOP/s";
  if (fp8_gemm)
    out << ", " << (*fp8_gemm)["name"].get<std::string>() << " " << format_double((*fp8_gemm)["value"].get<double>(), 1)
        << " TFLOP/s";
  out << "\n\n";
  Table t({"batch", "in/out", "TTFT ms", "ms/step", "p90 ms", "decode tok/s", "end-to-end tok/s", "floor ms", "of floor"});
  for (const llm::DecodeFigures& f : r.decode)
    t.add({std::to_string(f.batch), std::to_string(o.input) + "/" + std::to_string(o.output),
           format_double(f.ttft_ms, 1), format_double(f.step_ms_median, 3), format_double(f.step_ms_p90, 3),
           format_double(f.decode_tokens_per_s, 1), format_double(f.end_to_end_tokens_per_s, 1),
           format_double(f.floor_ms, 3), format_double(100 * f.fraction_of_floor, 1) + "%"});
  t.print(out);
  for (const llm::DecodeFigures& f : r.decode)
    if (f.clocks) out << describe_clocks(f) << "\n";
  if (r.prefill)
    out << "\nprefill of " << r.prefill->tokens << " tokens: " << format_double(r.prefill->ms, 2) << " ms, "
        << format_double(r.prefill->flop_per_s / 1e12, 1) << " TFLOP/s = "
        << format_double(100 * r.prefill->fraction_of_gemm, 1) << "% of cuBLASLt bf16\n";
  if (!fp8_gemm || r.prefill_gemms.empty()) return;
  const double ceiling = (*fp8_gemm)["value"].get<double>();
  out << "\nfp8 linear layers at " << r.prefill_gemms.front().m << " rows, the engine's cuBLASLt calls, against "
      << (*fp8_gemm)["name"].get<std::string>() << " (lm_head stays bf16):\n";
  Table gemms({"layer", "m", "n", "k", "out", "ms", "TFLOP/s", "of fp8", "autotuned TFLOP/s", "of fp8"});
  for (const llm::LinearGemmFigures& f : r.prefill_gemms) {
    const double tflops = f.flop_per_s / 1e12, tuned = f.autotuned_flop_per_s / 1e12;
    gemms.add({f.shape.name, std::to_string(f.m), std::to_string(f.shape.n), std::to_string(f.shape.k),
               std::string(core::dtype_name(f.output)) + (f.beta != 0 ? " +=" : ""), format_double(f.ms, 3),
               format_double(tflops, 1), format_double(100 * tflops / ceiling, 1) + "%", format_double(tuned, 1),
               format_double(100 * tuned / ceiling, 1) + "%"});
  }
  gemms.print(out);
}

}  // namespace

void add_bench_llm_subcommand(CLI::App& bench, Runner& run) {
  auto opt = std::make_shared<BenchLlmOptions>();
  opt->model.engine.device = "cuda";
  auto* sub = bench.add_subcommand("llm", "LLaMA decode/prefill speed against the floors this GPU sets");
  sub->footer(
      "Decode reads every weight and the cached keys/values once per step: the floor is those\n"
      "bytes over the copy bandwidth measured in the same run. Prefill is measured against\n"
      "cuBLASLt's bf16 GEMM rate, also measured here. With --weights fp8, each fp8 linear layer's\n"
      "GEMM at --prefill rows is timed alone, beside bench gemm's cublaslt_fp8e4m3_rowwise 8192³.\n\n"
      "Examples:\n"
      "  gpulab bench llm --config llama2-7b --dummy-weights --batch 1,16 --input 128 --output 128\n"
      "  gpulab bench llm --model ./Llama-2-7b-hf --batch 1,8,32 --prefill 0 --json llm.json");
  add_model_options(*sub, opt->model);
  sub->add_option("--batch", opt->bench.batches, "Batch sizes to run, comma-separated")->delimiter(',')->capture_default_str();
  sub->add_option("--input", opt->bench.input, "Prompt tokens per sequence")->capture_default_str();
  sub->add_option("--output", opt->bench.output, "Generated tokens per sequence")->capture_default_str();
  sub->add_option("--prefill", opt->bench.prefill, "Also time one prompt of this many tokens (0: skip)")
      ->capture_default_str();
  sub->add_option("--json", opt->json_path, "Write the figures as result JSON to this file");
  sub->callback([&run, opt] {
    run = [opt] {
      core::require_devices();
      const llm::WeightSource weights = load_weights(opt->model);
      std::optional<nlohmann::json> fp8_gemm;  // measured first, while the memory is free
      if (opt->model.engine.cuda.weights == llm::WeightFormat::fp8 && opt->bench.prefill > 0)
        fp8_gemm = bench::measure_gemm_variant(kFp8GemmVariant, kFp8GemmSize);
      const llm::LlmBenchReport report = llm::bench_llm(weights, opt->model.engine, opt->bench);
      print_report(std::cout, report, opt->bench, fp8_gemm);
      if (!opt->json_path.empty()) {
        core::ResultLog log(core::stamp_gpu(0));
        add_results(log, report, opt->bench, opt->model.dummy_weights ? opt->model.config + " (random weights)" : opt->model.model,
                    fp8_gemm, opt->model.engine.tp);
        log.write(opt->json_path);
        std::cout << "wrote " << log.results().size() << " results to " << opt->json_path << "\n";
      }
      return int(core::kExitOk);
    };
  });
}

}  // namespace gpulab::cli
