// A fresh random seed for a test that draws its data, printed so that a failure can be rerun with
// the same data: GPULAB_TEST_SEED=N fixes every seed the test draws.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

namespace gpulab::testing {

inline uint32_t test_seed() {
  const char* fixed = std::getenv("GPULAB_TEST_SEED");
  const uint32_t seed = fixed && *fixed ? static_cast<uint32_t>(std::stoul(fixed)) : std::random_device{}();
  std::printf("random seed %u (GPULAB_TEST_SEED=%u reproduces it)\n", seed, seed);
  return seed;
}

}  // namespace gpulab::testing
