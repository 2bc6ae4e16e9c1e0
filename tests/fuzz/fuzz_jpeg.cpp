// Arbitrary bytes as a JPEG file: decoded into a buffer of exactly width x height x 3 bytes, or
// refused with CorruptImageError (an InputError); either way the thread's decoder then decodes a
// known good file exactly as before (a failed decode once left the handle broken). The GPU
// loader's check of a file before nvJPEG sees it (read_jpeg_header: the header's size and our own
// walk of the marker segments to the end-of-image marker) refuses the same way, and where both
// accept a file they agree on its size.
#include <optional>

#include "data/jpeg.h"
#include "fuzz/fuzz_util.h"

using namespace gpulab;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<uint8_t> good = [] {
    data::Image img{24, 16, std::vector<uint8_t>(24 * 16 * 3)};
    for (size_t i = 0; i < img.rgb.size(); ++i) img.rgb[i] = uint8_t(i * 7 % 251);
    return data::encode_jpeg(img, 90);
  }();
  static const data::Image reference = data::decode_jpeg(good, "good.jpg");
  std::optional<data::JpegSize> header;
  fuzz::refuse_or_pass([&] { header = data::read_jpeg_header(std::span(data, size), "fuzz.jpg"); });
  fuzz::refuse_or_pass([&] {
    const data::Image img = data::decode_jpeg(std::span(data, size), "fuzz.jpg");
    fuzz::check(img.width > 0 && img.height > 0 && img.rgb.size() == size_t(img.width) * img.height * 3,
                "the image buffer matches its size");
    if (header) fuzz::check(header->width == img.width && header->height == img.height, "the header's size is the image's");
  });
  fuzz::check(data::decode_jpeg(good, "good.jpg").rgb == reference.rgb, "the decoder still decodes a good file");
  return 0;
}
