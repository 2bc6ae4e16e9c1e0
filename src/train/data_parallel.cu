#include "train/data_parallel.h"

#include <string>

#include "comm/bootstrap.h"
#include "core/device.h"
#include "core/dtype_dispatch.h"
#include "core/error.h"
#include "train/resnet_config.h"

namespace gpulab::train {

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) { return unsigned(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535 * 8)); }

// wire = grad * scale in T: the reduced-precision copy, pre-divided by the world size so that
// the sum on the wire does not overflow where the average would not.
template <class T>
__global__ void to_wire_kernel(const float* grad, T* wire, float scale, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    wire[i] = T(grad[i] * scale);
}

template <class T>
__global__ void from_wire_kernel(const T* wire, float* grad, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    grad[i] = float(wire[i]);
}

}  // namespace

core::DType allreduce_dtype_from_name(const std::string& name) {
  if (name == "fp32") return core::DType::f32;
  if (name == "bf16") return core::DType::bf16;
  if (name == "fp16") return core::DType::f16;
  throw core::InputError("unknown all-reduce dtype '" + name + "' (fp32, bf16 or fp16)");
}

DataParallel::DataParallel(comm::Communicator& comm, const DataParallelOptions& opt) : comm_(comm), opt_(opt) {
  if (opt.bucket_bytes < int64_t(sizeof(float))) throw core::InputError("--bucket-mb must be positive");
  if (opt.allreduce_dtype != core::DType::f32 && opt.allreduce_dtype != core::DType::f16 &&
      opt.allreduce_dtype != core::DType::bf16)
    throw core::InputError("gradients are all-reduced in fp32, bf16 or fp16");
}

void DataParallel::attach(ResNet& net, cudaStream_t stream) {
  comm_.broadcast(net.params(), net.params(), size_t(net.param_count()), core::DType::f32, 0, stream);
  net.sync_working_copy(stream);
  std::vector<int64_t> counts;
  for (const ParamSpec& p : net.param_specs()) counts.push_back(p.count);
  backward_order_ = resnet_backward_order(resnet_layout(net.options().net));
  buckets_ = plan_buckets(counts, backward_order_, opt_.bucket_bytes / int64_t(sizeof(float)));
  ready_.clear();
  for (size_t i = 0; i < buckets_.size(); ++i) ready_.emplace_back(cudaEventDisableTiming);
  if (opt_.allreduce_dtype != core::DType::f32)
    wire_ = core::DeviceBuffer<std::byte>(size_t(net.param_count()) * core::dtype_size(opt_.allreduce_dtype));
  grads_ = net.grads();
  net.set_gradient_ready_hook([this](int param) { gradient_ready(param); });
  // BatchNorm's sums go through the communication stream too: all collectives of the communicator
  // then run in one stream, in the order they were issued, the same on every rank.
  if (opt_.sync_batchnorm)
    net.set_batchnorm_sync(
        [this](double* data, size_t count, cudaStream_t s) {
          to_comm_.record(s);
          GPULAB_CHECK(cudaStreamWaitEvent(comm_stream_, to_comm_.get(), 0));
          comm_.all_reduce(data, data, count, core::DType::f64, comm::ReduceOp::sum, comm_stream_);
          from_comm_.record(comm_stream_);
          GPULAB_CHECK(cudaStreamWaitEvent(s, from_comm_.get(), 0));
        },
        world());
  wait(stream);  // the broadcast, under the watchdog
}

void DataParallel::arm(bool last_micro_batch, cudaStream_t stream) {
  armed_ = last_micro_batch;
  stream_ = stream;
  seen_ = 0;
  next_bucket_ = 0;
}

void DataParallel::gradient_ready(int param) {
  if (!armed_) return;
  // Every rank must launch the same all-reduces in the same order, or NCCL deadlocks: the plan
  // relies on backward finishing parameters in resnet_backward_order.
  if (seen_ >= backward_order_.size() || backward_order_[seen_] != param)
    throw core::Error("data parallel: backward finished parameter " + std::to_string(param) +
                      " out of the planned order");
  ++seen_;
  while (next_bucket_ < buckets_.size() && size_t(buckets_[next_bucket_].ready_after) < seen_) {
    ready_[next_bucket_].record(stream_);
    GPULAB_CHECK(cudaStreamWaitEvent(comm_stream_, ready_[next_bucket_].get(), 0));
    reduce(buckets_[next_bucket_]);
    ++next_bucket_;
  }
}

