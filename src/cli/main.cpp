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
  cli::add_bench_command(app, run);
  cli::add_train_command(app, run);
  cli::add_generate_command(app, run);
  cli::add_serve_command(app, run);
  cli::add_logits_command(app, run);
  cli::add_tokenize_command(app, run);
  cli::add_diagnose_command(app, run);
  cli::add_dataset_command(app, run);

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
