// Helpers for tests labelled `gpu`: they skip, with the reason, where no device is visible.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <string>

#include "core/device.h"
#include "core/sanitizer.h"

#define GPULAB_REQUIRE_GPU()                                          \
  do {                                                                \
    const std::string why_ = ::gpulab::core::why_no_device();         \
    if (!why_.empty()) GTEST_SKIP() << "needs a CUDA device: " << why_; \
  } while (0)

// GPULAB_REQUIRE_GPU, and fp8 tensor cores (compute capability 8.9 or newer) on device 0.
#define GPULAB_REQUIRE_FP8()                                                                     \
  do {                                                                                           \
    GPULAB_REQUIRE_GPU();                                                                        \
    int major_ = 0, minor_ = 0;                                                                  \
    if (cudaDeviceGetAttribute(&major_, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||  \
        cudaDeviceGetAttribute(&minor_, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess ||  \
        major_ * 10 + minor_ < 89)                                                               \
      GTEST_SKIP() << "fp8 needs compute capability 8.9 or newer";                               \
  } while (0)

// CUDA devices visible to this process (0 without a driver), for tests that need several.
inline int visible_gpus() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// Whether GPUs 0 .. n-1 all have peer access to each other (NVLink or PCIe P2P).
inline bool gpus_reach_each_other(int n) {
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) {
      int ok = 0;
      if (a != b && (cudaDeviceCanAccessPeer(&ok, a, b) != cudaSuccess || !ok)) return false;
    }
  return true;
}

// The compute-sanitizer tool this test runs under ("" outside one): scripts/compute_sanitizer.sh
// sets GPULAB_SANITIZER. Its instrumentation slows every access by 10-100x and unevenly, so a claim
// about timing (a latency ordering) says nothing there; the work and its other checks still run.
using ::gpulab::core::sanitizer_tool;

// racecheck checks every shared-memory access of every kernel, cuDNN's convolutions above all, so
// there a tiny training run's step takes seconds and a test that trains a dozen runs, or decodes
// a few hundred steps on several engines, outlasts a device call's 10 minutes (docs/reliability.md,
// sessions 35-38). Under it such tests leave out work whose shared-memory code the kept work
// executes too: runs that differ only on the host (a report lag, a repeat, the scheduler's order),
// CUDA-graph replays checked against eager launches of the same kernels, and pairings whose parts
// run elsewhere in the test (an optimizer kernel differs by precision only in the type of the
// weight copy it stores). Their other checks still run on what is kept.
using ::gpulab::core::under_racecheck;
