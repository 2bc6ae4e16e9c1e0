// The bound the data-parallel GPU tests hold every reduced gradient to (allreduce_check.h), against
// a reduction emulated here the way the wire does it: shares rounded into the wire's dtype, summed
// in it rank after rank.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "train/allreduce_check.h"

using namespace gpulab;
using gpulab::train::fixtures::check_average;

namespace {

float round_to(core::DType wire, float x) {
  if (wire == core::DType::bf16) return core::bf16_bits_to_float(core::float_to_bf16_bits(x));
  if (wire == core::DType::f16) return core::f16_bits_to_float(core::float_to_f16_bits(x));
  return x;
}

// Gradients of every magnitude NCCL meets in training, 1e-9 to 1e-1, of either sign.
std::vector<std::vector<float>> gradients(int world, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> exponent(-9, -1);
  std::vector<std::vector<float>> g(size_t(world), std::vector<float>(n, 0.f));
  for (auto& rank : g)
    for (auto& x : rank) x = float((rng() & 1 ? 1 : -1) * std::pow(10.0, exponent(rng)));
  return g;
}

std::vector<float> emulated_average(const std::vector<std::vector<float>>& locals, core::DType wire) {
  const float scale = 1.f / float(locals.size());
  std::vector<float> out(locals[0].size());
  for (size_t i = 0; i < out.size(); ++i) {
    float acc = round_to(wire, locals[0][i] * scale);
    for (size_t r = 1; r < locals.size(); ++r) acc = round_to(wire, acc + round_to(wire, locals[r][i] * scale));
    out[i] = acc;
  }
  return out;
}

}  // namespace

TEST(AllReduceCheck, HoldsForTheWireRoundingAndCatchesWrongReductions) {
  for (const core::DType wire : {core::DType::f32, core::DType::bf16, core::DType::f16})
    for (const int world : {2, 3, 8}) {
      SCOPED_TRACE(std::string(core::dtype_name(wire)) + " world " + std::to_string(world));
      const auto locals = gradients(world, 100000, 7 + uint64_t(world));
      const std::vector<float> reduced = emulated_average(locals, wire);
      const auto ok = check_average(locals, reduced, wire);
      EXPECT_EQ(ok.bad, 0u) << "element " << ok.first << ": " << ok.got << " for " << ok.want << " (bound " << ok.bound << ")";
      std::vector<float> sum = reduced, stale = reduced, nudged = reduced;
      for (auto& x : sum) x *= float(world);  // summed, not averaged
      for (size_t i = 0; i < stale.size(); i += 97) stale[i] = locals[0][i] * 0.5f + 1e-3f;  // a read of other bytes
      nudged[500] = reduced[500] * 1.1f + (reduced[500] == 0 ? 1e-3f : 0.f);
      EXPECT_GT(check_average(locals, sum, wire).bad, 90000u);
      EXPECT_GT(check_average(locals, stale, wire).bad, 1000u);
      const auto one = check_average(locals, nudged, wire);
      EXPECT_EQ(one.bad, 1u);
      EXPECT_EQ(one.first, 500u);
    }
}
