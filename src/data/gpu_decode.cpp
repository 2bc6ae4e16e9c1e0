#include "data/gpu_decode.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/memory.h"
#include "data/jpeg.h"
#include "data/parallel.h"

namespace gpulab::data {

namespace {

// TurboJPEG on CPU threads into pinned staging, then one upload per image.
class CpuBatchDecoder : public BatchDecoder {
 public:
  CpuBatchDecoder(int threads, std::string note) : threads_(std::max(1, threads)), note_(std::move(note)) {}
  std::string name() const override { return "TurboJPEG (CPU) + upload" + note_; }
  DecodeStats stats() const override { return {0, 0, decoded_}; }

  std::vector<char> decode(std::span<const EncodedJpeg> images, std::span<uint8_t* const> dst,
                           cudaStream_t stream) override {
    decoded_ += int64_t(images.size());
    std::vector<size_t> offset(images.size() + 1, 0);
    for (size_t i = 0; i < images.size(); ++i)
      offset[i + 1] = offset[i] + size_t(images[i].width) * images[i].height * 3;
    // The previous batch's uploads read the staging buffer until they finish.
    GPULAB_CHECK(cudaStreamSynchronize(stream));
    if (staging_.size() < offset.back()) staging_ = core::PinnedBuffer<uint8_t>(offset.back() + offset.back() / 4);
    std::vector<char> ok(images.size(), 0);
    parallel_for(int64_t(images.size()), threads_, [&](int64_t i) {
      try {
        const Image img = decode_jpeg(images[size_t(i)].bytes, "batch image " + std::to_string(i));
        if (img.width != images[size_t(i)].width || img.height != images[size_t(i)].height) return;
        std::memcpy(staging_.get() + offset[size_t(i)], img.rgb.data(), img.rgb.size());
        ok[size_t(i)] = 1;
      } catch (const CorruptImageError&) {  // ok[i] stays 0: the loader skips the file
      }
    });
    for (size_t i = 0; i < images.size(); ++i)
      if (ok[i])
        GPULAB_CHECK(cudaMemcpyAsync(dst[i], staging_.get() + offset[i], offset[i + 1] - offset[i],
                                     cudaMemcpyHostToDevice, stream));
    return ok;
  }

 private:
  int threads_;
  std::string note_;
  int64_t decoded_ = 0;
  core::PinnedBuffer<uint8_t> staging_;
};

}  // namespace

bool nvjpeg_built() {
#ifdef GPULAB_HAVE_NVJPEG
  return true;
#else
  return false;
#endif
}

std::unique_ptr<BatchDecoder> make_cpu_batch_decoder(int threads) { return std::make_unique<CpuBatchDecoder>(threads, ""); }

std::unique_ptr<BatchDecoder> make_batch_decoder(DecodeBackend backend, int threads) {
  if (backend == DecodeBackend::cpu) return make_cpu_batch_decoder(threads);
  if (backend == DecodeBackend::automatic && !nvjpeg_built())
    return std::make_unique<CpuBatchDecoder>(threads, " (nvJPEG not found at build time)");
#ifdef GPULAB_HAVE_NVJPEG
  return make_nvjpeg_batch_decoder(threads);
#else
  throw core::InputError(
      "nvJPEG not found at build time: this gpulab decodes JPEGs on the CPU (TurboJPEG) and augments on the GPU; "
      "rebuild with the CUDA toolkit's nvJPEG (or -DGPULAB_NVJPEG_ROOT=DIR) for GPU decoding");
#endif
}

}  // namespace gpulab::data
