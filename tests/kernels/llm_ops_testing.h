// Helpers for the LLM op tests: random inputs rounded through a dtype, device copies,
// poisoned outputs and an every-element comparison with atol + rtol·|ref|.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/memory.h"
#include "kernels/rope.h"

namespace gpulab::kernels::testing {

using core::DType;

inline float round_to(float x, DType dt) {
  switch (dt) {
    case DType::bf16: return core::bf16_bits_to_float(core::float_to_bf16_bits(x));
    case DType::f16: return core::f16_bits_to_float(core::float_to_f16_bits(x));
    case DType::f8e4m3: return core::f8e4m3_bits_to_float(core::float_to_f8e4m3_bits(x));
    default: return x;
  }
}

// Unit roundoff of a storage type (half an ulp at 1).
inline float unit_roundoff(DType dt) {
  switch (dt) {
    case DType::bf16: return 1.0f / 256;
    case DType::f16: return 1.0f / 2048;
    default: return 1.0f / (1 << 23);
  }
}

inline std::vector<uint8_t> to_bytes(const std::vector<float>& v, DType dt) {
  std::vector<uint8_t> out(v.size() * core::dtype_size(dt));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::f32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else if (dt == DType::f8e4m3) {
      out[i] = core::float_to_f8e4m3_bits(v[i]);
    } else {
      const uint16_t b = dt == DType::bf16 ? core::float_to_bf16_bits(v[i]) : core::float_to_f16_bits(v[i]);
      std::memcpy(out.data() + 2 * i, &b, 2);
    }
  }
  return out;
}

// A device tensor and the float values it holds (already rounded to its dtype).
struct DeviceTensor {
  DType dtype;
  std::vector<float> host;
  core::DeviceBuffer<std::byte> device;

  DeviceTensor(std::vector<float> values, DType dt) : dtype(dt), host(std::move(values)) {
    for (float& x : host) x = round_to(x, dt);
    const auto bytes = to_bytes(host, dt);
    device = core::DeviceBuffer<std::byte>(bytes.size());
    GPULAB_CHECK(cudaMemcpy(device.get(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
  }
  // An output: NaN everywhere (0xFF bytes are NaN in fp32, fp16 and bf16).
  static DeviceTensor poisoned(size_t n, DType dt) {
    DeviceTensor t(std::vector<float>(n, 0.f), dt);
    GPULAB_CHECK(cudaMemset(t.device.get(), 0xFF, t.device.bytes()));
    return t;
  }
  void* get() { return device.get(); }
  std::vector<float> download() const {
    std::vector<uint8_t> bytes(device.bytes());
    GPULAB_CHECK(cudaDeviceSynchronize());
    GPULAB_CHECK(cudaMemcpy(bytes.data(), device.get(), bytes.size(), cudaMemcpyDeviceToHost));
    std::vector<float> out(host.size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(core::load_as_double(bytes.data(), dtype, i));
    return out;
  }
};

inline std::vector<float> uniform(size_t n, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Every element finite and within atol + rtol·|want|; reports the first few misses.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, float atol, float rtol,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool ok = std::isfinite(got[i]) && std::abs(got[i] - want[i]) <= atol + rtol * std::abs(want[i]);
    if (!ok && ++bad <= 5) ADD_FAILURE() << what << " element " << i << ": got " << got[i] << ", want " << want[i];
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements out of tolerance";
}

inline std::string dtype_label(DType dt) { return std::string(core::dtype_name(dt)); }

// The rope_table of positions 0 .. positions-1 at these frequencies (head_dim / 2 of them).
inline core::DeviceBuffer<float2> device_rope_table(const std::vector<float>& inv_freq, int64_t positions) {
  core::DeviceBuffer<float> d_inv(inv_freq.size());
  GPULAB_CHECK(cudaMemcpy(d_inv.get(), inv_freq.data(), inv_freq.size() * 4, cudaMemcpyHostToDevice));
  core::DeviceBuffer<float2> table(positions * inv_freq.size());
  rope_table(table.get(), d_inv.get(), positions, 2 * static_cast<int64_t>(inv_freq.size()), nullptr);
  GPULAB_CHECK(cudaDeviceSynchronize());
  return table;
}

}  // namespace gpulab::kernels::testing
