#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "core/dtype.h"

using namespace gpulab::core;

TEST(DType, TableNamesRoundTrip) {
  for (auto name : {"F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "I64", "BOOL"}) {
    auto dt = dtype_from_safetensors_name(name);
    ASSERT_TRUE(dt) << name;
    EXPECT_EQ(dtype_safetensors_name(*dt), name);
  }
  EXPECT_FALSE(dtype_from_safetensors_name("F4"));
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::f8e4m3), 1u);
  EXPECT_EQ(*dtype_from_name("bf16"), DType::bf16);
}

TEST(DType, Fp16KnownBits) {
  EXPECT_EQ(float_to_f16_bits(1.0f), 0x3C00);
  EXPECT_EQ(float_to_f16_bits(-2.0f), 0xC000);
  EXPECT_EQ(float_to_f16_bits(0.1f), 0x2E66);
  EXPECT_EQ(float_to_f16_bits(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_f16_bits(65519.0f), 0x7BFF);    // below the midpoint to infinity
  EXPECT_EQ(float_to_f16_bits(65520.0f), 0x7C00);    // the midpoint rounds to even: inf
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1.0f, -25)), 0x0000);  // tie to even: zero
  EXPECT_EQ(float_to_f16_bits(std::ldexp(3.0f, -26)), 0x0001);
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(float_to_f16_bits(-0.0f), 0x8000);
  EXPECT_EQ(float_to_f16_bits(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(float_to_f16_bits(-std::numeric_limits<float>::infinity()), 0xFC00);
  const uint16_t nan = float_to_f16_bits(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x03FF, 0);
  EXPECT_TRUE(std::isnan(f16_bits_to_float(0x7E00)));
  EXPECT_TRUE(std::isinf(f16_bits_to_float(0x7C00)));
  EXPECT_EQ(f16_bits_to_float(0x0001), std::ldexp(1.0f, -24));
}

TEST(DType, Bf16KnownBits) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16_bits(0.1f), 0x3DCD);
  EXPECT_EQ(float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)), 0x3F80);       // tie to even (down)
  EXPECT_EQ(float_to_bf16_bits(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);   // tie to even (up)
  EXPECT_EQ(float_to_bf16_bits(std::bit_cast<float>(0x000116C2u)), 0x0001);  // fp32 denormal
  EXPECT_EQ(float_to_bf16_bits(std::bit_cast<float>(0x7F7FFFFFu)), 0x7F80);  // FLT_MAX rounds to inf
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(std::nanf("")))));
  EXPECT_EQ(bf16_bits_to_float(0x3F80), 1.0f);
}

TEST(DType, Fp8E4M3KnownBits) {
  EXPECT_EQ(float_to_f8e4m3_bits(1.0f), 0x38);
  EXPECT_EQ(float_to_f8e4m3_bits(-1.5f), 0xBC);
  EXPECT_EQ(float_to_f8e4m3_bits(448.0f), 0x7E);
  EXPECT_EQ(float_to_f8e4m3_bits(464.0f), 0x7E);          // midpoint to the NaN code: to even
  EXPECT_EQ(float_to_f8e4m3_bits(1000.0f, true), 0x7E);   // saturate
  EXPECT_EQ(float_to_f8e4m3_bits(1000.0f, false), 0x7F);  // no saturation: NaN (no inf in e4m3)
  EXPECT_EQ(float_to_f8e4m3_bits(std::numeric_limits<float>::infinity(), true), 0x7E);
  EXPECT_EQ(float_to_f8e4m3_bits(std::ldexp(1.0f, -9)), 0x01);   // smallest subnormal
  EXPECT_EQ(float_to_f8e4m3_bits(std::ldexp(1.0f, -6)), 0x08);   // smallest normal
  EXPECT_EQ(float_to_f8e4m3_bits(std::nanf("")) & 0x7F, 0x7F);
  EXPECT_TRUE(std::isnan(f8e4m3_bits_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(f8e4m3_bits_to_float(0xFF)));
  EXPECT_EQ(f8e4m3_bits_to_float(0x7E), 448.0f);
  EXPECT_EQ(f8e4m3_bits_to_float(0x78), 256.0f);  // exponent all-ones is a normal binade in e4m3
}

TEST(DType, Fp8E5M2KnownBits) {
  EXPECT_EQ(float_to_f8e5m2_bits(1.0f), 0x3C);
  EXPECT_EQ(float_to_f8e5m2_bits(57344.0f), 0x7B);
  EXPECT_EQ(float_to_f8e5m2_bits(1e6f, false), 0x7C);  // overflow to inf
  EXPECT_EQ(float_to_f8e5m2_bits(1e6f, true), 0x7B);   // saturate
  EXPECT_EQ(float_to_f8e5m2_bits(-std::numeric_limits<float>::infinity(), false), 0xFC);
  EXPECT_EQ(float_to_f8e5m2_bits(std::ldexp(1.0f, -16)), 0x01);
  EXPECT_TRUE(std::isinf(f8e5m2_bits_to_float(0x7C)));
  EXPECT_TRUE(std::isnan(f8e5m2_bits_to_float(0x7E)));
}

// Every finite, non-NaN code of each narrow format must decode and re-encode to itself.
TEST(DType, ExhaustiveRoundTrip) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = f16_bits_to_float(static_cast<uint16_t>(b));
    if (!std::isnan(f)) {
      ASSERT_EQ(float_to_f16_bits(f), b) << std::hex << b;
    }
    const float g = bf16_bits_to_float(static_cast<uint16_t>(b));
    if (!std::isnan(g)) {
      ASSERT_EQ(float_to_bf16_bits(g), b) << std::hex << b;
    }
  }
  for (uint32_t b = 0; b < 0x100; ++b) {
    const float f = f8e4m3_bits_to_float(static_cast<uint8_t>(b));
    if (!std::isnan(f)) {
      ASSERT_EQ(float_to_f8e4m3_bits(f, false), b) << std::hex << b;
    }
    const float g = f8e5m2_bits_to_float(static_cast<uint8_t>(b));
    if (!std::isnan(g)) {
      ASSERT_EQ(float_to_f8e5m2_bits(g, false), b) << std::hex << b;
    }
  }
}

TEST(DType, LoadAsDouble) {
  const uint16_t bf[] = {0x3F80, 0xC000};
  EXPECT_EQ(load_as_double(bf, DType::bf16, 1), -2.0);
  const int64_t ints[] = {7, -9};
  EXPECT_EQ(load_as_double(ints, DType::i64, 1), -9.0);
}
