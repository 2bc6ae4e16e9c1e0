// Device-side inputs and checks for the GEMM benchmarks: matrices of small integers (exact in
// every precision gpulab multiplies) generated from (seed, row, column), so a transposed copy
// holds the same logical matrix; and a count of output elements that miss the reference.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace gpulab::bench {

// Logical element (i, j) of a rows×cols matrix becomes an integer in [-2, 2] that depends only on
// (seed, i, j); it is stored at [i][j] (row-major), or at [j][i] when `transposed`.
void fill_integer_matrix(core::DType dt, void* p, int64_t rows, int64_t cols, bool transposed, uint64_t seed,
                         cudaStream_t stream);

// How many elements of `out` (dtype dt, n elements) differ from the fp32 reference rounded to dt
// by more than atol + rtol·|ref|; NaN and Inf count as wrong. Synchronizes the stream.
uint64_t count_mismatches(core::DType dt, const void* out, const float* ref, uint64_t n, double atol, double rtol,
                          cudaStream_t stream);

}  // namespace gpulab::bench
