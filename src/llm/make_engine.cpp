#include "llm/make_engine.h"

#include "core/error.h"

namespace gpulab::llm {

std::unique_ptr<Engine> make_engine(const WeightSource& weights, const EngineSpec& spec) {
  if (spec.device == "cpu") return make_cpu_engine(weights, spec.cpu_kv_tokens, spec.threads);
  if (spec.device == "cuda") return std::make_unique<CudaEngine>(weights, spec.cuda);
  throw core::InputError("unknown device \"" + spec.device + "\" (use cpu or cuda)");
}

}  // namespace gpulab::llm
