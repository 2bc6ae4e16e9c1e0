#include <algorithm>

#include "core/error.h"
#include "core/memory.h"
#include "train/loss_scale.h"

namespace gpulab::train {

namespace {

// Grid-stride over one buffer; blockIdx.y picks the buffer.
__global__ void check_finite_kernel(const GradView* grads, LossScaleState* state) {
  const GradView g = grads[blockIdx.y];
  bool bad = false;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < g.count; i += int64_t(gridDim.x) * blockDim.x)
    bad |= !isfinite(g.data[i]);
  if (__syncthreads_or(bad) && threadIdx.x == 0) state->found_inf = 1;  // idempotent store, no atomic needed
}

__global__ void update_scale_kernel(LossScaleState* s, LossScaleConfig cfg) {
  if (s->found_inf) {
    s->scale *= cfg.backoff_factor;
    s->growth_tracker = 0;
    ++s->skipped_steps;
  } else if (s->growth_tracker + 1 == cfg.growth_interval) {
    const float grown = s->scale * cfg.growth_factor;
    if (isfinite(grown)) s->scale = grown;
    s->growth_tracker = 0;
  } else {
    ++s->growth_tracker;
  }
  s->found_inf = 0;
}

__global__ void init_kernel(LossScaleState* s, float scale) { *s = {scale, 0, 0, 0}; }

}  // namespace

LossScaler::LossScaler(LossScaleConfig cfg) : cfg_(cfg) {
  state_ = static_cast<LossScaleState*>(core::device_malloc(sizeof(LossScaleState)));
  init_kernel<<<1, 1>>>(state_, cfg.init_scale);
  GPULAB_CHECK_LAUNCH();
  GPULAB_CHECK(cudaDeviceSynchronize());
}

LossScaler::~LossScaler() {
  GPULAB_CHECK_NOTHROW(cudaFree(state_));
  GPULAB_CHECK_NOTHROW(cudaFree(grads_));
}

void LossScaler::watch(const std::vector<GradView>& grads) {
  GPULAB_CHECK(cudaFree(grads_));
  grads_ = nullptr;
  grad_count_ = int(grads.size());
  longest_ = 0;
  for (const auto& g : grads) longest_ = std::max(longest_, g.count);
  if (grads.empty()) return;
  grads_ = static_cast<GradView*>(core::device_malloc(sizeof(GradView) * grads.size()));
  GPULAB_CHECK(cudaMemcpy(grads_, grads.data(), sizeof(GradView) * grads.size(), cudaMemcpyHostToDevice));
}

void LossScaler::check_gradients(cudaStream_t stream) {
  if (grad_count_ == 0) return;
  const int threads = 256;
  const unsigned blocks = unsigned(std::clamp<int64_t>((longest_ + threads - 1) / threads, 1, 256));
  check_finite_kernel<<<dim3(blocks, unsigned(grad_count_)), threads, 0, stream>>>(grads_, state_);
  GPULAB_CHECK_LAUNCH();
}

void LossScaler::update(cudaStream_t stream) {
  update_scale_kernel<<<1, 1, 0, stream>>>(state_, cfg_);
  GPULAB_CHECK_LAUNCH();
}

LossScaleState LossScaler::read(cudaStream_t stream) const {
  LossScaleState s;
  copy_state(&s, stream);
  GPULAB_CHECK(cudaStreamSynchronize(stream));
  return s;
}

void LossScaler::copy_state(LossScaleState* host, cudaStream_t stream) const {
  GPULAB_CHECK(cudaMemcpyAsync(host, state_, sizeof *host, cudaMemcpyDeviceToHost, stream));
}

void LossScaler::load(const LossScaleState& state, cudaStream_t stream) {
  GPULAB_CHECK(cudaMemcpyAsync(state_, &state, sizeof state, cudaMemcpyHostToDevice, stream));
  GPULAB_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace gpulab::train
