// pageable_memcpy: cudaMemcpyAsync from and to malloc'd (pageable) host memory. The driver
// stages such copies through a pinned bounce buffer, synchronously; fix: cudaMallocHost.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

__global__ void scale(int n, float a, float* x) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] *= a;
}

int main() {
  constexpr size_t kBytes = 64 << 20;
  const int n = int(kBytes / sizeof(float));
  int sms = 0;
  GPULAB_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  float* host = static_cast<float*>(std::malloc(kBytes));
  std::memset(host, 0, kBytes);
  float* dev;
  GPULAB_CHECK(cudaMalloc(&dev, kBytes));
  cudaStream_t stream;
  GPULAB_CHECK(cudaStreamCreate(&stream));
  for (int i = 0; i < 30; ++i) {
    GPULAB_CHECK(cudaMemcpyAsync(dev, host, kBytes, cudaMemcpyHostToDevice, stream));
    scale<<<4 * sms, 256, 0, stream>>>(n, 1.5f, dev);
    GPULAB_CHECK_LAUNCH();
    GPULAB_CHECK(cudaMemcpyAsync(host, dev, kBytes, cudaMemcpyDeviceToHost, stream));
  }
  GPULAB_CHECK(cudaStreamSynchronize(stream));
  GPULAB_CHECK(cudaStreamDestroy(stream));
  GPULAB_CHECK(cudaFree(dev));
  std::free(host);
  std::printf("pageable_memcpy: 60 pageable copies of 64 MiB done\n");
  return 0;
}
