#include "kernels/tensor_map.h"

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <mutex>
#include <string>

#include "core/error.h"

namespace gpulab::kernels {

namespace {

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder(const char* who) {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    cudaDriverEntryPointQueryResult status{};
    void* p = nullptr;
    GPULAB_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &status));
    if (status == cudaDriverEntryPointSuccess) fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  });
  if (!fn) throw core::Error(std::string(who) + ": the driver has no cuTensorMapEncodeTiled");
  return fn;
}

}  // namespace

CUtensorMap tensor_map_2d(const void* p, CUtensorMapDataType type, int64_t element_bytes, int64_t rows, int64_t cols,
                          int box_rows, const char* who) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(cols * element_bytes)};
  const cuuint32_t box[2] = {cuuint32_t(128 / element_bytes), cuuint32_t(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = tensor_map_encoder(who)(&map, type, 2, const_cast<void*>(p), dims, strides, box, element_strides,
                                             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw core::GpuError(std::string(who) + ": cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(r)) +
                         ")");
  return map;
}

}  // namespace gpulab::kernels
