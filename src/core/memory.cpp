#include "core/memory.h"

#include <string>

namespace gpulab::core {

static std::string gib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
  return buf;
}

void* device_malloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t status = cudaMalloc(&p, bytes);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    throw Error("out of GPU memory: needed " + gib(bytes) + ", " + gib(free_bytes) + " free of " + gib(total));
  }
  GPULAB_CHECK(status);
  return p;
}

void* pinned_malloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t status = cudaMallocHost(&p, bytes);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    throw Error("cannot pin " + gib(bytes) + " of host memory");
  }
  GPULAB_CHECK(status);
  return p;
}

}  // namespace gpulab::core
