// Internal to the attention op: the tensor-core prefill (flash attention on mma.sync), called by
// attention_prefill when attention_prefill_uses_tensor_cores says so. Same contract as
// attention_prefill (kernels/attention.h).
#pragma once

#include "kernels/attention.h"

namespace gpulab::kernels {

void attention_prefill_mma(Rows out, ConstRows q, const PagedKv& kv, const int32_t* cu_q, const int32_t* kv_lens,
                           int64_t num_seqs, int64_t max_q_len, const AttentionShape& shape, core::DType dtype,
                           cudaStream_t stream);

}  // namespace gpulab::kernels
