// tokenizer.json of arbitrary bytes: loaded or refused with an InputError; a loaded tokenizer
// encodes and decodes text without crashing: a fixed text, and the file's own bytes, which hold
// its added tokens' contents beside spaces and word characters (their lstrip / rstrip /
// single_word matching), its pattern strings and whatever the fuzzer wrote.
#include "fuzz/fuzz_util.h"
#include "llm/tokenizer.h"

using namespace gpulab;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = fuzz::scratch_dir() / "tokenizer.json";
  const std::string_view file = fuzz::as_text(data, size);
  fuzz::write_bytes(path, file);
  fuzz::refuse_or_pass([&] {
    const llm::Tokenizer tok = llm::Tokenizer::from_file(path);
    for (const std::string_view text : {std::string_view("Hello, world! 123 héllo \xe4\xb8\xad \xff"), file}) {
      const std::vector<int32_t> ids = tok.encode(text, true);
      for (int32_t id : ids) fuzz::check(id >= 0 && id < tok.vocab_size(), "encoded ids are in the vocabulary");
      (void)tok.decode(ids);
    }
  });
  return 0;
}
