#include "bench/suite.h"

#include <algorithm>
#include <cstdlib>
#include <iomanip>

#include "bench/html_report.h"
#include "core/error.h"
#include "core/log.h"
#include "core/nvml.h"
#include "core/safetensors.h"

namespace gpulab::bench {

Context::Context(Options options, core::DeviceInfo device, Datasheet datasheet, std::ostream& out)
    : options_(std::move(options)), device_(std::move(device)), datasheet_(std::move(datasheet)),
      out_(out), log_(core::stamp_gpu(options_.device)) {}

std::optional<double> Context::ceiling(const std::string& key) const {
  const auto it = ceilings_.find(key);
  if (it == ceilings_.end()) return std::nullopt;
  return it->second;
}

void Context::add(Row row) {
  auto& nvml = core::Nvml::get();
  if (auto sm = nvml.sm_clock_mhz(device_.pci_bus_id)) row.result.params["sm_clock_mhz"] = *sm;
  if (auto mem = nvml.mem_clock_mhz(device_.pci_bus_id)) row.result.params["mem_clock_mhz"] = *mem;
  rows_.push_back(std::move(row));
}

bool Context::attempt(const std::string& what, const std::function<void()>& fn) {
  try {
    fn();
    return true;
  } catch (const std::exception& e) {
    fail(what + ": " + e.what());
    return false;
  }
}

void Context::finish(const std::string& title) {
  render_table(out_, title, rows_, notes_);
  out_.flush();
  for (const auto& row : rows_) log_.add(row.result);
  rows_.clear();
  notes_.clear();
}

const std::vector<Suite>& suites() {
  static const std::vector<Suite> kSuites = {
      {"memory", "HBM copy (copy engine, SM kernel), read-only, write-only, L2 bandwidth, pointer-chase latency", run_memory_suite},
      {"transfer", "host<->device bandwidth: H2D, D2H, both at once; pinned vs pageable; 4 KB..1 GB", run_transfer_suite},
      {"launch", "empty-kernel launch cost, launch+synchronize round trip, per-node cost in a CUDA graph", run_launch_suite},
      {"gemm", "GEMM ladder (naive .. wgmma) and cuBLASLt fp32/tf32/fp16/bf16/fp8, 512..16384", run_gemm_suite},
      {"decode", "LLaMA-2-7B decode GEMMs at 1-16 rows: skinny_gemm (GEMV, tensor cores) vs cuBLASLt; decode attention",
       run_decode_suite},
      {"um", "managed memory: on-demand migration vs prefetch, host access after device", run_um_suite},
      {"p2p", "every GPU pair: peer access, copy-engine and SM bandwidth one way and both, latency", run_p2p_suite},
      {"nccl", "all-reduce, all-gather, reduce-scatter, broadcast over all GPUs: algbw, busbw, #wrong", run_nccl_suite},
      {"power", "NVML power during a bf16 GEMM: TFLOP/s per watt", run_power_suite},
  };
  return kSuites;
}

std::vector<const Suite*> select_suites(const std::vector<std::string>& names) {
  std::vector<const Suite*> out;
  for (const auto& n : names)
    if (std::none_of(suites().begin(), suites().end(), [&](const Suite& s) { return s.name == n; }))
      throw core::InputError("unknown bench suite '" + n + "'; `gpulab bench --list` shows them");
  for (const auto& s : suites())
    if (names.empty() || std::find(names.begin(), names.end(), s.name) != names.end()) out.push_back(&s);
  return out;
}

void print_suite_list(std::ostream& out) {
  for (const auto& s : suites()) out << std::left << std::setw(10) << s.name << s.summary << "\n";
}

int run_bench(const std::vector<std::string>& names, const Options& options, std::ostream& out) {
  const auto selected = select_suites(names);  // a bad name is a usage error even without a GPU
  check_gemm_options(options);
  const int count = core::require_devices();
  if (options.device < 0 || options.device >= count)
    throw core::InputError("--device " + std::to_string(options.device) + " does not exist (" +
                           std::to_string(count) + " visible)");
  GPULAB_CHECK(cudaSetDevice(options.device));
  auto device = core::query_device(options.device);
  Context ctx(options, device, load_datasheet(device.name), out);

  out << "GPU " << device.index << ": " << device.name << ", " << device.sm_count << " SMs, "
      << (ctx.datasheet().name.empty() ? "not in the datasheet table" : "datasheet row " + ctx.datasheet().name);
  if (device.sm_clock_mhz) out << ", SM clock " << *device.sm_clock_mhz << " MHz now";
  out << (options.quick ? ", quick pass" : "") << "\n";
  if (device.mig_enabled.value_or(false))
    out << "MIG is on (" << device.mig_instances.size()
        << " instances): figures are for the slice this process sees, not the whole GPU\n";
  out << "\n";

  for (const Suite* s : selected) {
    try {
      s->run(ctx);
    } catch (const core::Error& e) {
      // One suite failing (a missing library, an unsupported feature) does not lose the others.
      ctx.fail(e.what());
      ctx.finish(s->name);
    }
  }
  if (!options.json_path.empty()) {
    ctx.log().write(options.json_path);
    out << "wrote " << ctx.log().results().size() << " results to " << options.json_path << "\n";
  }
  if (!options.html_path.empty()) {
    core::write_file_atomic(options.html_path, render_html(ctx.log().results(), "gpulab bench"));
    out << "wrote the report to " << options.html_path << "\n";
  }
  return ctx.failed() ? core::kExitFailure : core::kExitOk;
}

}  // namespace gpulab::bench
