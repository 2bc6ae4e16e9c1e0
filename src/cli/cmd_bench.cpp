// gpulab bench: the measured roofline of this GPU node, each figure beside its datasheet peak.
#include <iostream>
#include <memory>

#include "bench/suite.h"
#include "cli/command.h"
#include "core/error.h"

namespace gpulab::cli {

namespace {

struct BenchOptions {
  std::vector<std::string> suites;
  bench::Options options;
  bool list = false;
};

}  // namespace

void add_bench_command(CLI::App& app, Runner& run) {
  auto opt = std::make_shared<BenchOptions>();
  auto* sub = app.add_subcommand("bench", "Measured roofline: GEMM ladder, HBM, L2, PCIe, P2P, launch, UM, NCCL, power");
  sub->footer("Examples:\n  gpulab bench --list\n  gpulab bench llm --help                  # LLM decode/prefill against the floors\n  gpulab bench --quick --json quick.json   # a short pass of every suite\n"
              "  gpulab bench gemm memory                # two suites in full\n"
              "  gpulab bench gemm --only cublaslt_bf16,ladder4_mma_sync_bf16 --sizes 8192   # one comparison\n"
              "Exit status 3 when no CUDA device is visible; 1 when a suite failed (the others still run).");
  sub->add_option("suite", opt->suites, "Suites to run (default: all); see --list");
  sub->add_flag("--list", opt->list, "List the suites and exit");
  sub->add_flag("--quick", opt->options.quick, "A short pass: few sizes and repetitions");
  sub->add_option("--json", opt->options.json_path, "Write every figure as result JSON to this file");
  sub->add_option("--html", opt->options.html_path, "Write a self-contained HTML report (roofline, per-suite charts) to this file");
  sub->add_option("--only", opt->options.only, "gemm: run only these variants, comma-separated (row names without the size; unknown names list the valid ones)")
      ->delimiter(',')
      ->allow_extra_args(false);  // one value (comma-separated) per use, so a suite name after it stays a suite
  sub->add_option("--sizes", opt->options.sizes, "gemm: square sizes m = n = k, comma-separated, instead of 512..16384; power: its GEMM's size "
                 "(the first), instead of 8192")
      ->delimiter(',')
      ->allow_extra_args(false);
  sub->add_option("--device", opt->options.device, "CUDA device index for single-GPU suites")->capture_default_str();
  sub->add_flag("--allow-oversubscription", opt->options.allow_oversubscription,
                "um: also measure managed memory larger than the GPU's memory (slow; pages thrash)");
  add_bench_llm_subcommand(*sub, run);
  sub->callback([&run, opt, sub] {
    if (sub->got_subcommand("llm")) return;  // `bench llm` set its own work
    run = [opt] {
      if (opt->list) {
        bench::print_suite_list(std::cout);
        std::cout << "llm       LLaMA decode and prefill against the floors (its own options: gpulab bench llm --help)\n";
        return int(core::kExitOk);
      }
      return bench::run_bench(opt->suites, opt->options, std::cout);
    };
  });
}

}  // namespace gpulab::cli
