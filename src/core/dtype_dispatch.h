// The one dtype dispatch: maps a runtime DType to its C++ element type and calls a generic
// lambda with it, so no kernel or loop is written out once per precision.
//
//   dispatch_float(dt, [&]<class T>() { my_kernel<T><<<...>>>(...); });
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace gpulab::core {

// Calls f.template operator()<T>() for the floating-point storage types kernels support.
template <class F>
decltype(auto) dispatch_float(DType dt, F&& f) {
  switch (dt) {
    case DType::f32: return f.template operator()<float>();
    case DType::f16: return f.template operator()<__half>();
    case DType::bf16: return f.template operator()<__nv_bfloat16>();
    case DType::f8e4m3: return f.template operator()<__nv_fp8_e4m3>();
    case DType::f8e5m2: return f.template operator()<__nv_fp8_e5m2>();
    default: throw Error("no floating-point kernel for dtype " + std::string(dtype_name(dt)));
  }
}

// The 16- and 32-bit types only (activations, most elementwise kernels).
template <class F>
decltype(auto) dispatch_activation(DType dt, F&& f) {
  switch (dt) {
    case DType::f32: return f.template operator()<float>();
    case DType::f16: return f.template operator()<__half>();
    case DType::bf16: return f.template operator()<__nv_bfloat16>();
    default: throw Error("no activation kernel for dtype " + std::string(dtype_name(dt)));
  }
}

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<__half>() { return DType::f16; }
template <> constexpr DType dtype_of<__nv_bfloat16>() { return DType::bf16; }
template <> constexpr DType dtype_of<__nv_fp8_e4m3>() { return DType::f8e4m3; }
template <> constexpr DType dtype_of<__nv_fp8_e5m2>() { return DType::f8e5m2; }

}  // namespace gpulab::core
