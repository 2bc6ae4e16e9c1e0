// sync_api: cudaDeviceSynchronize after every kernel. The GPU drains and waits for the host to
// notice and launch again; fix: synchronize once, or use events between streams.
#include <cstdio>

#include "busy.cuh"
#include "core/error.h"

int main() {
  int sms = 0;
  GPULAB_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  float* sink;
  GPULAB_CHECK(cudaMalloc(&sink, 1024 * sizeof(float)));
  for (int i = 0; i < 3000; ++i) {
    busy_kernel<<<busy_blocks(sms), 256>>>(30'000, sink);  // 30 us: long enough not to be "short"
    GPULAB_CHECK_LAUNCH();
    GPULAB_CHECK(cudaDeviceSynchronize());
  }
  GPULAB_CHECK(cudaFree(sink));
  std::printf("sync_api: 3000 kernels, each followed by cudaDeviceSynchronize\n");
  return 0;
}
