// The SwiGLU gate's arithmetic, shared by the kernels that apply it: silu_mul, silu_mul_fp8 and
// skinny_gemm's swiglu epilogue write the same bits for the same gate and up values.
#pragma once

namespace gpulab::kernels {

// silu(g) · u rounded to T, in float32 with an IEEE exp and divide.
template <class T>
__device__ inline T silu_times(T g, T u) {
  const float gf = static_cast<float>(g);
  return static_cast<T>(gf / (1.0f + expf(-gf)) * static_cast<float>(u));
}

}  // namespace gpulab::kernels
