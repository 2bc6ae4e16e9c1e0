// Data-parallel ResNet training over NCCL. Every rank holds the whole model and its own shard of
// the data; backward hands each bucket of finished gradients (train/grad_buckets.h) to a
// communication stream that averages it across ranks while the rest of backward runs, so every
// rank takes the same optimizer step. Ranks are threads of this process (`--gpus N`) or the
// processes of a torchrun / mpirun / srun job (comm/bootstrap.h).
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "comm/communicator.h"
#include "core/dtype.h"
#include "core/memory.h"
#include "train/grad_buckets.h"
#include "train/resnet.h"

namespace gpulab::train {

struct DataParallelOptions {
  int gpus = 1;       // ranks as threads of this process, GPU i for rank i
  bool nccl = false;  // one rank through NCCL all the same (it must equal the plain path bit for bit)
  int64_t bucket_bytes = int64_t(25) << 20;  // of fp32 gradients per all-reduce
  core::DType allreduce_dtype = core::DType::f32;  // f16/bf16 halve the bytes on the wire
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};  // rendezvous, and the NCCL watchdog
  bool sync_batchnorm = false;  // BatchNorm statistics of the global batch (else each rank's own)
};

// "fp32", "bf16", "fp16"; throws InputError otherwise.
core::DType allreduce_dtype_from_name(const std::string& name);

// One rank's gradient reduction.
class DataParallel {
 public:
  DataParallel(comm::Communicator& comm, const DataParallelOptions& opt);
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int rank() const { return comm_.rank(); }
  int world() const { return comm_.world(); }

  // Makes every rank start from rank 0's weights, plans the buckets over net's parameters and
  // hooks net's backward (and its BatchNorm, with sync_batchnorm). `stream`: the training stream.
  void attach(ResNet& net, cudaStream_t stream);
  // Before each backward: true when this backward completes the step's gradients (the last
  // micro-batch of an accumulation); only then are buckets reduced.
  void arm(bool last_micro_batch, cudaStream_t stream);
  // After that backward: `stream` waits until every bucket is averaged.
  void finish(cudaStream_t stream);
  // A host wait for `stream` under the NCCL watchdog (a dead or hung peer ends in an error).
  void wait(cudaStream_t stream);
  // The mean of `value` over all ranks (after the work on `stream`), the same on every rank.
  float mean_over_ranks(float value, cudaStream_t stream);

  const std::vector<GradBucket>& buckets() const { return buckets_; }

 private:
  void gradient_ready(int param);
  void reduce(const GradBucket& b);

  comm::Communicator& comm_;
  DataParallelOptions opt_;
  core::Stream comm_stream_;
  std::vector<GradBucket> buckets_;
  std::vector<int> backward_order_;
  std::vector<core::Event> ready_;  // per bucket, on the training stream
  core::Event reduced_{cudaEventDisableTiming};
  core::Event to_comm_{cudaEventDisableTiming}, from_comm_{cudaEventDisableTiming};  // sync BatchNorm
  core::DeviceBuffer<std::byte> wire_;  // the gradients in allreduce_dtype, when not fp32
  core::DeviceBuffer<float> scalar_{1};
  core::PinnedBuffer<float> host_scalar_{1};  // pinned: copies that never block outside the watchdog
  float* grads_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool armed_ = false;
  size_t seen_ = 0;         // parameters finished in this backward
  size_t next_bucket_ = 0;  // the next bucket to launch
};

// Runs `rank_fn` once per rank of the job the options and the environment describe: with null for
// a plain single-GPU run; on opt.gpus threads; or, under torchrun / mpirun / srun (WORLD_SIZE > 1),
// as this process's rank on GPU LOCAL_RANK after the rendezvous. The first failure of any rank is
// rethrown after the others were stopped.
void launch_data_parallel(const DataParallelOptions& opt, const std::function<void(DataParallel* dp)>& rank_fn);

}  // namespace gpulab::train
