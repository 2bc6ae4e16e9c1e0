// config.json of arbitrary bytes: parsed or refused with an InputError; a parsed config has a
// consistent, positive shape and finite rotation frequencies.
#include <cmath>

#include "fuzz/fuzz_util.h"
#include "llm/config.h"

using namespace gpulab;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::refuse_or_pass([&] {
    const llm::LlamaConfig c = llm::parse_config(std::string(fuzz::as_text(data, size)), "config.json");
    fuzz::check(c.hidden_size > 0 && c.num_layers > 0 && c.num_heads > 0 && c.num_kv_heads > 0 && c.head_dim > 0 &&
                    c.vocab_size > 0 && c.intermediate_size > 0,
                "a parsed config has a positive shape");
    fuzz::check(c.num_heads % c.num_kv_heads == 0, "query heads are a multiple of KV heads");
    fuzz::check(c.max_position_embeddings > 0, "the context is positive");
    fuzz::check(c.num_params() > 0, "the parameter count is positive (and did not overflow)");
    (void)llm::weight_specs(c);
    for (const float freq : llm::rope_inv_freq(c.rope, c.head_dim))
      fuzz::check(std::isfinite(freq), "rotation frequencies are finite");
  });
  return 0;
}
