// um_thrashing: 64 MiB of managed memory touched alternately by a kernel and by the host. Every
// step migrates the pages to the GPU on fault and back to the host on fault; fix:
// cudaMemPrefetchAsync / cudaMemAdvise, or keep the data where it is used.
#include <unistd.h>

#include <cstdio>

#include "core/error.h"

__global__ void increment(size_t n, int* data) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) ++data[i];
}

int main() {
  constexpr size_t kBytes = 64 << 20;  // a small fraction of any device's memory
  const size_t n = kBytes / sizeof(int);
  const size_t page_ints = size_t(sysconf(_SC_PAGESIZE)) / sizeof(int);
  int sms = 0;
  GPULAB_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  int* data;
  GPULAB_CHECK(cudaMallocManaged(&data, kBytes));
  for (size_t i = 0; i < n; ++i) data[i] = 0;
  for (int step = 0; step < 20; ++step) {
    increment<<<8 * sms, 256>>>(n, data);  // GPU faults: host -> device migration
    GPULAB_CHECK_LAUNCH();
    GPULAB_CHECK(cudaDeviceSynchronize());
    for (size_t i = 0; i < n; i += page_ints) ++data[i];  // CPU faults: device -> host, per page
  }
  long long wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += data[i] != 20 + (i % page_ints == 0 ? 20 : 0);
  GPULAB_CHECK(cudaFree(data));
  std::printf("um_thrashing: 20 host/device round trips of 64 MiB, %lld wrong values\n", wrong);
  return wrong == 0 ? 0 : 1;
}
