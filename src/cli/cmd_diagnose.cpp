// gpulab diagnose: trace a CUDA program (or read a PyTorch-profiler trace) and say why it
// under-uses the GPU, ranked by estimated time lost.
#include <iostream>
#include <memory>

#include "cli/command.h"
#include "core/error.h"
#include "core/log.h"
#include "core/safetensors.h"
#include "trace/chrome_trace.h"
#include "trace/collect.h"
#include "trace/report.h"
#include "trace/rules.h"
#include "trace/window.h"

namespace gpulab::cli {

namespace {

namespace fs = std::filesystem;

struct DiagnoseOptions {
  std::string trace_file;
  std::string out_dir;
  double duration_s = 0;
  std::string json_file;
  std::string html_file;
  std::string capture_range;
  bool nvtx = false;
  std::vector<std::string> thresholds;
  std::vector<std::string> command;
};

int run_diagnose(const DiagnoseOptions& opt) {
  if (opt.trace_file.empty() == opt.command.empty())
    throw core::InputError("diagnose: give either --trace FILE or a program to run after --");
  trace::Thresholds thresholds;
  for (const auto& t : opt.thresholds) thresholds.set_from_text(t);

  int exit_code = core::kExitOk;
  trace::Trace t;
  fs::path out_dir = opt.out_dir;
  if (!opt.trace_file.empty()) {
    t = trace::read_chrome_trace(opt.trace_file);
  } else {
    if (out_dir.empty()) out_dir = "gpulab-diagnose";
    const bool nvtx = opt.nvtx || !opt.capture_range.empty();
    const trace::TracedRun run = trace::run_traced(opt.command, out_dir, opt.duration_s, nvtx);
    exit_code = run.exit_code;
    if (run.trace_files.empty()) {
      const std::string why = "diagnose: " + opt.command[0] + " wrote no trace (exit status " +
                              std::to_string(run.exit_code) +
                              "): it made no CUDA calls, was killed, or the tracer could not start (see above)";
      if (exit_code == 0) throw core::Error(why);
      core::log_error(why);
      return exit_code;  // the program's own failure matters more than the missing trace
    }
    t = trace::merge_traces(run.trace_files);
    t.source = opt.command[0];
    if (exit_code != 0) core::log_warn("diagnose: ", opt.command[0], " exited with status ", exit_code);
  }

  // The Perfetto trace keeps everything, also when the analysis looks at a window of it.
  if (!out_dir.empty()) {
    fs::create_directories(out_dir);
    core::write_file_atomic(out_dir / "trace.json", trace::chrome_trace_json(t));
  }
  if (!opt.capture_range.empty()) t = trace::clip_to_window(t, trace::capture_window(t, opt.capture_range));
  const trace::Report report = trace::analyze(t, thresholds);
  trace::print_report(std::cout, report);
  if (!out_dir.empty())
    std::cout << "Trace for Perfetto (ui.perfetto.dev) or chrome://tracing: " << (out_dir / "trace.json").string() << "\n";
  if (!opt.json_file.empty()) core::write_file_atomic(opt.json_file, trace::report_json(report).dump(2) + "\n");
  if (!opt.html_file.empty()) core::write_file_atomic(opt.html_file, trace::report_html(t, report));
  return exit_code;
}

}  // namespace

void add_diagnose_command(CLI::App& app, Runner& run) {
  auto opt = std::make_shared<DiagnoseOptions>();
  auto* sub = app.add_subcommand("diagnose", "Trace a CUDA program and say why it under-uses the GPU");
  sub->add_option("--trace", opt->trace_file, "Analyse a Chrome-trace JSON (PyTorch profiler / Kineto, or gpulab's)")
      ->check(CLI::ExistingFile);
  sub->add_option("--out", opt->out_dir, "Folder for the per-process traces and the merged trace.json "
                                         "(default ./gpulab-diagnose when running a program)");
  sub->add_option("--duration", opt->duration_s, "Stop tracing after this many seconds (the program keeps running)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--json", opt->json_file, "Write the findings and summary as JSON");
  sub->add_option("--html", opt->html_file, "Write an HTML report with utilization and per-stream timeline SVGs");
  sub->add_option("--capture-range", opt->capture_range,
                  "Analyse only from the start of the first NVTX range (or PyTorch record_function range) of "
                  "this name to the end of the last one, e.g. gpulab:train:timed; trace.json keeps everything");
  sub->add_flag("--nvtx", opt->nvtx,
               "Record the program's NVTX ranges (implied by --capture-range); costly: gpulab train ran 20 % "
               "slower with it on an H200");
  sub->add_option("--threshold", opt->thresholds, "Override a rule threshold: rule.key=value (see docs/diagnose.md)")
      ->allow_extra_args(false);  // one value per --threshold, so a program name is not taken for one
  sub->add_option("command", opt->command, "The program and its arguments, after --");
  std::string rules;
  for (const auto& id : trace::rule_ids()) rules += " " + id;
  sub->footer("Examples:\n  gpulab diagnose -- python train.py --epochs 1\n"
              "  gpulab diagnose --duration 30 --html report.html -- ./my_app\n"
              "  gpulab diagnose --trace profiler_trace.json --json findings.json\n"
              "  gpulab diagnose --capture-range gpulab:train:timed -- gpulab train --synthetic --steps 60\n"
              "Rules:" + rules + " (thresholds: docs/diagnose.md).\n"
              "When running a program, gpulab exits with the program's exit status.");
  sub->callback([&run, opt] { run = [opt] { return run_diagnose(*opt); }; });
}

}  // namespace gpulab::cli
