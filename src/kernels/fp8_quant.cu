#include <cuda_fp8.h>

#include <algorithm>

#include "core/dtype_dispatch.h"
#include "core/error.h"
#include "kernels/block_reduce.cuh"
#include "kernels/fp8_quant.h"
#include "kernels/pdl.h"

namespace gpulab::kernels {

namespace {

// Wide blocks: a decode step quantizes only a few rows (one block each), so each row gets many
// threads; rows move in 16-byte packs when their length allows.
constexpr int kThreads = 1024;

// 16 bytes of T, and the e4m3 bytes they quantize to.
template <class T>
using InPack = Pack<T, kPackOf<T>>;
template <class T>
using OutPack = Pack<__nv_fp8_storage_t, kPackOf<T>>;

// Calls f(first column, pack) over a row in 16-byte packs, or f(column, pack, 1) with one element when the
// row cannot be read in packs. All rows of one call take the same path (cols decides).
template <class T, class F>
__device__ void for_each_in_row(const T* row, int64_t cols, bool packed, F&& f) {
  using P = InPack<T>;
  if (packed) {
    for (int64_t c = threadIdx.x * int64_t{kPackOf<T>}; c < cols; c += int64_t{kThreads} * kPackOf<T>)
      f(c, *reinterpret_cast<const P*>(row + c));
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
      P p;
      p.v[0] = row[c];
      f(c, p, 1);
    }
  }
}

template <class T>
__device__ float row_abs_max(const T* row, int64_t cols, bool packed) {
  float m = 0.0f;
  auto take = [&](int64_t, const InPack<T>& p, int n = kPackOf<T>) {
    for (int j = 0; j < n; ++j) m = fmaxf(m, fabsf(static_cast<float>(p.v[j])));
  };
  for_each_in_row(row, cols, packed, take);
  return block_max<kThreads>(m);
}

// One block per row.
template <class T>
__global__ void row_amax_kernel(float* row_amax, const T* in, int64_t cols, bool packed) {
  pdl_launch_dependents();
  pdl_wait();
  const float m = row_abs_max(in + blockIdx.x * cols, cols, packed);
  if (threadIdx.x == 0) row_amax[blockIdx.x] = m;
}

// One block per row: the amax is the row's own, or (row_amax given) the max over all rows.
// Both kernels launch overlapped (kernels/pdl.h) and wait before touching anything: in a decode
// step they sit between the GEMMs, whose launches then overlap theirs.
template <class T>
__global__ void quantize_kernel(__nv_fp8_storage_t* out, float* scales, const T* in, int64_t rows, int64_t cols,
                                const float* row_amax, bool packed) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t r = blockIdx.x;
  const T* row = in + r * cols;
  float m = 0.0f;
  if (row_amax) {
    for (int64_t i = threadIdx.x; i < rows; i += kThreads) m = fmaxf(m, row_amax[i]);
    m = block_max<kThreads>(m);
  } else {
    m = row_abs_max(row, cols, packed);
  }
  const float s = fp8_scale_for_amax(m);
  __nv_fp8_storage_t* q = out + r * cols;
  using Out = OutPack<T>;
  auto put = [&](int64_t c, const InPack<T>& p, int n = kPackOf<T>) {
    Out o;
    for (int j = 0; j < n; ++j) o.v[j] = fp8_quantize_value(static_cast<float>(p.v[j]), s);
    if (n == kPackOf<T>)
      *reinterpret_cast<Out*>(q + c) = o;
    else
      q[c] = o.v[0];
  };
  for_each_in_row(row, cols, packed, put);
  if (threadIdx.x == 0) scales[r] = s;
}

template <class T>
__global__ void accumulate_kernel(float* x, const T* y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] += static_cast<float>(y[i]);
}

}  // namespace

void fp8_quantize(void* out, float* scales, const void* in, core::DType in_dtype, int64_t rows, int64_t cols,
                  Fp8Granularity granularity, float* row_amax, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const bool tensor = granularity == Fp8Granularity::tensor;
  if (tensor && !row_amax) throw core::Error("fp8_quantize: tensor granularity needs a row_amax workspace");
  core::dispatch_activation(in_dtype, [&]<class T>() {
    const T* x = static_cast<const T*>(in);
    const bool packed = fp8_rows_pack(in, out, cols, sizeof(T));
    const dim3 grid(static_cast<unsigned>(rows));
    if (tensor) launch_overlapped(row_amax_kernel<T>, grid, dim3(kThreads), 0, stream, row_amax, x, cols, packed);
    launch_overlapped(quantize_kernel<T>, grid, dim3(kThreads), 0, stream,
                      static_cast<__nv_fp8_storage_t*>(out), scales, x, rows, cols, tensor ? row_amax : nullptr, packed);
  });
}

void accumulate(float* x, const void* y, core::DType y_dtype, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 65536);
  core::dispatch_activation(y_dtype, [&]<class T>() {
    accumulate_kernel<T><<<blocks, 256, 0, stream>>>(x, static_cast<const T*>(y), n);
    GPULAB_CHECK_LAUNCH();
  });
}

}  // namespace gpulab::kernels
