// Token embedding gather: out[t, :] = table[ids[t], :]. Ids must lie in [0, vocab): the caller
// checks them on the host, where a bad id can still be reported.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace gpulab::kernels {

void embedding(void* out, core::DType out_dtype, const void* table, core::DType table_dtype, const int32_t* ids,
               int64_t tokens, int64_t hidden, cudaStream_t stream);

void embedding_ref(float* out, const float* table, const int32_t* ids, int64_t tokens, int64_t hidden);

}  // namespace gpulab::kernels
