#include "data/jpeg.h"

#include <turbojpeg.h>

#include <fstream>
#include <memory>

namespace gpulab::data {

namespace {

struct HandleDeleter {
  void operator()(void* h) const { tjDestroy(h); }
};
using Handle = std::unique_ptr<void, HandleDeleter>;

// TurboJPEG handles are not thread-safe; one of each kind per thread, made on first use.
// A decode that fails can leave the handle's state behind (the next file then reads as 0x0),
// so `fresh` replaces it.
tjhandle decompressor(bool fresh = false) {
  thread_local Handle h;
  if (!h || fresh) h.reset(tjInitDecompress());
  if (!h) throw core::Error("cannot create a TurboJPEG decompressor: " + std::string(tjGetErrorStr2(nullptr)));
  return h.get();
}

tjhandle compressor() {
  thread_local Handle h(tjInitCompress());
  if (!h) throw core::Error("cannot create a TurboJPEG compressor: " + std::string(tjGetErrorStr2(nullptr)));
  return h.get();
}

}  // namespace

Image decode_jpeg(std::span<const uint8_t> bytes, const std::string& name) {
  if (bytes.empty()) throw CorruptImageError(name + ": empty file, not a JPEG");
  tjhandle h = decompressor();
  auto corrupt = [&](const std::string& what) {
    const std::string message = name + ": " + what;
    decompressor(true);
    return CorruptImageError(message);
  };
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(h, bytes.data(), bytes.size(), &width, &height, &subsamp, &colorspace) != 0)
    throw corrupt(std::string("not a readable JPEG (") + tjGetErrorStr2(h) + ")");
  if (width <= 0 || height <= 0)
    throw corrupt("JPEG header gives size " + std::to_string(width) + "x" + std::to_string(height));
  // The header alone decides the allocation: a few bytes must not make us reserve gigabytes.
  if (int64_t(width) * height > kMaxJpegPixels)
    throw corrupt("JPEG header gives size " + std::to_string(width) + "x" + std::to_string(height) + ", more than " +
                  std::to_string(kMaxJpegPixels) + " pixels");
  Image img{width, height, std::vector<uint8_t>(size_t(width) * height * 3)};
  // STOPONWARNING: a truncated file would otherwise decode "successfully" with grey rows.
  if (tjDecompress2(h, bytes.data(), bytes.size(), img.rgb.data(), width, 0, height, TJPF_RGB,
                    TJFLAG_STOPONWARNING | TJFLAG_ACCURATEDCT) != 0)
    throw corrupt(std::string("corrupt JPEG data (") + tjGetErrorStr2(h) + ")");
  return img;
}

std::vector<uint8_t> read_file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw core::InputError(path.string() + ": cannot open file");
  const auto size = static_cast<size_t>(in.tellg());
  std::vector<uint8_t> bytes(size);
  in.seekg(0);
  if (size && !in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size)))
    throw core::InputError(path.string() + ": cannot read file");
  return bytes;
}

Image read_jpeg(const std::filesystem::path& path) {
  const std::vector<uint8_t> bytes = read_file_bytes(path);
  return decode_jpeg(bytes, path.string());
}

std::vector<uint8_t> encode_jpeg(const Image& image, int quality) {
  if (image.width <= 0 || image.height <= 0 || image.rgb.size() != size_t(image.width) * image.height * 3)
    throw core::Error("encode_jpeg: image buffer does not match its size");
  tjhandle h = compressor();
  unsigned char* out = nullptr;
  unsigned long out_size = 0;
  if (tjCompress2(h, image.rgb.data(), image.width, 0, image.height, TJPF_RGB, &out, &out_size, TJSAMP_420,
                  quality, TJFLAG_ACCURATEDCT) != 0) {
    tjFree(out);
    throw core::Error(std::string("JPEG encode failed: ") + tjGetErrorStr2(h));
  }
  std::vector<uint8_t> bytes(out, out + out_size);
  tjFree(out);
  return bytes;
}

}  // namespace gpulab::data
