// bench llm's fp8 prefill GEMM table on the CPU: the linear layers it times are the engine's, in
// the shapes the checkpoint's tensors give them, whole and per tensor-parallel rank; and the bytes
// its decode floor counts, in bf16 and fp8.
#include <gtest/gtest.h>

#include <map>

#include "core/error.h"
#include "llm/bench_llm.h"
#include "llm/fixtures.h"
#include "llm/tensor_parallel.h"

namespace gpulab::llm {
namespace {

struct Expected {
  const char* name;
  int64_t n, k;
  bool into_residual;
};

void expect_shapes(const LlamaConfig& c, const std::vector<Expected>& want) {
  const std::vector<LinearShape> got = fp8_linear_shapes(c);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].name, want[i].name);
    EXPECT_EQ(got[i].n, want[i].n) << want[i].name;
    EXPECT_EQ(got[i].k, want[i].k) << want[i].name;
    EXPECT_EQ(got[i].into_residual, want[i].into_residual) << want[i].name;
  }
}

TEST(BenchLlmGemms, Llama2_7bShapes) {
  expect_shapes(builtin_config("llama2-7b"), {{"qkv", 3 * 4096, 4096, false},
                                              {"o_proj", 4096, 4096, true},
                                              {"gate_up", 2 * 11008, 4096, false},
                                              {"down", 4096, 11008, true}});
}

TEST(BenchLlmGemms, Llama2_70bShapesWholeAndPerRank) {
  const LlamaConfig c = builtin_config("llama2-70b");  // 64 heads, 8 KV heads of 128
  expect_shapes(c, {{"qkv", 8192 + 2 * 1024, 8192, false},
                    {"o_proj", 8192, 8192, true},
                    {"gate_up", 2 * 28672, 8192, false},
                    {"down", 8192, 28672, true}});
  expect_shapes(shard_config(c, shard_layout(c, {0, 2})), {{"qkv", 4096 + 2 * 512, 8192, false},
                                                           {"o_proj", 8192, 4096, true},
                                                           {"gate_up", 28672, 8192, false},
                                                           {"down", 8192, 14336, true}});
  expect_shapes(shard_config(c, shard_layout(c, {3, 8})), {{"qkv", 1024 + 2 * 128, 8192, false},
                                                           {"o_proj", 8192, 1024, true},
                                                           {"gate_up", 2 * 3584, 8192, false},
                                                           {"down", 8192, 3584, true}});
}

// Independently of the config arithmetic: the fused layers stack the checkpoint's tensors
// ([out, in] each) and take their common input width.
TEST(BenchLlmGemms, ShapesStackTheCheckpointTensors) {
  for (const std::string name : {"llama2-7b", "llama2-13b", "llama3-8b", "llama3-70b"}) {
    const LlamaConfig c = builtin_config(name);
    std::map<std::string, std::vector<int64_t>> spec;
    for (const WeightSpec& w : weight_specs(c)) spec[w.name] = w.shape;
    auto rows = [&](const char* suffix) { return spec.at(layer_weight(0, suffix)).at(0); };
    auto cols = [&](const char* suffix) { return spec.at(layer_weight(0, suffix)).at(1); };
    const std::vector<LinearShape> got = fp8_linear_shapes(c);
    ASSERT_EQ(got.size(), 4u) << name;
    EXPECT_EQ(got[0].n, rows("self_attn.q_proj.weight") + rows("self_attn.k_proj.weight") + rows("self_attn.v_proj.weight")) << name;
    EXPECT_EQ(got[0].k, cols("self_attn.q_proj.weight")) << name;
    EXPECT_EQ(got[1].n, rows("self_attn.o_proj.weight")) << name;
    EXPECT_EQ(got[1].k, cols("self_attn.o_proj.weight")) << name;
    EXPECT_EQ(got[2].n, rows("mlp.gate_proj.weight") + rows("mlp.up_proj.weight")) << name;
    EXPECT_EQ(got[2].k, cols("mlp.gate_proj.weight")) << name;
    EXPECT_EQ(got[3].n, rows("mlp.down_proj.weight")) << name;
    EXPECT_EQ(got[3].k, cols("mlp.down_proj.weight")) << name;
  }
}

// Their FLOPs are prefill_flop's per-layer linear work: nothing left out, nothing counted twice.
TEST(BenchLlmGemms, ShapesCoverThePrefillLinearFlop) {
  const LlamaConfig c = builtin_config("llama2-70b");
  const int64_t t = 2048;
  double per_layer = 0;
  for (const LinearShape& s : fp8_linear_shapes(c)) per_layer += 2.0 * t * s.n * s.k;
  const double attention = 2.0 * 2.0 * c.num_layers * c.q_dim() * (t * (t + 1) / 2.0);
  const double lm_head = 2.0 * c.vocab_size * c.hidden_size;
  const double want = prefill_flop(c, t) - attention - lm_head;
  EXPECT_NEAR(c.num_layers * per_layer, want, 1e-9 * want);
}

// LLaMA-2-7B by hand: 32 layers of q/k/v/o (4096 x 4096) and gate/up/down (11008 x 4096), norms,
// lm_head (32000 x 4096); the embedding table is gathered, not read whole. fp8 halves the linear
// layers and adds a float scale per output channel.
TEST(BenchLlmFloor, DecodeBytesCountTheEnginesWeightFormat) {
  const LlamaConfig c = builtin_config("llama2-7b");
  const double h = 4096, inter = 11008, layers = 32;
  const double linear = layers * (4 * h * h + 3 * h * inter), channels = layers * (4 * h + 2 * inter + h);
  const double rest = 32000 * h + layers * 2 * h + h;  // lm_head, two norms a layer, the final norm
  const double kv_tokens = 1000, kv = kv_tokens * layers * 2 * h * 2, rows = 16 * h * 2;
  EXPECT_DOUBLE_EQ(decode_bytes_per_step(c, 16, kv_tokens), 2 * (linear + rest) + rows + kv);
  EXPECT_DOUBLE_EQ(decode_bytes_per_step(c, 16, kv_tokens, WeightFormat::fp8),
                   linear + 4 * channels + 2 * rest + rows + kv);
}

TEST(BenchLlmGemms, TimingNeedsRows) {
  EXPECT_THROW(time_fp8_linears(builtin_config("llama2-7b"), 0), core::InputError);
}

}  // namespace
}  // namespace gpulab::llm
