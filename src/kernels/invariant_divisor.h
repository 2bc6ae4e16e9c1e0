// Division by a divisor known only at run time but the same for a whole kernel (the KV page
// size), as a multiply-high, an add and a shift: the magic number is found once on the host
// (Granlund and Montgomery, "Division by invariant integers using multiplication", 1994). A
// 32-bit `/` by a run-time value is about 20 instructions in SASS; the CUDA-core decode kernel
// divides a position by the page size for every row it reads. (The tensor-core kernels' gather,
// PagedGather, keeps `/`: with this class, ptxas spilled 4-8 bytes in the decode one at five
// blocks an SM.)
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "core/error.h"

namespace gpulab::kernels {

class InvariantDivisor {
 public:
  InvariantDivisor() = default;
  // divisor in [1, 2^31): shift = ceil(log2 divisor), multiplier = 2^32 (2^shift − divisor) / divisor + 1.
  explicit InvariantDivisor(int64_t divisor) : divisor_(static_cast<uint32_t>(divisor)) {
    if (divisor < 1 || divisor >= (int64_t{1} << 31))
      throw core::Error("InvariantDivisor: divisor " + std::to_string(divisor) + " is outside [1, 2^31)");
    while ((uint64_t{1} << shift_) < divisor_) ++shift_;
    multiplier_ = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift_) - divisor_)) / divisor_ + 1);
  }

  // n / divisor for 0 <= n < 2^31 (the high word plus n stays below 2^32).
  __host__ __device__ int32_t div(int32_t n) const {
    const uint32_t u = static_cast<uint32_t>(n);
#ifdef __CUDA_ARCH__
    const uint32_t high = __umulhi(u, multiplier_);
#else
    const uint32_t high = static_cast<uint32_t>((uint64_t{u} * multiplier_) >> 32);
#endif
    return static_cast<int32_t>((high + u) >> shift_);
  }
  __host__ __device__ int32_t mod(int32_t n, int32_t quotient) const {
    return n - quotient * static_cast<int32_t>(divisor_);
  }
  __host__ __device__ int32_t divisor() const { return static_cast<int32_t>(divisor_); }

 private:
  uint32_t divisor_ = 1, multiplier_ = 1, shift_ = 0;
};

}  // namespace gpulab::kernels
