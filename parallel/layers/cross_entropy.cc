#include "parallel/layers/cross_entropy.h"

#include <cmath>
#include <limits>

#include "runtime/kernels.h"

namespace tessera::parallel::layers {

void vocab_parallel_cross_entropy(const ParallelState& ps, float* logits, int64_t rows, int64_t n_local, int64_t ld,
                                  int64_t vocab_start, const int32_t* targets, bool want_grad, float grad_scale,
                                  float* loss, float* scratch) {
  float* mx = scratch;           // [rows]
  float* sums = scratch + rows;  // [rows] sum of exp, then [rows] target logit
  float* target = scratch + 2 * rows;
  for (int64_t r = 0; r < rows; ++r) {
    const float* l = logits + r * ld;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n_local; ++j) m = std::max(m, l[j]);
    mx[r] = m;
  }
  ps.tp_all_reduce_max(mx, rows);
  for (int64_t r = 0; r < rows; ++r) {
    float* l = logits + r * ld;
    const float m = mx[r];
    const int64_t t = targets[r] - vocab_start;
    target[r] = (t >= 0 && t < n_local) ? l[t] - m : 0.f;
    float s = 0;
    for (int64_t j = 0; j < n_local; ++j) {
      float e = std::exp(l[j] - m);
      l[j] = e;
      s += e;
    }
    sums[r] = s;
  }
  ps.tp_all_reduce_f32(sums, 2 * rows);  // sums and target are adjacent: one reduction
  for (int64_t r = 0; r < rows; ++r) loss[r] = std::log(sums[r]) - target[r];
  if (want_grad) {
    for (int64_t r = 0; r < rows; ++r) {
      float* l = logits + r * ld;
      const float k = grad_scale / sums[r];
      for (int64_t j = 0; j < n_local; ++j) l[j] *= k;
      const int64_t t = targets[r] - vocab_start;
      if (t >= 0 && t < n_local) l[t] -= grad_scale;
    }
    kern::round_activations(ps.device, logits, rows, n_local, ld);  // the logits' gradient, computed in fp32
  }
  kern::charge(ps.device, cost::cross_entropy(rows, n_local, want_grad));
}

}  // namespace tessera::parallel::layers
