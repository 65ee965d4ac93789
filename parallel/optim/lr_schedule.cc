#include "parallel/optim/lr_schedule.h"

#include <cmath>

namespace tessera::parallel::optim {

double LrSchedule::at(int64_t step) const {
  if (warmup > 0 && step <= warmup) return max_lr * static_cast<double>(step) / static_cast<double>(warmup);
  if (decay_steps <= warmup) return max_lr;
  if (step >= decay_steps) return min_lr;
  double ratio = static_cast<double>(step - warmup) / static_cast<double>(decay_steps - warmup);
  double coeff = 0.5 * (std::cos(M_PI * ratio) + 1.0);
  return min_lr + coeff * (max_lr - min_lr);
}

}  // namespace tessera::parallel::optim
