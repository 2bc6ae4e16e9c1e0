#include "bench/collective_data.h"

#include <algorithm>

#include "bench/device_count.cuh"
#include "core/error.h"
#include "core/memory.h"

namespace gpulab::bench {

namespace {

__host__ __device__ inline float value(int rank, size_t i) { return float(int((size_t(rank) * 7 + i) % 5) - 2); }

__global__ void fill_kernel(float* p, size_t n, int rank) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = value(rank, i);
}

__global__ void check_kernel(Collective c, const float* recv, size_t send_count, int rank, int ranks,
                             unsigned long long* wrong) {
  const size_t n = c == Collective::all_gather ? send_count * ranks
                 : c == Collective::reduce_scatter ? send_count / ranks : send_count;
  unsigned long long local = 0;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float expect = 0;
    switch (c) {
      case Collective::all_reduce:
        for (int r = 0; r < ranks; ++r) expect += value(r, i);
        break;
      case Collective::all_gather: expect = value(int(i / send_count), i % send_count); break;
      case Collective::reduce_scatter:
        for (int r = 0; r < ranks; ++r) expect += value(r, size_t(rank) * n + i);
        break;
      case Collective::broadcast: expect = value(0, i); break;
    }
    if (!(recv[i] == expect)) ++local;  // NaN (the poison) counts as wrong
  }
  if (local) atomicAdd(wrong, local);
}

}  // namespace

void fill_collective_input(float* send, size_t count, int rank, cudaStream_t stream) {
  fill_kernel<<<grid_stride_blocks(count), kGridStrideThreads, 0, stream>>>(send, count, rank);
  GPULAB_CHECK_LAUNCH();
}

uint64_t count_collective_errors(Collective c, const float* recv, size_t send_count, int rank, int ranks,
                                 cudaStream_t stream) {
  return count_on_device(stream, [&](unsigned long long* wrong) {
    check_kernel<<<grid_stride_blocks(recv_count(c, send_count, ranks)), kGridStrideThreads, 0, stream>>>(
        c, recv, send_count, rank, ranks, wrong);
  });
}

}  // namespace gpulab::bench
