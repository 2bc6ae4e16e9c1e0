// Every gpulab command registers itself on the CLI11 app here. When the user picks it, its
// callback stores the work in `run`; main() runs it inside one error handler.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

namespace gpulab::cli {

using Runner = std::function<int()>;

void add_info_command(CLI::App& app, Runner& run);
void add_inspect_command(CLI::App& app, Runner& run);
void add_bench_command(CLI::App& app, Runner& run);
void add_bench_llm_subcommand(CLI::App& bench, Runner& run);  // `bench llm`, from add_bench_command
void add_logits_command(CLI::App& app, Runner& run);
void add_generate_command(CLI::App& app, Runner& run);
void add_tokenize_command(CLI::App& app, Runner& run);
void add_serve_command(CLI::App& app, Runner& run);
void add_diagnose_command(CLI::App& app, Runner& run);
void add_dataset_command(CLI::App& app, Runner& run);
void add_train_command(CLI::App& app, Runner& run);

// A command that is designed but not built yet: listed in --help, exits 2 saying so.
void add_planned_command(CLI::App& app, Runner& run, const std::string& name,
                         const std::string& summary);

}  // namespace gpulab::cli
