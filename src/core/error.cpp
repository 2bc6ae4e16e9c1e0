#include "core/error.h"

#include <cstdio>
#include <sstream>

namespace gpulab::core {

std::string status_string(cudaError_t status) {
  return std::string("CUDA error ") + cudaGetErrorName(status) + " (" +
         cudaGetErrorString(status) + ")";
}

std::string status_string(cublasStatus_t status) {
  return std::string("cuBLAS error ") + cublasLtGetStatusName(status) + " (" +
         cublasLtGetStatusString(status) + ")";
}

std::string status_string(cudnnStatus_t status) {
  return std::string("cuDNN error ") + cudnnGetErrorString(status);
}

std::string status_string(ncclResult_t status) {
  return std::string("NCCL error ") + ncclGetErrorString(status);
}

std::string status_string(CUptiResult status) {
  const char* text = nullptr;
  cuptiGetResultString(status, &text);
  return std::string("CUPTI error ") + (text ? text : "unknown");
}

static std::string format_gpu_error(const std::string& status, const char* expr,
                                    const char* func, const char* file, int line) {
  std::ostringstream out;
  out << status << " in `" << expr << "` (" << func << ", " << file << ":" << line << ")";
  return out.str();
}

void throw_gpu_error(const std::string& status, const char* expr, const char* func,
                     const char* file, int line) {
  throw GpuError(format_gpu_error(status, expr, func, file, line));
}

void log_gpu_error(const std::string& status, const char* expr, const char* func,
                   const char* file, int line) {
  std::fprintf(stderr, "gpulab: %s\n", format_gpu_error(status, expr, func, file, line).c_str());
}

}  // namespace gpulab::core
