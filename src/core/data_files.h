// Locates gpulab's bundled data files (accelerator table, ...): $GPULAB_DATA_DIR, then
// <exe>/../share/gpulab (an installed tree), then the source tree it was built from.
#pragma once

#include <filesystem>
#include <string>

namespace gpulab::core {

// Path of data file `name`; throws Error listing the places searched when it is nowhere.
std::filesystem::path data_file(const std::string& name);

}  // namespace gpulab::core
