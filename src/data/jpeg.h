// JPEG decode/encode through libjpeg-turbo's TurboJPEG API, into and from packed RGB8 (HWC).
// A file that is not a complete, valid JPEG throws CorruptImageError, never crashes: libjpeg
// warnings (truncated data, bad Huffman codes) count as corruption too.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"

namespace gpulab::data {

// Packed 8-bit RGB, row-major, `width * height * 3` bytes.
struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;
  uint8_t at(int y, int x, int c) const { return rgb[(size_t(y) * width + x) * 3 + c]; }
};

// A file that exists but does not decode as a JPEG. `name` is the file, for the message.
class CorruptImageError : public core::InputError {
 public:
  using core::InputError::InputError;
};

// Larger images are refused as corrupt (16384 x 16384; ImageNet's largest is under 5000 x 5000).
inline constexpr int64_t kMaxJpegPixels = int64_t{1} << 28;

// `name` only labels the error message.
Image decode_jpeg(std::span<const uint8_t> bytes, const std::string& name);
Image read_jpeg(const std::filesystem::path& path);  // I/O failures throw core::InputError

// Width and height from the header, without decoding. Throws CorruptImageError for what
// decode_jpeg would reject before or at the end of the data: not a JPEG, or no EOI marker after
// the scan data (a truncated file). Corrupt entropy-coded data is only found by decoding.
struct JpegSize {
  int width = 0, height = 0;
};
JpegSize read_jpeg_header(std::span<const uint8_t> bytes, const std::string& name);

// 4:2:0 chroma subsampling as cameras and ImageNet's files use; quality 1..100.
std::vector<uint8_t> encode_jpeg(const Image& image, int quality = 90);

// I/O failures throw core::InputError naming the file.
std::vector<uint8_t> read_file_bytes(const std::filesystem::path& path);
size_t file_size_of(const std::filesystem::path& path);
// The file's first `to.size()` bytes (all of it, when `to` is as large as file_size_of said).
void read_file_into(const std::filesystem::path& path, std::span<uint8_t> to);

}  // namespace gpulab::data
