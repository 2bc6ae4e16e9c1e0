// GEMM ladder step 5 (Hopper wgmma + TMA): not built yet.
#include "core/error.h"
#include "kernels/gemm_ladder.h"

namespace gpulab::kernels {

bool gemm_wgmma_compiled() { return false; }

void gemm_wgmma(const void*, const void*, float*, int, int, int, cudaStream_t) {
  throw core::Error("gemm wgmma is not built in this version");
}

}  // namespace gpulab::kernels
