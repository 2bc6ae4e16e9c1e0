// gpulab inspect: the tensors of a safetensors file or checkpoint folder, validated.
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/table.h"
#include "core/safetensors.h"

namespace gpulab::cli {

namespace {

using nlohmann::json;

struct InspectOptions {
  std::string path;
  bool json_output = false;
};

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int run_inspect(const InspectOptions& opt) {
  const core::Checkpoint ckpt(opt.path);
  if (opt.json_output) {
    json out = {{"path", opt.path}, {"tensors", json::array()}, {"shards", json::array()}};
    for (const auto& shard : ckpt.shards()) out["shards"].push_back(shard->path().filename().string());
    for (const auto& e : ckpt.tensors())
      out["tensors"].push_back({{"name", e.info->name}, {"dtype", core::dtype_safetensors_name(e.info->dtype)},
                                {"shape", e.info->shape}, {"bytes", e.info->bytes()},
                                {"shard", e.shard->path().filename().string()}});
    out["total"] = {{"tensors", ckpt.tensors().size()}, {"params", ckpt.total_params()},
                    {"bytes", ckpt.total_bytes()}, {"shards", ckpt.shards().size()}};
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  Table t({"tensor", "dtype", "shape", "bytes", "shard"});
  for (const auto& e : ckpt.tensors())
    t.add({e.info->name, std::string(core::dtype_safetensors_name(e.info->dtype)), shape_text(e.info->shape),
           std::to_string(e.info->bytes()), e.shard->path().filename().string()});
  t.print(std::cout);
  std::cout << "\n" << ckpt.tensors().size() << " tensors, " << ckpt.total_params() << " parameters ("
            << human_count(ckpt.total_params()) << "), " << ckpt.total_bytes() << " bytes ("
            << human_bytes(ckpt.total_bytes()) << ") in " << ckpt.shards().size() << " shard"
            << (ckpt.shards().size() == 1 ? "" : "s") << "\n";
  return 0;
}

}  // namespace

void add_inspect_command(CLI::App& app, Runner& run) {
  auto opt = std::make_shared<InspectOptions>();
  auto* sub = app.add_subcommand("inspect", "List and validate the tensors of a safetensors file or checkpoint folder");
  sub->add_option("path", opt->path, "A .safetensors file, a *.safetensors.index.json, or a folder holding either")
      ->required();
  sub->add_flag("--json", opt->json_output, "Print JSON instead of a table");
  sub->footer("Example:\n  gpulab inspect ~/models/Llama-2-7b-hf\n"
              "A malformed file (truncated, bad header, overlapping offsets, missing shard) is named with "
              "its problem, exit status 2.");
  sub->callback([&run, opt] { run = [opt] { return run_inspect(*opt); }; });
}

}  // namespace gpulab::cli
