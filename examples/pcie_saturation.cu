// pcie_saturation: 256 MiB pinned host-to-device copies, each followed by a tiny kernel. The
// copies run at the link's ceiling while the SMs wait; fix: keep data resident, overlap copies
// with compute on other streams, or move fewer bytes.
#include <cstdio>
#include <cstring>

#include "core/error.h"

__global__ void checksum(const float* x, size_t stride, float* out) {
  out[threadIdx.x] = x[threadIdx.x * stride];  // touches a few values: the kernel is tiny
}

int main() {
  constexpr size_t kBytes = 256 << 20;
  float *host, *dev, *out;
  GPULAB_CHECK(cudaMallocHost(&host, kBytes));
  std::memset(host, 0, kBytes);
  GPULAB_CHECK(cudaMalloc(&dev, kBytes));
  GPULAB_CHECK(cudaMalloc(&out, 256 * sizeof(float)));
  cudaStream_t stream;
  GPULAB_CHECK(cudaStreamCreate(&stream));
  for (int i = 0; i < 20; ++i) {
    GPULAB_CHECK(cudaMemcpyAsync(dev, host, kBytes, cudaMemcpyHostToDevice, stream));
    checksum<<<1, 256, 0, stream>>>(dev, kBytes / sizeof(float) / 256, out);
    GPULAB_CHECK_LAUNCH();
  }
  GPULAB_CHECK(cudaStreamSynchronize(stream));
  GPULAB_CHECK(cudaStreamDestroy(stream));
  GPULAB_CHECK(cudaFreeHost(host));
  GPULAB_CHECK(cudaFree(dev));
  GPULAB_CHECK(cudaFree(out));
  std::printf("pcie_saturation: 20 pinned copies of 256 MiB\n");
  return 0;
}
