// Chrome-trace JSON (the format Perfetto and chrome://tracing open) in the layout the PyTorch
// profiler (Kineto) writes: "X" events with categories kernel, gpu_memcpy, gpu_memset,
// cuda_runtime, cuda_driver, cpu_op, user_annotation (NVTX / record_function ranges on a host
// thread) and gpu_user_annotation (their projection onto a stream); "ac2g" flow events from launch
// to GPU work; device properties at the top. gpulab adds unified-memory events (cat "gpulab_um"), NVML counters
// (cat "gpulab_nvml") and a "gpulab" object (dropped records, UM counter status).
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "trace/trace.h"

namespace gpulab::trace {

// Throws core::InputError naming `source` when the document is not a trace or an event is malformed.
Trace parse_chrome_trace(const nlohmann::json& doc, const std::string& source);
// Reads and parses a file; unreadable or invalid JSON is an InputError naming the file.
Trace read_chrome_trace(const std::filesystem::path& path);
// The trace as Chrome-trace JSON text; times are written relative to the earliest record, whose
// absolute time goes to "baseTimeNanoseconds" (the reader adds it back).
std::string chrome_trace_json(const Trace& trace);

}  // namespace gpulab::trace
