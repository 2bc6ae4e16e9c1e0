// The HTTP API tests on the bf16 CUDA engine (64 concurrent streams included).
#include "common/gpu.h"
#include "llm/cuda_engine.h"
#include "server_tests.h"

namespace {
std::unique_ptr<gpulab::llm::Engine> cuda_engine(const gpulab::llm::WeightSource& w, int64_t kv_tokens) {
  if (!gpulab::core::why_no_device().empty()) return nullptr;  // the test skips, saying so
  gpulab::llm::EngineOptions opt;
  opt.max_kv_tokens = kv_tokens;
  opt.max_batch = 64;
  return std::make_unique<gpulab::llm::CudaEngine>(w, opt);
}
}  // namespace

INSTANTIATE_TEST_SUITE_P(Cuda, ServerTest, ::testing::Values(&cuda_engine));
