#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace gpulab::train {

ScheduleKind schedule_from_name(const std::string& name) {
  if (name == "cosine") return ScheduleKind::cosine;
  if (name == "poly" || name == "polynomial") return ScheduleKind::polynomial;
  if (name == "step") return ScheduleKind::step;
  throw core::InputError("unknown LR schedule '" + name + "' (cosine, poly or step)");
}

double LrSchedule::at(int64_t step) const {
  if (step < warmup) return base * double(step + 1) / double(warmup);
  const int64_t span = std::max<int64_t>(total - warmup, 1);
  const double t = std::clamp(double(step - warmup) / double(span), 0.0, 1.0);
  switch (kind) {
    case ScheduleKind::cosine: return end + (base - end) * 0.5 * (1.0 + std::cos(std::numbers::pi * t));
    case ScheduleKind::polynomial: return end + (base - end) * std::pow(1.0 - t, power);
    case ScheduleKind::step: {
      const auto passed = std::upper_bound(milestones.begin(), milestones.end(), step) - milestones.begin();
      return base * std::pow(gamma, double(passed));
    }
  }
  return base;
}

}  // namespace gpulab::train
