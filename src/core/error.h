// Typed errors and the one family of status-checking macros used across gpulab.
//
// Library code throws; only cli/ decides how to print and which exit code to use.
//   GPULAB_CHECK(expr)         any CUDA runtime / cuBLAS / cuDNN / NCCL / CUPTI status
//   GPULAB_CHECK_LAUNCH()      after every kernel launch
//   GPULAB_CHECK_NOTHROW(expr) in destructors: logs instead of throwing
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <cupti.h>
#include <nccl.h>

#include <stdexcept>
#include <string>

namespace gpulab::core {

// Exit codes shared by every command.
enum ExitCode : int {
  kExitOk = 0,
  kExitFailure = 1,    // a runtime failure (CUDA error, I/O error)
  kExitBadInput = 2,   // a user mistake: bad flag, malformed file, unsupported model
  kExitNoDevice = 3,   // the command needs a CUDA device and none is visible
};

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, int exit_code = kExitFailure)
      : std::runtime_error(what), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

// Something the user gave us is wrong (file, flag, config); the message says what to do.
class InputError : public Error {
 public:
  explicit InputError(const std::string& what) : Error(what, kExitBadInput) {}
};

// No usable CUDA device: no driver, no device, or a driver too old for this build.
class NoDeviceError : public Error {
 public:
  explicit NoDeviceError(const std::string& what) : Error(what, kExitNoDevice) {}
};

// A GPU library call failed; the message names the library, the status, the call and the place.
class GpuError : public Error {
 public:
  using Error::Error;
};

std::string status_string(cudaError_t status);
std::string status_string(cublasStatus_t status);
std::string status_string(cudnnStatus_t status);
std::string status_string(ncclResult_t status);
std::string status_string(CUptiResult status);

inline bool is_success(cudaError_t s) { return s == cudaSuccess; }
inline bool is_success(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }
inline bool is_success(cudnnStatus_t s) { return s == CUDNN_STATUS_SUCCESS; }
inline bool is_success(ncclResult_t s) { return s == ncclSuccess; }
inline bool is_success(CUptiResult s) { return s == CUPTI_SUCCESS; }

[[noreturn]] void throw_gpu_error(const std::string& status, const char* expr, const char* func,
                                  const char* file, int line);
void log_gpu_error(const std::string& status, const char* expr, const char* func,
                   const char* file, int line);

template <class Status>
inline void check(Status status, const char* expr, const char* func, const char* file, int line) {
  if (!is_success(status)) throw_gpu_error(status_string(status), expr, func, file, line);
}

template <class Status>
inline void check_nothrow(Status status, const char* expr, const char* func, const char* file,
                          int line) {
  if (!is_success(status)) log_gpu_error(status_string(status), expr, func, file, line);
}

}  // namespace gpulab::core

#define GPULAB_CHECK(expr) ::gpulab::core::check((expr), #expr, __func__, __FILE__, __LINE__)
#define GPULAB_CHECK_NOTHROW(expr) \
  ::gpulab::core::check_nothrow((expr), #expr, __func__, __FILE__, __LINE__)
#define GPULAB_CHECK_LAUNCH() \
  ::gpulab::core::check(cudaGetLastError(), "kernel launch", __func__, __FILE__, __LINE__)
