// nvJPEG batch decoder (compiled only when CMake found nvJPEG). Images go, per image, to the first
// backend that takes them: the hardware JPEG engines (A100/H100/H200: baseline JPEGs), nvJPEG's
// GPU-hybrid backend, and TurboJPEG on the CPU for what neither supports (CMYK, ...). A batch
// call that fails (corrupt data) is retried one level down, so a bad file costs time, never a crash.
// GPULAB_NVJPEG_HARDWARE=0 leaves the hardware engines out (the GPU-hybrid backend takes their
// images): a way around an engine or driver fault without leaving the GPU pipeline.
#include <fcntl.h>
#include <nvjpeg.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <string>
#include <system_error>

#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "data/gpu_decode.h"

namespace gpulab::data {

namespace {

const char* status_name(nvjpegStatus_t s) {
  switch (s) {
    case NVJPEG_STATUS_SUCCESS: return "success";
    case NVJPEG_STATUS_NOT_INITIALIZED: return "not initialized";
    case NVJPEG_STATUS_INVALID_PARAMETER: return "invalid parameter";
    case NVJPEG_STATUS_BAD_JPEG: return "bad JPEG";
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED: return "JPEG not supported";
    case NVJPEG_STATUS_ALLOCATOR_FAILURE: return "allocator failure";
    case NVJPEG_STATUS_EXECUTION_FAILED: return "execution failed";
    case NVJPEG_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case NVJPEG_STATUS_INTERNAL_ERROR: return "internal error";
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED: return "implementation not supported";
    case NVJPEG_STATUS_INCOMPLETE_BITSTREAM: return "incomplete bitstream";
  }
  return "unknown status";
}

void check(nvjpegStatus_t s, const char* what) {
  if (s != NVJPEG_STATUS_SUCCESS) throw core::Error(std::string("nvJPEG: ") + what + ": " + status_name(s));
}

bool hardware_switched_off() { return core::env_switch("GPULAB_NVJPEG_HARDWARE") == false; }

// One nvJPEG backend: handle, batched-decode state, and the batch size it was initialized for.
struct Backend {
  nvjpegHandle_t handle = nullptr;
  nvjpegJpegState_t state = nullptr;
  int batch = -1;

  Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
  // Tries each flag set in turn; false when the backend is not available (e.g. no JPEG engines).
  bool create(nvjpegBackend_t backend, std::initializer_list<unsigned> flag_sets) {
    for (unsigned flags : flag_sets)
      if (nvjpegCreateEx(backend, nullptr, nullptr, flags, &handle) == NVJPEG_STATUS_SUCCESS) {
        check(nvjpegJpegStateCreate(handle, &state), "creating a decode state");
        return true;
      }
    handle = nullptr;
    return false;
  }
  ~Backend() {
    if (state) nvjpegJpegStateDestroy(state);
    if (handle) nvjpegDestroy(handle);
  }

