// The bench suites: a registry (list, select by name), the context a suite runs in, and the entry
// point `gpulab bench` calls.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "bench/report.h"
#include "core/device.h"
#include "core/result.h"

namespace gpulab::bench {

struct Options {
  bool quick = false;                   // a short pass: few sizes, few repetitions
  bool allow_oversubscription = false;  // um: managed memory beyond the device's memory
  int device = 0;
  std::string json_path;                // write the results here when not empty
  std::string html_path;                // write an HTML report (roofline, charts) here when not empty
  std::vector<std::string> only;         // gemm: run only these variants (all when empty)
  std::vector<int64_t> sizes;            // gemm: square sizes instead of the suite's list; power: the first
};

// What a suite runs with, and where its rows go.
class Context {
 public:
  Context(Options options, core::DeviceInfo device, Datasheet datasheet, std::ostream& out);

  const Options& options() const { return options_; }
  const core::DeviceInfo& device() const { return device_; }
  const Datasheet& datasheet() const { return datasheet_; }
  bool quick() const { return options_.quick; }

  // Measured ceilings by key ("hbm_copy" GB/s, "gemm_bf16_8192" TFLOP/s), for later rows.
  void set_ceiling(const std::string& key, double value) { ceilings_[key] = value; }
  std::optional<double> ceiling(const std::string& key) const;

  // A suite adds rows and notes, then finish() prints its table and logs its results.
  // Adds a row, stamping the SM and memory clocks of the moment (clocks move under load; the
  // run's GPU stamp holds only those at the start).
  void add(Row row);
  void note(std::string text) { notes_.push_back(std::move(text)); }
  // A check inside a suite failed (a wrong GEMM result, NCCL #wrong > 0): noted, and the run
  // exits 1 at the end.
  void fail(const std::string& text) {
    notes_.push_back("FAILED: " + text);
    failed_ = true;
  }
  bool failed() const { return failed_; }
  // Runs one measurement; if it throws, records the failure as fail() does ("what: message")
  // and returns false, so the rest of the suite still runs.
  bool attempt(const std::string& what, const std::function<void()>& fn);
  void finish(const std::string& title);

  const core::ResultLog& log() const { return log_; }

 private:
  Options options_;
  core::DeviceInfo device_;
  Datasheet datasheet_;
  std::ostream& out_;
  std::map<std::string, double> ceilings_;
  std::vector<Row> rows_;
  std::vector<std::string> notes_;
  bool failed_ = false;
  core::ResultLog log_;
};

struct Suite {
  std::string name;
  std::string summary;
  std::function<void(Context&)> run;
};

// Every suite in the order a full run measures them (memory first: its copy is the bandwidth
// ceiling the others are shown against).
const std::vector<Suite>& suites();
// The suites named (all when `names` is empty), in registry order; InputError for an unknown name.
std::vector<const Suite*> select_suites(const std::vector<std::string>& names);
// "name  summary" lines for --list.
void print_suite_list(std::ostream& out);

// InputError when --only names a gemm variant that does not exist (the message lists them) or
// --sizes holds a size outside 1..2^31-1; run_bench checks this before looking for a device.
void check_gemm_options(const Options& options);

// One gemm variant at n³ on the current device, measured exactly as `gpulab bench gemm --only
// VARIANT --sizes N` measures it (verified, autotuned, inputs rotated past the L2): its result
// row as that run writes it. For other commands that show a figure beside the suite's own
// (bench llm's fp8 prefill GEMMs). InputError for an unknown variant; core::Error when it fails
// its verification or does not run.
nlohmann::json measure_gemm_variant(const std::string& variant, int64_t n);

// Runs the selected suites on the device; NoDeviceError (exit 3) without one.
int run_bench(const std::vector<std::string>& names, const Options& options, std::ostream& out);

// The suites, one file each.
void run_memory_suite(Context& ctx);
void run_transfer_suite(Context& ctx);
void run_launch_suite(Context& ctx);
void run_gemm_suite(Context& ctx);
void run_decode_suite(Context& ctx);
void run_um_suite(Context& ctx);
void run_p2p_suite(Context& ctx);
void run_nccl_suite(Context& ctx);
void run_power_suite(Context& ctx);

}  // namespace gpulab::bench
