// A sharded checkpoint's `model.safetensors.index.json` of arbitrary bytes beside the four real
// shards of the tiny fixture: names resolve only to shards in the folder, each tensor once.
#include <filesystem>

#include "core/safetensors.h"
#include "fuzz/fuzz_util.h"

using namespace gpulab;
namespace fs = std::filesystem;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fs::path dir = [] {
    const fs::path d = fuzz::scratch_dir() / "sharded";
    fs::create_directories(d);
    for (const auto& e : fs::directory_iterator(fs::path(GPULAB_TEST_DATA) / "llama_tiny_sharded"))
      if (e.path().extension() == ".safetensors") fs::create_symlink(e.path(), d / e.path().filename());
    return d;
  }();
  fuzz::write_bytes(dir / "model.safetensors.index.json", fuzz::as_text(data, size));
  fuzz::refuse_or_pass([&] {
    const core::Checkpoint ckpt(dir);
    for (const auto& shard : ckpt.shards())
      fuzz::check(fs::canonical(shard->path()).parent_path() == fs::canonical(fs::path(GPULAB_TEST_DATA) / "llama_tiny_sharded"),
                  "every shard is one of the checkpoint folder's files");
    for (const auto& e : ckpt.tensors()) fuzz::check(&ckpt.at(e.info->name) != nullptr, "tensors are found by name");
  });
  return 0;
}
