// The HTTP API tests on the bf16 CUDA engine (64 concurrent streams included).
#include "common/gpu.h"
#include "llm/cuda_engine.h"
#include "llm/tp_engine.h"
#include "server_tests.h"

namespace {
std::unique_ptr<gpulab::llm::Engine> cuda_engine(const gpulab::llm::WeightSource& w, int64_t kv_tokens) {
  if (!gpulab::core::why_no_device().empty()) return nullptr;  // the test skips, saying so
  gpulab::llm::EngineOptions opt;
  opt.max_kv_tokens = kv_tokens;
  opt.max_batch = 64;
  return std::make_unique<gpulab::llm::CudaEngine>(w, opt);
}
// Tensor parallel over 4 or 2 GPUs when there are (the model has 4 heads), else one rank through NCCL.
std::unique_ptr<gpulab::llm::Engine> tp_engine(const gpulab::llm::WeightSource& w, int64_t kv_tokens) {
  if (!gpulab::core::why_no_device().empty()) return nullptr;
  const int gpus = gpulab::core::require_devices();
  gpulab::llm::EngineOptions opt;
  opt.max_kv_tokens = kv_tokens;
  opt.max_batch = 64;
  return std::make_unique<gpulab::llm::TpEngine>(w, opt, gpulab::llm::tp_devices(gpus >= 4 ? 4 : gpus >= 2 ? 2 : 1));
}
}  // namespace

INSTANTIATE_TEST_SUITE_P(Cuda, ServerTest, ::testing::Values(&cuda_engine));
INSTANTIATE_TEST_SUITE_P(TensorParallel, ServerTest, ::testing::Values(&tp_engine));
