// host_starved: 10 ms of host-side preprocessing before each 2 ms kernel. The GPU waits for the
// host most of the time; fix: preprocess on the GPU or in worker threads ahead of time.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "busy.cuh"
#include "core/error.h"

// "Preprocessing": normalises a batch on the CPU until `ms` milliseconds have passed.
void preprocess(float* batch, size_t n, int ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end)
    for (size_t i = 0; i < n; ++i) batch[i] = std::sqrt(batch[i] * batch[i] + 1.0f) * 0.5f;
}

int main() {
  int sms = 0;
  GPULAB_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  constexpr size_t kN = 64 << 10;  // 256 KiB per batch
  float *batch, *dev, *sink;
  GPULAB_CHECK(cudaMallocHost(&batch, kN * sizeof(float)));
  GPULAB_CHECK(cudaMalloc(&dev, kN * sizeof(float)));
  GPULAB_CHECK(cudaMalloc(&sink, 1024 * sizeof(float)));
  for (size_t i = 0; i < kN; ++i) batch[i] = float(i);
  cudaStream_t stream;
  GPULAB_CHECK(cudaStreamCreate(&stream));
  for (int step = 0; step < 40; ++step) {
    preprocess(batch, kN, 10);
    GPULAB_CHECK(cudaStreamSynchronize(stream));  // the previous upload has finished reading `batch`
    GPULAB_CHECK(cudaMemcpyAsync(dev, batch, kN * sizeof(float), cudaMemcpyHostToDevice, stream));
    busy_kernel<<<busy_blocks(sms), 256, 0, stream>>>(2'000'000, sink);
    GPULAB_CHECK_LAUNCH();
  }
  GPULAB_CHECK(cudaStreamSynchronize(stream));
  GPULAB_CHECK(cudaStreamDestroy(stream));
  GPULAB_CHECK(cudaFreeHost(batch));
  GPULAB_CHECK(cudaFree(dev));
  GPULAB_CHECK(cudaFree(sink));
  std::printf("host_starved: 40 steps of 10 ms host work + 2 ms GPU work\n");
  return 0;
}
