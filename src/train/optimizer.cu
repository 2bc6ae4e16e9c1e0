// Fused multi-tensor optimizer steps. The parameters are cut into chunks of kChunk elements;
// one block per chunk, one launch per phase for all tensors. Per-tensor norms come from per-chunk
// partial sums reduced in a fixed order, so every run gives the same bits.
#include <algorithm>

#include "core/dtype_dispatch.h"
#include "core/error.h"
#include "train/optimizer.h"

namespace gpulab::train {

namespace {

using TensorDesc = Optimizer::TensorDesc;
using Chunk = Optimizer::Chunk;
using Lr = Optimizer::Lr;
constexpr int kThreads = 256;
constexpr int64_t kChunk = Optimizer::kChunk;

// Sum over the block, returned to every thread; safe to call repeatedly.
__device__ float block_sum(float v) {
  __shared__ float warp_sums[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();  // the previous call's readers are done with warp_sums
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
  return total;
}

// Partial sums of chunks [first, first + count), slot `which` of 3.
__device__ float sum_partials(const float* partials, int first, int count, int which) {
  float s = 0.f;
  for (int c = threadIdx.x; c < count; c += blockDim.x) s += partials[3 * (first + c) + which];
  return block_sum(s);
}

struct Control {
  bool skip;
  float inv_scale;
};

__device__ Control control(const LossScaleState* s) {
  if (!s) return {false, 1.f};
  return {s->found_inf != 0, 1.f / s->scale};
}

struct Range {
  TensorDesc t;  // a copy in registers: the loops below write floats the compiler cannot rule out as aliases
  int64_t begin, end;
};

__device__ Range chunk_range(const TensorDesc* tensors, const Chunk* chunks) {
  const Chunk c = chunks[blockIdx.x];
  const TensorDesc t = tensors[c.tensor];
  const int64_t begin = int64_t(c.index) * kChunk;
  return {t, begin, min(begin + kChunk, t.count)};
}

template <class CopyT>
__device__ void store(const TensorDesc& t, int64_t i, float p) {
  t.param[i] = p;
  if (t.copy) static_cast<CopyT*>(t.copy)[i] = CopyT(p);
}

// |w|^2 and |g / scale|^2 of each chunk.
__global__ void norms_kernel(const TensorDesc* tensors, const Chunk* chunks, float* partials,
                             const LossScaleState* scaler) {
  const Control ctl = control(scaler);
  if (ctl.skip) return;
  const Range r = chunk_range(tensors, chunks);
  float w2 = 0.f, g2 = 0.f;
  for (int64_t i = r.begin + threadIdx.x; i < r.end; i += blockDim.x) {
    const float w = r.t.param[i], g = r.t.grad[i] * ctl.inv_scale;
    w2 += w * w;
    g2 += g * g;
  }
  w2 = block_sum(w2);
  g2 = block_sum(g2);
  if (threadIdx.x == 0) {
    partials[3 * blockIdx.x + 0] = w2;
    partials[3 * blockIdx.x + 1] = g2;
  }
}

__device__ float rate_of(Lr rate) { return rate.device ? *rate.device : rate.value; }

template <class CopyT>
__global__ void sgd_kernel(const TensorDesc* tensors, const Chunk* chunks, OptimizerConfig c, Lr rate,
                           const LossScaleState* scaler) {
  const Control ctl = control(scaler);
  if (ctl.skip) return;
  const float lr = rate_of(rate);
  const Range r = chunk_range(tensors, chunks);
  const float wd = r.t.decay ? c.weight_decay : 0.f;
  for (int64_t i = r.begin + threadIdx.x; i < r.end; i += blockDim.x) {
    const float p = r.t.param[i];
    float g = r.t.grad[i] * ctl.inv_scale + wd * p;
    if (c.momentum != 0.f) {
      const float b = c.momentum * r.t.m[i] + g;
      r.t.m[i] = b;
      g = c.nesterov ? g + c.momentum * b : b;
    }
    store<CopyT>(r.t, i, p - lr * g);
  }
}

template <class CopyT>
__global__ void lars_kernel(const TensorDesc* tensors, const Chunk* chunks, const float* partials,
                            OptimizerConfig c, Lr rate, const LossScaleState* scaler) {
  const Control ctl = control(scaler);
  if (ctl.skip) return;
  const Range r = chunk_range(tensors, chunks);
  const float lr = rate_of(rate);
  float scaled_lr = lr, wd = 0.f;
  if (r.t.decay) {
    wd = c.weight_decay;
    const float w_norm = sqrtf(sum_partials(partials, r.t.first_chunk, r.t.num_chunks, 0));
    const float g_norm = sqrtf(sum_partials(partials, r.t.first_chunk, r.t.num_chunks, 1));
    const float trust = w_norm > 0.f && g_norm > 0.f ? c.lars_eta * w_norm / (g_norm + wd * w_norm + c.lars_eps) : 1.f;
    scaled_lr = lr * trust;
  }
  for (int64_t i = r.begin + threadIdx.x; i < r.end; i += blockDim.x) {
    const float p = r.t.param[i];
    const float g = r.t.grad[i] * ctl.inv_scale + wd * p;
    const float v = c.momentum * r.t.m[i] + scaled_lr * g;
    r.t.m[i] = v;
    store<CopyT>(r.t, i, p - (c.nesterov ? c.momentum * v + scaled_lr * g : v));
  }
}

// Moments and the update u (written over the gradient), plus |u|^2 per chunk.
__global__ void lamb_moments_kernel(const TensorDesc* tensors, const Chunk* chunks, float* partials, int num_chunks,
                                    OptimizerConfig c, const LossScaleState* scaler, const OptimizerDeviceState* st) {
  const Control ctl = control(scaler);
  if (ctl.skip) return;
  const Range r = chunk_range(tensors, chunks);
  const float global_norm = sqrtf(sum_partials(partials, 0, num_chunks, 1));
  const float clip = c.max_grad_norm > 0.f && global_norm > c.max_grad_norm ? global_norm / c.max_grad_norm : 1.f;
  const float step = float(st->steps + 1);
  const float bc1 = 1.f - powf(c.beta1, step), bc2 = 1.f - powf(c.beta2, step);
  const float wd = r.t.decay ? c.weight_decay : 0.f;
  float u2 = 0.f;
  for (int64_t i = r.begin + threadIdx.x; i < r.end; i += blockDim.x) {
    const float g = r.t.grad[i] * ctl.inv_scale / clip;
    const float m = c.beta1 * r.t.m[i] + (1.f - c.beta1) * g;
    const float v = c.beta2 * r.t.v[i] + (1.f - c.beta2) * g * g;
    r.t.m[i] = m;
    r.t.v[i] = v;
    const float u = (m / bc1) / (sqrtf(v / bc2) + c.lamb_eps) + wd * r.t.param[i];
    r.t.grad[i] = u;
    u2 += u * u;
  }
  u2 = block_sum(u2);
  if (threadIdx.x == 0) partials[3 * blockIdx.x + 2] = u2;
}

template <class CopyT>
__global__ void lamb_apply_kernel(const TensorDesc* tensors, const Chunk* chunks, const float* partials,
                                  OptimizerConfig c, Lr rate, const LossScaleState* scaler) {
  const Control ctl = control(scaler);
  if (ctl.skip) return;
  const Range r = chunk_range(tensors, chunks);
  const float lr = rate_of(rate);
  float ratio = lr;
  if (r.t.decay && c.weight_decay != 0.f) {
    const float p_norm = sqrtf(sum_partials(partials, r.t.first_chunk, r.t.num_chunks, 0));
    const float u_norm = sqrtf(sum_partials(partials, r.t.first_chunk, r.t.num_chunks, 2));
    if (p_norm != 0.f && u_norm != 0.f) ratio = lr * p_norm / u_norm;
  }
  for (int64_t i = r.begin + threadIdx.x; i < r.end; i += blockDim.x)
    store<CopyT>(r.t, i, r.t.param[i] - ratio * r.t.grad[i]);
}

__global__ void count_step_kernel(OptimizerDeviceState* st, const LossScaleState* scaler) {
  if (!control(scaler).skip) ++st->steps;
}

}  // namespace

Optimizer::Optimizer(OptimizerConfig cfg, std::vector<ParamTensor> params, core::DType copy_dtype)
    : cfg_(cfg), params_(std::move(params)), copy_dtype_(copy_dtype) {
  if (params_.empty()) throw core::Error("optimizer: no parameters");
  const int moments = cfg_.kind == OptimizerKind::lamb ? 2 : 1;
  int64_t total = 0;
  std::vector<Chunk> chunks;
  for (size_t t = 0; t < params_.size(); ++t) {
    state_offsets_.push_back(total);
    total += params_[t].count;
    const int64_t n = (params_[t].count + kChunk - 1) / kChunk;
    for (int64_t k = 0; k < n; ++k) chunks.push_back({int32_t(t), int32_t(k)});
  }
  moments_ = core::DeviceBuffer<float>(size_t(total) * moments);
  GPULAB_CHECK(cudaMemset(moments_.get(), 0, moments_.bytes()));
  std::vector<TensorDesc> descs;
  int32_t first = 0;
  for (size_t t = 0; t < params_.size(); ++t) {
    const auto& p = params_[t];
    const int32_t n = int32_t((p.count + kChunk - 1) / kChunk);
    float* m = moments_.get() + state_offsets_[t];
    descs.push_back({p.param, p.grad, m, moments == 2 ? m + total : nullptr, p.copy, p.count, p.decay, first, n});
    first += n;
  }
  num_chunks_ = int(chunks.size());
  tensors_ = core::DeviceBuffer<TensorDesc>(descs.size());
  chunks_ = core::DeviceBuffer<Chunk>(chunks.size());
  partials_ = core::DeviceBuffer<float>(chunks.size() * 3);
  device_state_ = core::DeviceBuffer<OptimizerDeviceState>(1);
  GPULAB_CHECK(cudaMemcpy(tensors_.get(), descs.data(), tensors_.bytes(), cudaMemcpyHostToDevice));
  GPULAB_CHECK(cudaMemcpy(chunks_.get(), chunks.data(), chunks_.bytes(), cudaMemcpyHostToDevice));
  GPULAB_CHECK(cudaMemset(device_state_.get(), 0, device_state_.bytes()));
  // The memsets ran on the legacy stream, which the caller's non-blocking stream does not wait for.
  GPULAB_CHECK(cudaDeviceSynchronize());
}

void Optimizer::step(float lr, const LossScaleState* scaler, cudaStream_t stream) { launch({lr, nullptr}, scaler, stream); }

void Optimizer::step(const float* lr, const LossScaleState* scaler, cudaStream_t stream) {
  launch({0.f, lr}, scaler, stream);
}

void Optimizer::launch(Lr lr, const LossScaleState* scaler, cudaStream_t stream) {
  const TensorDesc* t = tensors_.get();
  const Chunk* c = chunks_.get();
  float* partials = partials_.get();
  const unsigned grid = unsigned(num_chunks_);
  core::dispatch_activation(copy_dtype_, [&]<class CopyT>() {
    switch (cfg_.kind) {
      case OptimizerKind::sgd:
        sgd_kernel<CopyT><<<grid, kThreads, 0, stream>>>(t, c, cfg_, lr, scaler);
        GPULAB_CHECK_LAUNCH();
        break;
      case OptimizerKind::lars:
        norms_kernel<<<grid, kThreads, 0, stream>>>(t, c, partials, scaler);
        GPULAB_CHECK_LAUNCH();
        lars_kernel<CopyT><<<grid, kThreads, 0, stream>>>(t, c, partials, cfg_, lr, scaler);
        GPULAB_CHECK_LAUNCH();
        break;
      case OptimizerKind::lamb:
        norms_kernel<<<grid, kThreads, 0, stream>>>(t, c, partials, scaler);
        GPULAB_CHECK_LAUNCH();
        lamb_moments_kernel<<<grid, kThreads, 0, stream>>>(t, c, partials, num_chunks_, cfg_, scaler,
                                                           device_state_.get());
        GPULAB_CHECK_LAUNCH();
        lamb_apply_kernel<CopyT><<<grid, kThreads, 0, stream>>>(t, c, partials, cfg_, lr, scaler);
        GPULAB_CHECK_LAUNCH();
        break;
    }
  });
  count_step_kernel<<<1, 1, 0, stream>>>(device_state_.get(), scaler);
  GPULAB_CHECK_LAUNCH();
}

int32_t Optimizer::steps_taken(cudaStream_t stream) const {
  OptimizerDeviceState s;
  GPULAB_CHECK(cudaMemcpyAsync(&s, device_state_.get(), sizeof s, cudaMemcpyDeviceToHost, stream));
  GPULAB_CHECK(cudaStreamSynchronize(stream));
  return s.steps;
}

std::vector<float> Optimizer::read_moment(int k, cudaStream_t stream) const {
  const size_t total = moments_.size() / size_t(moment_count());
  std::vector<float> h(total);
  GPULAB_CHECK(cudaMemcpyAsync(h.data(), moments_.get() + size_t(k) * total, total * sizeof(float),
                               cudaMemcpyDeviceToHost, stream));
  GPULAB_CHECK(cudaStreamSynchronize(stream));
  return h;
}

void Optimizer::load_state(const std::vector<std::vector<float>>& moments, int32_t steps, cudaStream_t stream) {
  const size_t total = moments_.size() / size_t(moment_count());
  if (int(moments.size()) != moment_count()) throw core::Error("optimizer: state has the wrong number of moments");
  for (size_t k = 0; k < moments.size(); ++k) {
    if (moments[k].size() != total) throw core::Error("optimizer: state has the wrong size");
    GPULAB_CHECK(cudaMemcpyAsync(moments_.get() + k * total, moments[k].data(), total * sizeof(float),
                                 cudaMemcpyHostToDevice, stream));
  }
  const OptimizerDeviceState st{steps};
  GPULAB_CHECK(cudaMemcpyAsync(device_state_.get(), &st, sizeof st, cudaMemcpyHostToDevice, stream));
  GPULAB_CHECK(cudaStreamSynchronize(stream));  // the sources are the caller's host memory
}

const float* Optimizer::state(size_t i, bool second) const {
  const int64_t total = int64_t(moments_.size()) / moment_count();
  return moments_.get() + state_offsets_.at(i) + (second ? total : 0);
}

}  // namespace gpulab::train
