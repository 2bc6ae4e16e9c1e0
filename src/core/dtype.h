// The one list of element types gpulab knows, with exact host conversions for the
// reduced-precision floats (fp16, bf16, fp8 e4m3/e5m2). TF32 is a math mode, not a storage
// type: see MathMode.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace gpulab::core {

// X(enum name, short name, safetensors name, bytes per element, is floating point)
#define GPULAB_DTYPES(X)                  \
  X(f64, "fp64", "F64", 8, true)          \
  X(f32, "fp32", "F32", 4, true)          \
  X(f16, "fp16", "F16", 2, true)          \
  X(bf16, "bf16", "BF16", 2, true)        \
  X(f8e4m3, "fp8e4m3", "F8_E4M3", 1, true) \
  X(f8e5m2, "fp8e5m2", "F8_E5M2", 1, true) \
  X(i64, "int64", "I64", 8, false)        \
  X(i32, "int32", "I32", 4, false)        \
  X(i16, "int16", "I16", 2, false)        \
  X(i8, "int8", "I8", 1, false)           \
  X(u8, "uint8", "U8", 1, false)          \
  X(boolean, "bool", "BOOL", 1, false)

enum class DType : uint8_t {
#define GPULAB_DTYPE_ENUM(e, name, st, bytes, is_float) e,
  GPULAB_DTYPES(GPULAB_DTYPE_ENUM)
#undef GPULAB_DTYPE_ENUM
};

// How fp32 matrix products may be computed: exactly, or through TF32 tensor cores.
enum class MathMode : uint8_t { strict_fp32, tf32 };

size_t dtype_size(DType dt);
bool dtype_is_float(DType dt);
std::string_view dtype_name(DType dt);              // "bf16"
std::string_view dtype_safetensors_name(DType dt);  // "BF16"
std::optional<DType> dtype_from_name(std::string_view name);              // "bf16", "fp32", ...
std::optional<DType> dtype_from_safetensors_name(std::string_view name);  // "BF16", "F32", ...

// Bit-exact conversions. float -> narrow rounds to nearest even; NaN stays NaN.
// fp8 e4m3 has no infinity: out-of-range values saturate to ±448 when `saturate`, else NaN
// (the two modes of __nv_cvt_float_to_fp8). e5m2 overflows to ±inf unless `saturate`.
uint16_t float_to_f16_bits(float x);
float f16_bits_to_float(uint16_t bits);
uint16_t float_to_bf16_bits(float x);
float bf16_bits_to_float(uint16_t bits);
uint8_t float_to_f8e4m3_bits(float x, bool saturate = true);
float f8e4m3_bits_to_float(uint8_t bits);
uint8_t float_to_f8e5m2_bits(float x, bool saturate = true);
float f8e5m2_bits_to_float(uint8_t bits);

// Reads element `index` of a buffer of type `dt` as float (for references and printing).
double load_as_double(const void* data, DType dt, size_t index);

}  // namespace gpulab::core
