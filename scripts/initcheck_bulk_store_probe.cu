// Does compute-sanitizer's initcheck see global memory written by Hopper's bulk (TMA) stores?
// cuBLASLt's and cuDNN's sm_90 kernels write their outputs that way; initcheck then flags our
// kernels' reads of those outputs (docs/reliability.md, sessions 8 and 25). This probe writes a
// fresh cudaMalloc buffer one of four ways, reads it back with ordinary loads in a second kernel
// and checks the values on the host, so a run under initcheck tells a missed store from a real
// uninitialised read:
//   st      ordinary st.global                       (initcheck must stay silent)
//   bulk    cp.async.bulk.global.shared::cta          (the non-tensor bulk copy)
//   tensor  cp.async.bulk.tensor.2d.global.shared::cta through a CUtensorMap (what cuBLASLt uses)
//   none    nothing written                          (initcheck must report every read)
// Build and run on an sm_90 GPU:
//   nvcc -std=c++20 -arch=sm_90a -o probe scripts/initcheck_bulk_store_probe.cu
//   for w in st bulk tensor none; do compute-sanitizer --tool initcheck ./probe $w; done
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CHECK(x)                                                                                  \
  do {                                                                                            \
    cudaError_t e_ = (x);                                                                         \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(e_));                        \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

constexpr int kCols = 64, kRows = 8, kBlocks = 16;  // each block writes kRows x kCols floats (2 KiB)

__device__ float value(int i) { return float(i % 251) + 0.5f; }

enum class How { st, bulk, tensor };

__global__ void write_tile(float* dst, const __grid_constant__ CUtensorMap map, How how) {
  __shared__ alignas(128) float tile[kRows * kCols];
  const int base = blockIdx.x * kRows * kCols;
  for (int i = threadIdx.x; i < kRows * kCols; i += blockDim.x) {
    if (how == How::st) dst[base + i] = value(base + i);
    tile[i] = value(base + i);
  }
  if (how == How::st) return;
  // Generic-proxy writes to shared memory must be visible to the async proxy before the copy.
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  if (threadIdx.x != 0) return;
  const unsigned smem = static_cast<unsigned>(__cvta_generic_to_shared(tile));
  if (how == How::bulk) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst + base), "r"(smem),
                 "r"(unsigned(sizeof tile))
                 : "memory");
  } else {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"(&map), "r"(0),
                 "r"(int(blockIdx.x) * kRows), "r"(smem)
                 : "memory");
  }
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

__global__ void read_back(const float* src, int n, int* wrong) {
  int bad = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) bad += src[i] != value(i);
  atomicAdd(wrong, bad);
}

int main(int argc, char** argv) {
  const std::string way = argc > 1 ? argv[1] : "";
  if (way != "st" && way != "bulk" && way != "tensor" && way != "none") {
    std::fprintf(stderr, "usage: %s st|bulk|tensor|none\n", argv[0]);
    return 2;
  }
  const int n = kBlocks * kRows * kCols;
  float* dst = nullptr;
  int* wrong = nullptr;
  CHECK(cudaMalloc(&dst, n * sizeof(float)));
  CHECK(cudaMalloc(&wrong, sizeof(int)));
  CHECK(cudaMemset(wrong, 0, sizeof(int)));

  CUtensorMap map{};
  if (way == "tensor") {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    const cuuint64_t dims[2] = {kCols, cuuint64_t(kBlocks) * kRows};
    const cuuint64_t strides[1] = {kCols * sizeof(float)};
    const cuuint32_t box[2] = {kCols, kRows}, element_strides[2] = {1, 1};
    const CUresult r = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)(
        &map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, dst, dims, strides, box, element_strides,
        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
      std::fprintf(stderr, "cuTensorMapEncodeTiled failed: %d\n", int(r));
      return 1;
    }
  }
  if (way != "none") {
    const How how = way == "st" ? How::st : way == "bulk" ? How::bulk : How::tensor;
    write_tile<<<kBlocks, 128>>>(dst, map, how);
    CHECK(cudaGetLastError());
  }
  read_back<<<8, 256>>>(dst, n, wrong);
  CHECK(cudaGetLastError());
  int bad = 0;
  CHECK(cudaMemcpy(&bad, wrong, sizeof(int), cudaMemcpyDeviceToHost));
  std::printf("%s: %d of %d values wrong after the read-back\n", way.c_str(), bad, n);
  CHECK(cudaFree(dst));
  CHECK(cudaFree(wrong));
  return way == "none" || bad == 0 ? 0 : 1;
}
