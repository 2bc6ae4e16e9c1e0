#include "core/data_files.h"

#include <cstdlib>
#include <vector>

#include "core/error.h"
#include "core/version.h"

namespace gpulab::core {

namespace fs = std::filesystem;

std::filesystem::path data_file(const std::string& name) {
  std::vector<fs::path> dirs;
  if (const char* env = std::getenv("GPULAB_DATA_DIR")) dirs.emplace_back(env);
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) dirs.push_back(exe.parent_path().parent_path() / "share" / "gpulab");
  dirs.emplace_back(kDataDir);
  std::string searched;
  for (const auto& dir : dirs) {
    if (fs::exists(dir / name)) return dir / name;
    searched += " " + dir.string();
  }
  throw Error("data file '" + name + "' not found in:" + searched + " (set GPULAB_DATA_DIR)");
}

}  // namespace gpulab::core