void DataParallel::reduce(const GradBucket& b) {
  float* grad = grads_ + b.begin;
  const int64_t n = b.end - b.begin;
  if (opt_.allreduce_dtype == core::DType::f32) {
    comm_.all_reduce(grad, grad, size_t(n), core::DType::f32, comm::ReduceOp::avg, comm_stream_);
    return;
  }
  core::dispatch_activation(opt_.allreduce_dtype, [&]<class T>() {
    T* wire = reinterpret_cast<T*>(wire_.get()) + b.begin;
    to_wire_kernel<T><<<blocks_for(n), kThreads, 0, comm_stream_>>>(grad, wire, 1.f / float(world()), n);
    GPULAB_CHECK_LAUNCH();
    comm_.all_reduce(wire, wire, size_t(n), opt_.allreduce_dtype, comm::ReduceOp::sum, comm_stream_);
    from_wire_kernel<T><<<blocks_for(n), kThreads, 0, comm_stream_>>>(wire, grad, n);
    GPULAB_CHECK_LAUNCH();
  });
}

void DataParallel::finish(cudaStream_t stream) {
  if (!armed_) throw core::Error("data parallel: finish() without an armed backward");
  if (next_bucket_ != buckets_.size())
    throw core::Error("data parallel: backward finished " + std::to_string(seen_) + " of " +
                      std::to_string(backward_order_.size()) + " parameters");
  armed_ = false;
  reduced_.record(comm_stream_);
  GPULAB_CHECK(cudaStreamWaitEvent(stream, reduced_.get(), 0));
}

void DataParallel::wait(cudaStream_t stream) { comm_.wait(stream); }

float DataParallel::mean_over_ranks(float value, cudaStream_t stream) {
  *host_scalar_.get() = value;
  GPULAB_CHECK(cudaMemcpyAsync(scalar_.get(), host_scalar_.get(), sizeof(float), cudaMemcpyHostToDevice, stream));
  comm_.all_reduce(scalar_.get(), scalar_.get(), 1, core::DType::f32, comm::ReduceOp::avg, stream);
  GPULAB_CHECK(cudaMemcpyAsync(host_scalar_.get(), scalar_.get(), sizeof(float), cudaMemcpyDeviceToHost, stream));
  comm_.wait(stream);
  return *host_scalar_.get();
}

void launch_data_parallel(const DataParallelOptions& opt, const std::function<void(DataParallel* dp)>& rank_fn) {
  const comm::JobEnv job = comm::job_from_env();
  if (opt.gpus < 1) throw core::InputError("--gpus must be at least 1");
  if (job.world == 1 && opt.gpus == 1 && !opt.nccl) return rank_fn(nullptr);
  if (job.world > 1 && opt.gpus > 1)
    throw core::InputError("--gpus " + std::to_string(opt.gpus) + " runs threads in one process, but this is rank " +
                           std::to_string(job.rank) + " of a " + job.launcher +
                           " job: start one process per GPU instead, without --gpus");
  if (const std::string why = core::why_no_device(); !why.empty())
    throw core::NoDeviceError("data-parallel training needs CUDA devices: " + why);
  const comm::CommOptions copt{opt.timeout};
  if (job.world > 1) {
    int devices = 0;
    GPULAB_CHECK(cudaGetDeviceCount(&devices));
    if (job.local_rank >= devices)
      throw core::InputError("rank " + std::to_string(job.rank) + " has local rank " + std::to_string(job.local_rank) +
                             " but this node shows " + std::to_string(devices) + " GPUs");
    GPULAB_CHECK(cudaSetDevice(job.local_rank));
    comm::Communicator comm(comm::rendezvous(job, opt.timeout, comm::make_unique_id), job.rank, job.world,
                            job.local_rank, copt);
    DataParallel dp(comm, opt);
    return rank_fn(&dp);
  }
  const comm::UniqueId id = comm::make_unique_id();
  comm::run_on_gpus(opt.gpus, [&](int rank) {
    comm::Communicator comm(id, rank, opt.gpus, rank, copt);
    DataParallel dp(comm, opt);
    rank_fn(&dp);
  });
}

}  // namespace gpulab::train
