#include "kernels/embedding.h"

#include "core/dtype_dispatch.h"
#include "core/error.h"

namespace gpulab::kernels {

namespace {

template <class Out, class In>
__global__ void embedding_kernel(Out* out, const In* table, const int32_t* ids, int64_t hidden) {
  const int64_t t = blockIdx.x;
  const In* row = table + static_cast<int64_t>(ids[t]) * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x)
    out[t * hidden + i] = static_cast<Out>(static_cast<float>(row[i]));
}

}  // namespace

void embedding(void* out, core::DType out_dtype, const void* table, core::DType table_dtype, const int32_t* ids,
               int64_t tokens, int64_t hidden, cudaStream_t stream) {
  if (tokens == 0) return;
  core::dispatch_activation(out_dtype, [&]<class Out>() {
    core::dispatch_activation(table_dtype, [&]<class In>() {
      embedding_kernel<Out, In><<<tokens, 256, 0, stream>>>(static_cast<Out*>(out), static_cast<const In*>(table), ids, hidden);
      GPULAB_CHECK_LAUNCH();
    });
  });
}

}  // namespace gpulab::kernels
