// Helpers for tests labelled `gpu`: they skip, with the reason, where no device is visible.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include "core/device.h"

#define GPULAB_REQUIRE_GPU()                                          \
  do {                                                                \
    const std::string why_ = ::gpulab::core::why_no_device();         \
    if (!why_.empty()) GTEST_SKIP() << "needs a CUDA device: " << why_; \
  } while (0)

// CUDA devices visible to this process (0 without a driver), for tests that need several.
inline int visible_gpus() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}
