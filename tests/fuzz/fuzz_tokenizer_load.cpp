// tokenizer.json of arbitrary bytes: loaded or refused with an InputError; a loaded tokenizer
// encodes and decodes text without crashing.
#include "fuzz/fuzz_util.h"
#include "llm/tokenizer.h"

using namespace gpulab;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = fuzz::scratch_dir() / "tokenizer.json";
  fuzz::write_bytes(path, fuzz::as_text(data, size));
  fuzz::refuse_or_pass([&] {
    const llm::Tokenizer tok = llm::Tokenizer::from_file(path);
    const std::vector<int32_t> ids = tok.encode("Hello, world! 123 héllo \xe4\xb8\xad \xff", true);
    for (int32_t id : ids) fuzz::check(id >= 0 && id < tok.vocab_size(), "encoded ids are in the vocabulary");
    (void)tok.decode(ids);
  });
  return 0;
}
