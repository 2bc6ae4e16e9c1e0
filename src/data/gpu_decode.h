// Batch JPEG decoders that leave packed RGB8 images in device memory, for the GPU pipeline:
// nvJPEG (the hardware JPEG engines where the GPU has them, else nvJPEG's GPU-hybrid backend) when
// gpulab was built with nvJPEG, and TurboJPEG on CPU threads plus an upload when not.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace gpulab::data {

// One JPEG of a batch: its file bytes (host) and its size, from the header.
struct EncodedJpeg {
  std::span<const uint8_t> bytes;
  int width = 0, height = 0;
};

struct DecodeStats {
  int64_t hardware = 0;  // nvJPEG on the GPU's JPEG engines
  int64_t gpu_hybrid = 0;  // nvJPEG's CUDA backend
  int64_t cpu = 0;         // TurboJPEG: the CPU decoder, or nvJPEG's fallback for what it cannot take
};

class BatchDecoder {
 public:
  virtual ~BatchDecoder() = default;
  // Which decoder runs, for reports: e.g. "nvJPEG hardware", "TurboJPEG (CPU) + upload".
  virtual std::string name() const = 0;
  // Decodes images[i] as packed RGB8 (row pitch width * 3) into the device memory at dst[i], on
  // `stream`. The bytes must stay valid until the stream's work is done. Returns 1 per image that
  // decoded, 0 per image that did not (its dst is then undefined); never throws for bad data.
  virtual std::vector<char> decode(std::span<const EncodedJpeg> images, std::span<uint8_t* const> dst,
                                   cudaStream_t stream) = 0;
  // Images handed to decode() so far, by the path that decoded (or tried last to decode) them.
  virtual DecodeStats stats() const = 0;
};

enum class DecodeBackend {
  automatic,  // nvJPEG when built with it, else TurboJPEG
  cpu,        // TurboJPEG on `threads` threads + upload
  nvjpeg,     // InputError when gpulab was built without nvJPEG
};

bool nvjpeg_built();

// `threads`: CPU decode threads (the TurboJPEG decoder, and nvJPEG's CPU fallbacks).
std::unique_ptr<BatchDecoder> make_batch_decoder(DecodeBackend backend, int threads);

// The TurboJPEG decoder; make_batch_decoder(nvjpeg) when built with nvJPEG.
std::unique_ptr<BatchDecoder> make_cpu_batch_decoder(int threads);
std::unique_ptr<BatchDecoder> make_nvjpeg_batch_decoder(int threads);

}  // namespace gpulab::data