  // Decodes images[idx[k]] into dst[idx[k]]; false when nvJPEG rejects the batch.
  bool decode(std::span<const EncodedJpeg> images, std::span<uint8_t* const> dst, const std::vector<size_t>& idx,
              cudaStream_t stream) {
    if (idx.empty()) return true;
    const int n = int(idx.size());
    if (batch != n) {
      if (nvjpegDecodeBatchedInitialize(handle, state, n, 1, NVJPEG_OUTPUT_RGBI) != NVJPEG_STATUS_SUCCESS) return false;
      batch = n;
    }
    std::vector<const unsigned char*> data(idx.size());
    std::vector<size_t> lengths(idx.size());
    std::vector<nvjpegImage_t> out(idx.size());
    for (size_t k = 0; k < idx.size(); ++k) {
      data[k] = images[idx[k]].bytes.data();
      lengths[k] = images[idx[k]].bytes.size();
      out[k] = {};
      out[k].channel[0] = dst[idx[k]];
      out[k].pitch[0] = size_t(images[idx[k]].width) * 3;
    }
    if (nvjpegDecodeBatched(handle, state, data.data(), lengths.data(), out.data(), stream) != NVJPEG_STATUS_SUCCESS) {
      batch = -1;  // a failed batch needs a fresh initialization
      return false;
    }
    return true;
  }
};

// The JPEG engines of this process's GPU, held by one decoder at a time across processes. Three
// training processes decoding on the engines of one H200 at once hung in every round of session 24
// (5 of 5, driver 580.159.04): nvjpegDecodeBatched waited in cuEventSynchronize for a decode that
// never finished. Taking turns through an flock on a file named by the GPU's UUID, all 6 rounds
// finished; a loader beside two others then decoded 13.7-16.4 k images/s, against 14.4-18.2 k in the
// rounds without turns where it did not hang (bench/results/2026-12-03-h200-s24-nvjpeg-engines.txt).
// A file that cannot be opened (another user's, say) leaves the decoder without the lock, with a
// warning. GPULAB_NVJPEG_ENGINE_LOCK=0 also goes without: the A/B of
// TrainerPipelineGpu.ProcessesSharingTheJpegEnginesAllFinish.
class EngineLock {
 public:
  EngineLock() {
    if (core::env_switch("GPULAB_NVJPEG_ENGINE_LOCK") == false) return;
    int device = 0;
    cudaDeviceProp prop{};
    GPULAB_CHECK(cudaGetDevice(&device));
    GPULAB_CHECK(cudaGetDeviceProperties(&prop, device));
    std::string uuid;
    for (const char byte : prop.uuid.bytes) {
      char hex[3];
      std::snprintf(hex, sizeof hex, "%02x", static_cast<unsigned char>(byte));
      uuid += hex;
    }
    std::error_code no_temp;  // $TMPDIR naming no folder: /tmp, rather than no decoder at all
    std::filesystem::path dir = std::filesystem::temp_directory_path(no_temp);
    if (no_temp) dir = "/tmp";
    path_ = (dir / ("gpulab-jpeg-engines-" + uuid + ".lock")).string();
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd_ < 0) {
      core::log_warn("nvJPEG: cannot open ", path_, " (", std::strerror(errno),
                     "): decoding on the JPEG engines without taking turns with other processes");
      return;
    }
    ::fchmod(fd_, 0666);  // the next user's process may take turns too (fails harmlessly where not ours)
  }
  ~EngineLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  EngineLock(const EngineLock&) = delete;
  EngineLock& operator=(const EngineLock&) = delete;

  // Holds the engines while `decode` runs and `stream`'s work (what the decode queued) finishes.
  template <class F>
  bool with_engines(cudaStream_t stream, F&& decode) {
    if (fd_ < 0) return decode();
    while (::flock(fd_, LOCK_EX) != 0)
      if (errno != EINTR) throw core::Error("nvJPEG: flock " + path_ + ": " + std::strerror(errno));
    struct Unlock {
      int fd;
      ~Unlock() { ::flock(fd, LOCK_UN); }
    } unlock{fd_};
    const bool ok = decode();
    GPULAB_CHECK(cudaStreamSynchronize(stream));
    return ok;
  }

 private:
  std::string path_;
  int fd_ = -1;
};

class NvjpegBatchDecoder : public BatchDecoder {
 public:
  explicit NvjpegBatchDecoder(int threads) : cpu_(make_cpu_batch_decoder(threads)) {
    // The engines upsample chroma their own way. The CUDA backend can interpolate, closer to
    // libjpeg's "fancy" upsampling; a library without that flag creates it plain.
    hardware_off_ = hardware_switched_off();
    has_hardware_ = !hardware_off_ && hardware_.create(NVJPEG_BACKEND_HARDWARE, {NVJPEG_FLAGS_DEFAULT});
    if (has_hardware_) engines_ = std::make_unique<EngineLock>();
    if (!hybrid_.create(NVJPEG_BACKEND_GPU_HYBRID, {NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION, NVJPEG_FLAGS_DEFAULT}))
      throw core::Error("nvJPEG: cannot create the GPU-hybrid backend");
    check(nvjpegJpegStreamCreate(primary().handle, &parsed_), "creating a stream parser");
  }
  ~NvjpegBatchDecoder() override {
    if (parsed_) nvjpegJpegStreamDestroy(parsed_);
  }

