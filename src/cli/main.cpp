// gpulab: one program for what a GPU node delivers, how fast AI workloads run on it, and why
// a job does not reach that. Each command lives in its own file in this folder.
#include <cstdio>
#include <exception>
#include <iostream>

#include "cli/command.h"
#include "core/error.h"
#include "core/log.h"
#include "core/version.h"

int main(int argc, char** argv) {
  using namespace gpulab;
  CLI::App app{"gpulab — measure a GPU node, run the standard AI workloads on it, and find why "
               "your own job does not reach its speed.\n\nRun `gpulab COMMAND --help` for a command's "
               "options and an example.",
               "gpulab"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(core::kVersion) + " (" + core::kGitRevision + ")");
  bool verbose = false, quiet = false;
  app.add_flag("-v,--verbose", verbose, "Print debug messages");
  app.add_flag("-q,--quiet", quiet, "Print only errors");
  app.parse_complete_callback([&] {
    if (verbose) core::set_log_level(core::LogLevel::debug);
    if (quiet) core::set_log_level(core::LogLevel::error);
  });

  cli::Runner run;
  cli::add_info_command(app, run);
  cli::add_inspect_command(app, run);
  cli::add_planned_command(app, run, "bench", "Measured roofline: GEMM ladder, HBM, L2, PCIe, P2P, launch, UM, NCCL");
  cli::add_train_command(app, run);
  cli::add_dataset_command(app, run);
  cli::add_planned_command(app, run, "generate", "LLaMA-family text generation from a Hugging Face checkpoint");
  cli::add_planned_command(app, run, "serve", "OpenAI-compatible HTTP server with streaming");
  cli::add_planned_command(app, run, "tokenize", "Encode/decode text with a tokenizer.json");
  cli::add_planned_command(app, run, "logits", "Print or save a model's logits for a prompt");
  cli::add_planned_command(app, run, "diagnose", "Trace a CUDA program and say why it under-uses the GPU");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? core::kExitOk : core::kExitBadInput;
  }
  try {
    return run ? run() : core::kExitOk;
  } catch (const core::Error& e) {
    std::fprintf(stderr, "gpulab: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpulab: internal error: %s\n", e.what());
    return core::kExitFailure;
  }
}
