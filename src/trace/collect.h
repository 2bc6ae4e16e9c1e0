// Running a program under the CUPTI injection library and gathering what it wrote.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "trace/trace.h"

namespace gpulab::trace {

// Environment variables shared with the injection library (src/trace/inject/).
inline constexpr const char* kEnvOutDir = "GPULAB_TRACE_DIR";        // where process-<pid>.json go
inline constexpr const char* kEnvDuration = "GPULAB_TRACE_DURATION";  // seconds; stop tracing after
inline constexpr const char* kEnvSampleMs = "GPULAB_TRACE_SAMPLE_MS";  // NVML sampling period

// libgpulab_trace.so: $GPULAB_TRACE_LIB, beside the gpulab executable, ../lib, or the build tree.
std::filesystem::path find_inject_library();

struct TracedRun {
  int exit_code = 0;  // the program's status, or 128 + signal
  std::vector<std::filesystem::path> trace_files;
};

// Forks and execs `command` with CUDA_INJECTION64_PATH set; waits for it. `duration_s` > 0 stops
// tracing after that many seconds (the program keeps running). `nvtx`: NVTX ranges are recorded
// too (NVTX_INJECTION64_PATH set). Old process-*.json files in `out_dir` are removed first.
TracedRun run_traced(const std::vector<std::string>& command, const std::filesystem::path& out_dir,
                     double duration_s, bool nvtx);

// Reads the per-process traces into one (correlation ids kept apart per process).
Trace merge_traces(const std::vector<std::filesystem::path>& files);

}  // namespace gpulab::trace
