#include "kernels/bias_add.h"

#include "core/dtype_dispatch.h"
#include "core/error.h"

namespace gpulab::kernels {

namespace {

template <class T>
__global__ void bias_add_kernel(T* x, const T* bias, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[idx] = static_cast<T>(static_cast<float>(x[idx]) + static_cast<float>(bias[idx % cols]));
}

}  // namespace

void bias_add(void* x, const void* bias, int64_t rows, int64_t cols, core::DType dtype, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 65536);
  core::dispatch_activation(dtype, [&]<class T>() {
    bias_add_kernel<T><<<blocks, 256, 0, stream>>>(static_cast<T*>(x), static_cast<const T*>(bias), rows, cols);
    GPULAB_CHECK_LAUNCH();
  });
}

}  // namespace gpulab::kernels
