// A .safetensors file of arbitrary bytes: the header is validated and every tensor's data span
// lies inside the file.
#include <algorithm>

#include "core/safetensors.h"
#include "fuzz/fuzz_util.h"

using namespace gpulab;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = fuzz::scratch_dir() / "model.safetensors";
  fuzz::write_bytes(path, fuzz::as_text(data, size));
  fuzz::refuse_or_pass([&] {
    const core::SafetensorsFile file(path);
    for (const auto& t : file.tensors()) {
      const auto bytes = file.data(t);
      fuzz::check(bytes.size() == t.bytes(), "data span has the tensor's size");
      fuzz::check(std::equal(bytes.begin(), bytes.end(), data + 8 + file.header_bytes() + t.data_begin),
                  "the data span holds the file's bytes at the tensor's offsets");
      fuzz::check(t.numel() * core::dtype_size(t.dtype) == t.bytes(), "shape x dtype = bytes");
    }
  });
  return 0;
}
