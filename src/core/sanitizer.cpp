#include "core/sanitizer.h"

#include <cstdlib>

#include "core/error.h"

namespace gpulab::core {

const std::string& sanitizer_tool() {
  static const std::string tool = [] {
    const char* name = std::getenv("GPULAB_SANITIZER");
    return std::string(name ? name : "");
  }();
  return tool;
}

namespace {

bool under_initcheck() {
  static const bool initcheck = sanitizer_tool() == "initcheck";  // read once: matmuls ask every step
  return initcheck;
}

}  // namespace

bool under_racecheck() {
  static const bool racecheck = sanitizer_tool() == "racecheck";
  return racecheck;
}

void zero_library_result_under_initcheck(void* result, size_t bytes, cudaStream_t stream) {
  if (under_initcheck() && bytes > 0) GPULAB_CHECK(cudaMemsetAsync(result, 0, bytes, stream));
}

void zero_library_workspace_under_initcheck(void* workspace, size_t bytes) {
  if (!under_initcheck() || bytes == 0) return;
  GPULAB_CHECK(cudaMemset(workspace, 0, bytes));
  GPULAB_CHECK(cudaDeviceSynchronize());  // the library's streams do not wait for the legacy one
}

void wait_under_racecheck(cudaStream_t stream) {
  if (!under_racecheck()) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  GPULAB_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture == cudaStreamCaptureStatusNone) GPULAB_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace gpulab::core
