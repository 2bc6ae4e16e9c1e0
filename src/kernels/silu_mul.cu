#include "kernels/silu_mul.h"

#include <cuda_fp8.h>

#include "core/dtype_dispatch.h"
#include "core/error.h"
#include "kernels/block_reduce.cuh"
#include "kernels/fp8_quant.h"
#include "kernels/pdl.h"

namespace gpulab::kernels {

namespace {

// silu(g) · u rounded to T: the value both kernels write (or quantize).
template <class T>
__device__ inline T silu_times(T g, T u) {
  const float gf = static_cast<float>(g);
  return static_cast<T>(gf / (1.0f + expf(-gf)) * static_cast<float>(u));
}

template <class T>
__global__ void silu_mul_kernel(T* out, const T* gate_up, int64_t rows, int64_t inter) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t n = rows * inter;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / inter, i = idx % inter;
    out[idx] = silu_times(gate_up[r * 2 * inter + i], gate_up[r * 2 * inter + inter + i]);
  }
}

// One block per row: the row's amax over the values silu_mul would write, then those values in
// e4m3, as fp8_quantize quantizes silu_mul's output per row. The row (L2-resident, a decode step
// has a few) is read twice rather than held.
constexpr int kFp8Threads = 1024;

template <class T>
__global__ void __launch_bounds__(kFp8Threads) silu_mul_fp8_kernel(__nv_fp8_storage_t* q, float* scales,
                                                                   const T* gate_up, int64_t inter) {
  pdl_launch_dependents();
  pdl_wait();
  const T* gate = gate_up + blockIdx.x * 2 * inter;
  float amax = 0.f;
  for (int64_t i = threadIdx.x; i < inter; i += kFp8Threads)
    amax = fmaxf(amax, fabsf(static_cast<float>(silu_times(gate[i], gate[inter + i]))));
  const float scale = fp8_scale_for_amax(block_max<kFp8Threads>(amax));
  if (threadIdx.x == 0) scales[blockIdx.x] = scale;
  __nv_fp8_storage_t* row = q + blockIdx.x * inter;
  for (int64_t i = threadIdx.x; i < inter; i += kFp8Threads)
    row[i] = fp8_quantize_value(static_cast<float>(silu_times(gate[i], gate[inter + i])), scale);
}

}  // namespace

void silu_mul(void* out, const void* gate_up, int64_t rows, int64_t inter, core::DType dtype, cudaStream_t stream) {
  const int64_t n = rows * inter;
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 65536);
  core::dispatch_activation(dtype, [&]<class T>() {
    launch_overlapped(silu_mul_kernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(256), 0, stream,
                      static_cast<T*>(out), static_cast<const T*>(gate_up), rows, inter);
  });
}

void silu_mul_fp8(void* out, float* scales, const void* gate_up, int64_t rows, int64_t inter, core::DType dtype,
                  cudaStream_t stream) {
  if (rows == 0 || inter == 0) return;
  core::dispatch_activation(dtype, [&]<class T>() {
    launch_overlapped(silu_mul_fp8_kernel<T>, dim3(static_cast<unsigned>(rows)), dim3(kFp8Threads), 0, stream,
                      static_cast<__nv_fp8_storage_t*>(out), scales, static_cast<const T*>(gate_up), inter);
  });
}

}  // namespace gpulab::kernels
