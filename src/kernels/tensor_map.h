// TMA tensor maps (CUtensorMap) for the Hopper kernels, encoded through the runtime's driver entry
// point so that nothing links libcuda directly.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace gpulab::kernels {

// A rows × cols row-major matrix of `type` elements (element_bytes each) at p, loaded in boxes of
// box_rows rows × 128 bytes, 128-byte swizzled (the layout smem_descriptor describes); parts of a
// box past the matrix read as zeros. p and the row pitch must be 16-byte aligned. Throws
// core::GpuError naming `who` where the driver refuses.
CUtensorMap tensor_map_2d(const void* p, CUtensorMapDataType type, int64_t element_bytes, int64_t rows, int64_t cols,
                          int box_rows, const char* who);

}  // namespace gpulab::kernels
