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

// Whether an EOI marker follows the first scan's data. Walks the marker segments up to the first
// SOS so that an EXIF thumbnail's own markers (inside APP1) do not count.
bool has_end_marker(std::span<const uint8_t> b) {
  size_t i = 2;  // after SOI
  for (;;) {
    if (i + 4 > b.size() || b[i] != 0xFF) return false;
    const uint8_t marker = b[i + 1];
    if (marker == 0xFF) {  // fill byte
      ++i;
      continue;
    }
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD8)) {  // markers without a length
      i += 2;
      continue;
    }
    i += 2 + ((size_t(b[i + 2]) << 8) | b[i + 3]);
    if (marker == 0xDA) break;  // SOS: entropy-coded data follows
  }
  // Scan data never holds 0xFF 0xD9 (0xFF is stuffed), so the last one is the EOI.
  for (size_t k = b.size(); k >= i + 2; --k)
    if (b[k - 2] == 0xFF && b[k - 1] == 0xD9) return true;
  return false;
}

// A failed decode can leave the thread's decompressor broken (the next file then reads as 0x0):
// the error comes with a fresh one for the next file.
CorruptImageError corrupt(const std::string& name, const std::string& what) {
  decompressor(true);
  return CorruptImageError(name + ": " + what);
}

JpegSize header_size(tjhandle h, std::span<const uint8_t> bytes, const std::string& name) {
  if (bytes.empty()) throw CorruptImageError(name + ": empty file, not a JPEG");
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(h, bytes.data(), bytes.size(), &width, &height, &subsamp, &colorspace) != 0)
    throw corrupt(name, std::string("not a readable JPEG (") + tjGetErrorStr2(h) + ")");
  if (width <= 0 || height <= 0)
    throw corrupt(name, "JPEG header gives size " + std::to_string(width) + "x" + std::to_string(height));
  // The header alone decides the allocation: a few bytes must not make us reserve gigabytes.
  if (int64_t(width) * height > kMaxJpegPixels)
    throw corrupt(name, "JPEG header gives size " + std::to_string(width) + "x" + std::to_string(height) +
                            ", more than " + std::to_string(kMaxJpegPixels) + " pixels");
  return {width, height};
}

}  // namespace

JpegSize read_jpeg_header(std::span<const uint8_t> bytes, const std::string& name) {
  const JpegSize size = header_size(decompressor(), bytes, name);
  if (!has_end_marker(bytes)) throw CorruptImageError(name + ": JPEG data ends early (no end-of-image marker)");
  return size;
}

Image decode_jpeg(std::span<const uint8_t> bytes, const std::string& name) {
  tjhandle h = decompressor();
  const auto [width, height] = header_size(h, bytes, name);
  Image img{width, height, std::vector<uint8_t>(size_t(width) * height * 3)};
  // STOPONWARNING: a truncated file would otherwise decode "successfully" with grey rows.
  if (tjDecompress2(h, bytes.data(), bytes.size(), img.rgb.data(), width, 0, height, TJPF_RGB,
                    TJFLAG_STOPONWARNING | TJFLAG_ACCURATEDCT) != 0)
    throw corrupt(name, std::string("corrupt JPEG data (") + tjGetErrorStr2(h) + ")");
  return img;
}

size_t file_size_of(const std::filesystem::path& path) {
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) throw core::InputError(path.string() + ": cannot open file (" + ec.message() + ")");
  return size_t(size);
}

void read_file_into(const std::filesystem::path& path, std::span<uint8_t> to) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw core::InputError(path.string() + ": cannot open file");
  if (!to.empty() && !in.read(reinterpret_cast<char*>(to.data()), static_cast<std::streamsize>(to.size())))
    throw core::InputError(path.string() + ": cannot read file (shorter than " + std::to_string(to.size()) + " bytes)");
}

std::vector<uint8_t> read_file_bytes(const std::filesystem::path& path) {
  std::vector<uint8_t> bytes(file_size_of(path));
  read_file_into(path, bytes);
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
