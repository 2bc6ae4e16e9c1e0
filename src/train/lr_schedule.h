// Learning-rate schedules, evaluated on the host per optimizer step (0-based `step` of `total`).
// Every schedule starts with a linear warmup: lr = base * (step + 1) / warmup for step < warmup.
//   cosine      end + (base - end) * (1 + cos(pi * t)) / 2,  t = (step - warmup) / (total - warmup)
//   polynomial  end + (base - end) * (1 - t)^power           (MLPerf LARS: power 2)
//   step        base * gamma^(number of milestones <= step)  (torchvision: epochs 30, 60, 80)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpulab::train {

enum class ScheduleKind { cosine, polynomial, step };
ScheduleKind schedule_from_name(const std::string& name);  // throws InputError

struct LrSchedule {
  ScheduleKind kind = ScheduleKind::cosine;
  double base = 0.1;
  double end = 0.0;
  int64_t warmup = 0;
  int64_t total = 1;
  double power = 2.0;
  double gamma = 0.1;
  std::vector<int64_t> milestones;  // steps, ascending

  double at(int64_t step) const;
};

}  // namespace gpulab::train
