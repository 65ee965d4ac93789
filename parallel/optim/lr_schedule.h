// Learning-rate schedule as Megatron-LM's default for GPT: linear warm-up
// from 0 to max_lr over `warmup` steps, then cosine decay to min_lr at
// `decay_steps`, constant min_lr after. Steps count from 1.
#pragma once

#include <cstdint>

namespace tessera::parallel::optim {

struct LrSchedule {
  double max_lr = 6e-4;
  double min_lr = 0;
  int64_t warmup = 0;
  int64_t decay_steps = 0;  // 0: no decay (constant after warm-up)

  double at(int64_t step) const;
};

}  // namespace tessera::parallel::optim
