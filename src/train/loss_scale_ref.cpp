#include <cmath>

#include "train/loss_scale.h"

namespace gpulab::train {

void LossScalerRef::update(bool found_inf) {
  if (found_inf) {
    state_.scale *= cfg_.backoff_factor;
    state_.growth_tracker = 0;
    ++state_.skipped_steps;
    return;
  }
  const int32_t successful = state_.growth_tracker + 1;
  if (successful == cfg_.growth_interval) {
    const float grown = state_.scale * cfg_.growth_factor;
    if (std::isfinite(grown)) state_.scale = grown;  // torch keeps the scale when growth overflows
    state_.growth_tracker = 0;
  } else {
    state_.growth_tracker = successful;
  }
}

}  // namespace gpulab::train
