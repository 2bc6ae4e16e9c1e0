// Rope's arithmetic for device code, shared by rope() and the decode attention that rotates its
// new token itself (PagedKv::append), so that both give the same bits: the angles come from
// rope_table's (cos, sin) pairs, so no kernel needs sincosf's long code. Include from .cu files.
#pragma once

#include <cstdint>

namespace gpulab::kernels {

// Element i of a head rotated by angle (cos, sin) = cs (rotate_half convention, pairs (i, i +
// half)): self·cos − partner·sin in the first half, self·cos + partner·sin in the second, where
// partner is the element half a head away. The _rn operations keep the compiler from fusing
// them into multiply-adds differently in different kernels.
__device__ inline float rope_element(float self, float partner, float2 cs, bool first_half) {
  const float turn = __fmul_rn(partner, cs.y);
  return __fadd_rn(__fmul_rn(self, cs.x), first_half ? -turn : turn);
}

// Element i of a head's row (D elements, not yet rotated) rotated by its angle cs (entry
// i % (D/2) of its position's row of rope_table), rounded to T as rope() stores it.
template <class T, int D>
__device__ inline T rope_at(const T* head, int i, float2 cs) {
  constexpr int kHalf = D / 2;
  const bool first_half = i < kHalf;
  const float partner = static_cast<float>(head[first_half ? i + kHalf : i - kHalf]);
  return static_cast<T>(rope_element(static_cast<float>(head[i]), partner, cs, first_half));
}

}  // namespace gpulab::kernels
