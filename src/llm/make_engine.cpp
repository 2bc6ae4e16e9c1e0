#include "llm/make_engine.h"

#include "core/error.h"
#include "llm/tp_engine.h"

namespace gpulab::llm {

std::unique_ptr<Engine> make_engine(const WeightSource& weights, const EngineSpec& spec) {
  if (spec.device == "cpu" && spec.tp != 1)
    throw core::InputError("--tp " + std::to_string(spec.tp) + " needs --device cuda (the CPU engine runs unsharded)");
  if (spec.device == "cpu") return make_cpu_engine(weights, spec.cpu_kv_tokens, spec.threads);
  if (spec.device == "cuda" && spec.tp != 1) return std::make_unique<TpEngine>(weights, spec.cuda, tp_devices(spec.tp));
  if (spec.device == "cuda") return std::make_unique<CudaEngine>(weights, spec.cuda);
  throw core::InputError("unknown device \"" + spec.device + "\" (use cpu or cuda)");
}

}  // namespace gpulab::llm
