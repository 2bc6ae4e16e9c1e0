// A fresh directory under the system temp folder, removed with its contents at scope end.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

namespace gpulab::testing {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag) {
    path = std::filesystem::temp_directory_path() / ("gpulab_" + tag + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

}  // namespace gpulab::testing
