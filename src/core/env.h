// Environment switches of the A/B kind (GPULAB_SKINNY_GEMM, GPULAB_NVJPEG_HARDWARE, ...): "1"
// turns a path on, "0" off, anything else (or unset) leaves the program's own choice.
#pragma once

#include <cstdlib>
#include <cstring>
#include <optional>

namespace gpulab::core {

inline std::optional<bool> env_switch(const char* name) {
  const char* v = std::getenv(name);
  if (v && !std::strcmp(v, "1")) return true;
  if (v && !std::strcmp(v, "0")) return false;
  return std::nullopt;
}

}  // namespace gpulab::core
