#include "kernels/silu_mul.h"

#include "core/dtype_dispatch.h"
#include "core/error.h"
#include "kernels/pdl.h"

namespace gpulab::kernels {

namespace {

template <class T>
__global__ void silu_mul_kernel(T* out, const T* gate_up, int64_t rows, int64_t inter) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t n = rows * inter;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / inter, i = idx % inter;
    const float g = static_cast<float>(gate_up[r * 2 * inter + i]);
    const float u = static_cast<float>(gate_up[r * 2 * inter + inter + i]);
    out[idx] = static_cast<T>(g / (1.0f + expf(-g)) * u);
  }
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

}  // namespace gpulab::kernels
