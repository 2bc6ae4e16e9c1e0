// The HTTP API tests on the float32 CPU reference engine.
#include "llm/engine.h"
#include "server_tests.h"

namespace {
std::unique_ptr<gpulab::llm::Engine> cpu_engine(const gpulab::llm::WeightSource& w, int64_t kv_tokens) {
  return gpulab::llm::make_cpu_engine(w, kv_tokens, 2);
}
}  // namespace

INSTANTIATE_TEST_SUITE_P(Cpu, ServerTest, ::testing::Values(&cpu_engine));