  std::string name() const override {
    return has_hardware_   ? "nvJPEG hardware decoder"
           : hardware_off_ ? "nvJPEG GPU hybrid (hardware JPEG decoder off: GPULAB_NVJPEG_HARDWARE=0)"
                           : "nvJPEG GPU hybrid (no hardware JPEG decoder on this GPU)";
  }
  DecodeStats stats() const override { return stats_; }

  std::vector<char> decode(std::span<const EncodedJpeg> images, std::span<uint8_t* const> dst,
                           cudaStream_t stream) override {
    std::vector<size_t> to_hardware, to_hybrid, to_cpu;
    for (size_t i = 0; i < images.size(); ++i) {
      const auto& b = images[i].bytes;
      // Parsed and checked by the handle that decodes it (as NVIDIA's samples do); what the
      // hardware refuses goes to the hybrid backend, and only its failures to the CPU.
      if (nvjpegJpegStreamParseHeader(primary().handle, b.data(), b.size(), parsed_) != NVJPEG_STATUS_SUCCESS)
        to_cpu.push_back(i);  // TurboJPEG decides whether it is corrupt
      else if (!supported(primary())) (has_hardware_ ? to_hybrid : to_cpu).push_back(i);
      else (has_hardware_ ? to_hardware : to_hybrid).push_back(i);
    }
    const bool hardware_ok = to_hardware.empty() || engines_->with_engines(stream, [&] {
      return hardware_.decode(images, dst, to_hardware, stream);
    });
    if (hardware_ok) stats_.hardware += int64_t(to_hardware.size());
    else to_hybrid.insert(to_hybrid.end(), to_hardware.begin(), to_hardware.end());
    if (hybrid_.decode(images, dst, to_hybrid, stream)) stats_.gpu_hybrid += int64_t(to_hybrid.size());
    else to_cpu.insert(to_cpu.end(), to_hybrid.begin(), to_hybrid.end());
    std::vector<char> ok(images.size(), 1);
    if (to_cpu.empty()) return ok;
    stats_.cpu += int64_t(to_cpu.size());
    std::vector<EncodedJpeg> sub;
    std::vector<uint8_t*> sub_dst;
    for (size_t i : to_cpu) {
      sub.push_back(images[i]);
      sub_dst.push_back(dst[i]);
    }
    const std::vector<char> sub_ok = cpu_->decode(sub, sub_dst, stream);
    for (size_t k = 0; k < to_cpu.size(); ++k) ok[to_cpu[k]] = sub_ok[k];
    return ok;
  }

 private:
  Backend& primary() { return has_hardware_ ? hardware_ : hybrid_; }
  bool supported(const Backend& b) const {
    int unsupported = 1;  // nvJPEG sets 0 when the backend can decode the parsed stream
    return nvjpegDecodeBatchedSupported(b.handle, parsed_, &unsupported) == NVJPEG_STATUS_SUCCESS && unsupported == 0;
  }

  std::unique_ptr<BatchDecoder> cpu_;
  Backend hardware_, hybrid_;
  std::unique_ptr<EngineLock> engines_;  // with hardware_ only
  bool has_hardware_ = false;
  bool hardware_off_ = false;  // GPULAB_NVJPEG_HARDWARE=0
  nvjpegJpegStream_t parsed_ = nullptr;
  DecodeStats stats_;
};

}  // namespace

std::unique_ptr<BatchDecoder> make_nvjpeg_batch_decoder(int threads) {
  return std::make_unique<NvjpegBatchDecoder>(threads);
}

}  // namespace gpulab::data
