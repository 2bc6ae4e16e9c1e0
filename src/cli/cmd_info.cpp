// gpulab info: this machine's GPUs and software stack, beside a datasheet table of accelerators.
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/table.h"
#include "core/data_files.h"
#include "core/device.h"
#include "core/error.h"

namespace gpulab::cli {

namespace {

using nlohmann::json;

struct InfoOptions {
  bool json_output = false;
};

json load_accelerators() {
  const auto path = core::data_file("accelerators.json");
  std::ifstream in(path);
  json j = json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.contains("accelerators")) throw core::Error(path.string() + ": not a valid accelerator table");
  return j["accelerators"];
}

// The accelerator table row whose "match" strings appear in the device name, or -1.
int matching_row(const json& accelerators, const std::string& device_name) {
  for (size_t i = 0; i < accelerators.size(); ++i)
    for (const auto& m : accelerators[i]["match"])
      if (device_name.find(m.get<std::string>()) != std::string::npos) return static_cast<int>(i);
  return -1;
}

std::string cell(const json& v, int precision = 0) {
  if (v.is_null()) return "-";
  if (v.is_string()) return v.get<std::string>();
  return format_double(v.get<double>(), precision);
}

void print_text(const core::HostInfo& host, const core::SoftwareVersions& versions,
                const std::vector<core::DeviceInfo>& devices, const json& accelerators, int marked) {
  std::cout << "Host      " << host.hostname << " | " << host.os << " | " << host.cpu_model << " | "
            << host.cpu_cores << " cores | " << human_bytes(host.memory_total) << " RAM\n";
  std::cout << "Software  driver " << (versions.driver.empty() ? "none" : versions.driver)
            << " | CUDA driver API " << (versions.cuda_driver ? core::format_cuda_version(versions.cuda_driver) : "none")
            << " | runtime " << core::format_cuda_version(versions.cuda_runtime)
            << " | cuBLAS " << core::format_library_version(versions.cublas)
            << " | cuDNN " << core::format_library_version(versions.cudnn)
            << " | NCCL " << core::format_library_version(versions.nccl) << "\n\n";

  if (!devices.empty()) {
    Table t({"GPU", "name", "cc", "SMs", "memory", "free", "L2", "SM clock (max)", "mem clock (max)",
             "PCIe", "NVLink", "MIG", "power limit"});
    for (const auto& d : devices) {
      auto clock = [](std::optional<unsigned> now, int max) {
        return (now ? std::to_string(*now) : std::string("?")) + " (" + std::to_string(max) + ") MHz";
      };
      const auto active = std::count(d.nvlink_active.begin(), d.nvlink_active.end(), true);
      std::string mig = !d.mig_enabled ? "unknown" : *d.mig_enabled ? "enabled, " + std::to_string(d.mig_instances.size()) + " instances" : "disabled";
      t.add({std::to_string(d.index), d.name, std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor),
             std::to_string(d.sm_count), human_gib(d.memory_total), human_gib(d.memory_free),
             human_bytes(d.l2_bytes), clock(d.sm_clock_mhz, d.max_sm_clock_mhz),
             clock(d.mem_clock_mhz, d.max_mem_clock_mhz),
             d.pcie_generation ? "Gen" + std::to_string(*d.pcie_generation) + " x" + std::to_string(d.pcie_width.value_or(0)) : "?",
             d.nvlink_active.empty() ? "none" : std::to_string(active) + "/" + std::to_string(d.nvlink_active.size()) + " links",
             mig, d.power_limit_watts ? format_double(*d.power_limit_watts, 0) + " W" : "?"});
    }
    t.print(std::cout);
    for (const auto& d : devices)
      for (const auto& m : d.mig_instances)
        std::cout << "  GPU " << d.index << " MIG " << m.index << ": " << m.name << " " << m.uuid << " "
                  << human_gib(m.memory_total) << "\n";
    std::cout << "\n";
  }

  std::cout << "Accelerators (datasheet peaks, dense; * = this machine's GPU)\n";
  Table t({"", "accelerator", "FP16 TF", "BF16 TF", "TF32 TF", "FP8 TF", "FP32 TF", "memory GB", "TB/s",
           "interconnect", "TDP W"});
  for (size_t i = 0; i < accelerators.size(); ++i) {
    const auto& a = accelerators[i];
    t.add({static_cast<int>(i) == marked ? "*" : "", a["name"], cell(a["fp16_tflops"]), cell(a["bf16_tflops"]),
           cell(a["tf32_tflops"]), cell(a["fp8_tflops"]), cell(a["fp32_tflops"], 1), cell(a["memory_gb"]),
           cell(a["memory_tbps"], 2), cell(a["interconnect"]), cell(a["tdp_watts"])});
  }
  t.print(std::cout);
}

int run_info(const InfoOptions& opt) {
  const auto host = core::query_host();
  const auto versions = core::query_versions();
  const auto accelerators = load_accelerators();
  const std::string why = core::why_no_device();
  std::vector<core::DeviceInfo> devices;
  if (why.empty()) devices = core::query_devices();
  const int marked = devices.empty() ? -1 : matching_row(accelerators, devices[0].name);

  if (opt.json_output) {
    json out = {{"host", core::to_json(host)}, {"software", core::to_json(versions)},
                {"devices", json::array()}, {"accelerators", accelerators}};
    for (const auto& d : devices) out["devices"].push_back(core::to_json(d));
    out["this_accelerator"] = marked >= 0 ? accelerators[marked]["name"] : json(nullptr);
    if (!why.empty()) out["no_device_reason"] = why;
    std::cout << out.dump(2) << "\n";
  } else {
    print_text(host, versions, devices, accelerators, marked);
  }
  if (!why.empty()) {
    std::cerr << "gpulab: " << why << "\n";
    return core::kExitNoDevice;
  }
  return core::kExitOk;
}

}  // namespace

void add_info_command(CLI::App& app, Runner& run) {
  auto opt = std::make_shared<InfoOptions>();
  auto* sub = app.add_subcommand("info", "GPUs, clocks, memory, MIG, NVLink, software versions, and a datasheet table of accelerators");
  sub->footer("Example:\n  gpulab info          # tables for people\n  gpulab info --json   # the same for machines\n"
              "Exit status 3 when no CUDA device is visible (the host facts are still printed).");
  sub->add_flag("--json", opt->json_output, "Print JSON instead of tables");
  sub->callback([&run, opt] { run = [opt] { return run_info(*opt); }; });
}

}  // namespace gpulab::cli
