// healthy: one pinned upload, 100 kernels (or argv[1]) of 5 ms each queued back to back on one
// stream, one download, one synchronize. `gpulab diagnose` should find nothing of high severity.
// The kernels are inside an NVTX range "healthy:kernels" (--capture-range), each launch in one
// named "launch".
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <nvtx3/nvToolsExt.h>

#include "busy.cuh"
#include "core/error.h"

int main(int argc, char** argv) {
  const int kernels = argc > 1 ? std::atoi(argv[1]) : 100;
  int sms = 0;
  GPULAB_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  constexpr size_t kBytes = 64 << 20;
  float *host, *dev, *sink;
  GPULAB_CHECK(cudaMallocHost(&host, kBytes));
  std::memset(host, 0, kBytes);
  GPULAB_CHECK(cudaMalloc(&dev, kBytes));
  GPULAB_CHECK(cudaMalloc(&sink, 1024 * sizeof(float)));
  cudaStream_t stream;
  GPULAB_CHECK(cudaStreamCreate(&stream));
  GPULAB_CHECK(cudaMemcpyAsync(dev, host, kBytes, cudaMemcpyHostToDevice, stream));
  nvtxRangePushA("healthy:kernels");
  for (int i = 0; i < kernels; ++i) {
    nvtxRangePushA("launch");
    busy_kernel<<<busy_blocks(sms), 256, 0, stream>>>(5'000'000, sink);
    GPULAB_CHECK_LAUNCH();
    nvtxRangePop();
  }
  GPULAB_CHECK(cudaStreamSynchronize(stream));
  nvtxRangePop();
  GPULAB_CHECK(cudaMemcpyAsync(host, dev, kBytes, cudaMemcpyDeviceToHost, stream));
  GPULAB_CHECK(cudaStreamSynchronize(stream));
  GPULAB_CHECK(cudaStreamDestroy(stream));
  GPULAB_CHECK(cudaFreeHost(host));
  GPULAB_CHECK(cudaFree(dev));
  GPULAB_CHECK(cudaFree(sink));
  std::printf("healthy: %d kernels of 5 ms back to back\n", kernels);
  return 0;
}
