// launch_bound: 20000 launches of a kernel that runs for ~2 us. The GPU finishes each kernel
// before the host has issued the next; fix: a CUDA graph, fusion, or more work per launch.
#include <cstdio>

#include "core/error.h"
#include "core/sanitizer.h"

__global__ void axpy(int n, float a, const float* x, float* y) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

int main() {
  int sms = 0;
  GPULAB_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int blocks = 2 * sms, n = blocks * 256;  // grid covers the SMs: short, not small
  float *x, *y;
  GPULAB_CHECK(cudaMalloc(&x, n * sizeof(float)));
  GPULAB_CHECK(cudaMalloc(&y, n * sizeof(float)));
  GPULAB_CHECK(cudaMemset(x, 0, n * sizeof(float)));
  GPULAB_CHECK(cudaMemset(y, 0, n * sizeof(float)));
  for (int i = 0; i < 20000; ++i) {
    axpy<<<blocks, 256>>>(n, 1.0001f, x, y);
    GPULAB_CHECK_LAUNCH();
    // racecheck holds ~11 MiB a launch until the host waits: 20000 of them took 108.5 GiB (session 40).
    if (i % 100 == 99) gpulab::core::wait_under_racecheck(nullptr);
  }
  GPULAB_CHECK(cudaDeviceSynchronize());
  GPULAB_CHECK(cudaFree(x));
  GPULAB_CHECK(cudaFree(y));
  std::printf("launch_bound: 20000 tiny kernels done\n");
  return 0;
}
