#include "core/dtype.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

namespace gpulab::core {

namespace {

struct DTypeInfo {
  std::string_view name;
  std::string_view safetensors_name;
  size_t bytes;
  bool is_float;
};

constexpr DTypeInfo kDTypeInfo[] = {
#define GPULAB_DTYPE_INFO(e, name, st, bytes, is_float) {name, st, bytes, is_float},
    GPULAB_DTYPES(GPULAB_DTYPE_INFO)
#undef GPULAB_DTYPE_INFO
};

const DTypeInfo& info(DType dt) { return kDTypeInfo[static_cast<size_t>(dt)]; }

// A binary floating-point format narrower than fp32: 1 sign bit, `exp_bits`, `man_bits`.
struct MiniFloat {
  int exp_bits;
  int man_bits;
  bool has_inf;         // IEEE-style: all-ones exponent means inf (mantissa 0) or NaN
  uint32_t nan_bits;    // canonical NaN (without sign)
  int bias() const { return (1 << (exp_bits - 1)) - 1; }
  // Largest finite magnitude as bits. e4m3 (no inf) reserves only mantissa all-ones at the
  // top exponent for NaN, so S.1111.110 = 448 is its maximum.
  uint32_t max_finite_bits() const {
    uint32_t top_exp = (1u << exp_bits) - 1;
    if (has_inf) return ((top_exp - 1) << man_bits) | ((1u << man_bits) - 1);
    return (top_exp << man_bits) | ((1u << man_bits) - 2);
  }
  uint32_t inf_bits() const { return ((1u << exp_bits) - 1) << man_bits; }
};

constexpr MiniFloat kF16{5, 10, true, 0x7E00};
constexpr MiniFloat kBF16{8, 7, true, 0x7FC0};
constexpr MiniFloat kE4M3{4, 3, false, 0x7F};
constexpr MiniFloat kE5M2{5, 2, true, 0x7E};

double decode(const MiniFloat& f, uint32_t bits) {
  const int total = 1 + f.exp_bits + f.man_bits;
  const bool negative = (bits >> (total - 1)) & 1u;
  const uint32_t exp = (bits >> f.man_bits) & ((1u << f.exp_bits) - 1);
  const uint32_t man = bits & ((1u << f.man_bits) - 1);
  const uint32_t top_exp = (1u << f.exp_bits) - 1;
  double value;
  if (f.has_inf && exp == top_exp) {
    value = man == 0 ? std::numeric_limits<double>::infinity()
                     : std::numeric_limits<double>::quiet_NaN();
  } else if (!f.has_inf && exp == top_exp && man == (1u << f.man_bits) - 1) {
    value = std::numeric_limits<double>::quiet_NaN();
  } else if (exp == 0) {
    value = std::ldexp(static_cast<double>(man), 1 - f.bias() - f.man_bits);
  } else {
    value = std::ldexp(static_cast<double>(man | (1u << f.man_bits)),
                       static_cast<int>(exp) - f.bias() - f.man_bits);
  }
  return negative ? -value : value;
}

// Round-to-nearest-even encode; exact because every fp32 value is exact in double and the
// scaled significand below is an exact integer plus fraction.
uint32_t encode(const MiniFloat& f, float x, bool saturate) {
  const int total = 1 + f.exp_bits + f.man_bits;
  const uint32_t sign = std::signbit(x) ? (1u << (total - 1)) : 0u;
  if (std::isnan(x)) return sign | f.nan_bits;
  const double a = std::fabs(static_cast<double>(x));
  const double max_finite = decode(f, f.max_finite_bits());
  const uint32_t overflow_bits =
      saturate || !f.has_inf ? (saturate ? f.max_finite_bits() : f.nan_bits) : f.inf_bits();
  if (std::isinf(a)) return sign | (f.has_inf && !saturate ? f.inf_bits() : overflow_bits);
  if (a == 0.0) return sign;

  // Exponent of the value, clamped at the subnormal range.
  const int min_normal_exp = 1 - f.bias();
  int e = std::ilogb(a);
  if (e < min_normal_exp) e = min_normal_exp;
  // Significand scaled so that the kept bits are the integer part.
  const double scaled = std::ldexp(a, f.man_bits - e);
  double kept = std::floor(scaled);
  const double rest = scaled - kept;
  if (rest > 0.5 || (rest == 0.5 && std::fmod(kept, 2.0) != 0.0)) kept += 1.0;
  const double rounded = std::ldexp(kept, e - f.man_bits);
  if (rounded > max_finite) return sign | overflow_bits;

  uint32_t man = static_cast<uint32_t>(kept);
  uint32_t exp_field;
  if (man >= (2u << f.man_bits)) {  // rounding carried into the next binade
    man >>= 1;
    ++e;
  }
  if (man < (1u << f.man_bits)) {
    exp_field = 0;  // subnormal
  } else {
    exp_field = static_cast<uint32_t>(e + f.bias());
    man &= (1u << f.man_bits) - 1;
  }
  return sign | (exp_field << f.man_bits) | man;
}

}  // namespace

size_t dtype_size(DType dt) { return info(dt).bytes; }
bool dtype_is_float(DType dt) { return info(dt).is_float; }
std::string_view dtype_name(DType dt) { return info(dt).name; }
std::string_view dtype_safetensors_name(DType dt) { return info(dt).safetensors_name; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (size_t i = 0; i < std::size(kDTypeInfo); ++i)
    if (kDTypeInfo[i].name == name) return static_cast<DType>(i);
  return std::nullopt;
}

std::optional<DType> dtype_from_safetensors_name(std::string_view name) {
  for (size_t i = 0; i < std::size(kDTypeInfo); ++i)
    if (kDTypeInfo[i].safetensors_name == name) return static_cast<DType>(i);
  return std::nullopt;
}

uint16_t float_to_f16_bits(float x) { return static_cast<uint16_t>(encode(kF16, x, false)); }
float f16_bits_to_float(uint16_t bits) { return static_cast<float>(decode(kF16, bits)); }
uint16_t float_to_bf16_bits(float x) { return static_cast<uint16_t>(encode(kBF16, x, false)); }
float bf16_bits_to_float(uint16_t bits) { return std::bit_cast<float>(uint32_t(bits) << 16); }
uint8_t float_to_f8e4m3_bits(float x, bool saturate) {
  return static_cast<uint8_t>(encode(kE4M3, x, saturate));
}
float f8e4m3_bits_to_float(uint8_t bits) { return static_cast<float>(decode(kE4M3, bits)); }
uint8_t float_to_f8e5m2_bits(float x, bool saturate) {
  return static_cast<uint8_t>(encode(kE5M2, x, saturate));
}
float f8e5m2_bits_to_float(uint8_t bits) { return static_cast<float>(decode(kE5M2, bits)); }

double load_as_double(const void* data, DType dt, size_t index) {
  const auto* bytes = static_cast<const uint8_t*>(data) + index * dtype_size(dt);
  auto read = [bytes]<class T>(T*) {
    T v;
    std::memcpy(&v, bytes, sizeof(T));
    return v;
  };
  switch (dt) {
    case DType::f64: return read((double*)nullptr);
    case DType::f32: return read((float*)nullptr);
    case DType::f16: return f16_bits_to_float(read((uint16_t*)nullptr));
    case DType::bf16: return bf16_bits_to_float(read((uint16_t*)nullptr));
    case DType::f8e4m3: return f8e4m3_bits_to_float(bytes[0]);
    case DType::f8e5m2: return f8e5m2_bits_to_float(bytes[0]);
    case DType::i64: return static_cast<double>(read((int64_t*)nullptr));
    case DType::i32: return read((int32_t*)nullptr);
    case DType::i16: return read((int16_t*)nullptr);
    case DType::i8: return read((int8_t*)nullptr);
    case DType::u8: return bytes[0];
    case DType::boolean: return bytes[0] != 0;
  }
  return 0.0;
}

}  // namespace gpulab::core
