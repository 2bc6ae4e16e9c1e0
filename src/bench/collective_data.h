// Inputs and checks for the NCCL suite: rank r's element i is a small integer f(r, i), so sums
// over ranks are exact in fp32 and every output element has one right value (nccl-tests' #wrong).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "bench/collective.h"

namespace gpulab::bench {

// Rank `rank`'s send buffer of `count` floats for collective c.
void fill_collective_input(float* send, size_t count, int rank, cudaStream_t stream);
// Elements of rank `rank`'s receive buffer (recv_count(c, send_count, ranks) floats) that are not
// what the collective must produce; synchronizes the stream. Broadcast's root is rank 0.
uint64_t count_collective_errors(Collective c, const float* recv, size_t send_count, int rank, int ranks,
                                 cudaStream_t stream);

}  // namespace gpulab::bench
