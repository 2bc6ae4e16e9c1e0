// Helpers for tests labelled `gpu`: they skip, with the reason, where no device is visible.
#pragma once

#include <gtest/gtest.h>

#include "core/device.h"

#define GPULAB_REQUIRE_GPU()                                          \
  do {                                                                \
    const std::string why_ = ::gpulab::core::why_no_device();         \
    if (!why_.empty()) GTEST_SKIP() << "needs a CUDA device: " << why_; \
  } while (0)
