// The optimizer against numbers worked out independently of its code: an
// AdamW step by hand (bias correction, decoupled weight decay, epsilon),
// gradient clipping forced and not, and the learning-rate schedule at
// warm-up, peak, during and after the decay. Serial and parallel training
// share this code, so only an oracle like this can catch a wrong formula.
#include "parallel/optim/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "parallel/layers/parallel_state.h"
#include "parallel/layers/parameter.h"
#include "runtime/device.h"

namespace tessera {
namespace {

// Two parameters: w (decayed) and b (a bias: no weight decay).
struct Fixture {
  Device dev{DeviceSpec::preset("test-core")};
  parallel::layers::ParallelState ps = parallel::layers::serial_state(&dev);
  parallel::layers::Parameter w =
      parallel::layers::make_parameter("w", {2}, -1, 1, 1, 0, parallel::layers::Init::Zeros, 0.02f, /*decay=*/true);
  parallel::layers::Parameter b =
      parallel::layers::make_parameter("b", {1}, -1, 1, 1, 0, parallel::layers::Init::Zeros, 0.02f, /*decay=*/false);
  std::unique_ptr<parallel::optim::DistributedOptimizer> opt;

  explicit Fixture(parallel::optim::AdamWConfig cfg) {
    opt = std::make_unique<parallel::optim::DistributedOptimizer>(ps, std::vector<parallel::layers::Parameter*>{&w, &b},
                                                                  cfg);
    w.value[0] = 2.0f;
    w.value[1] = -1.0f;
    b.value[0] = 0.5f;
  }
  parallel::optim::StepStats step(int64_t k, std::vector<float> gw, float gb) {
    opt->zero_grad();
    w.grad[0] = gw[0];
    w.grad[1] = gw[1];
    b.grad[0] = gb;
    return opt->step(k);
  }
};

// lr 0.01 constant, beta1 0.9, beta2 0.95, eps 0.1 (large, so that it and the
// gradient scale show in the step), weight decay 0.1, no clipping.
parallel::optim::AdamWConfig config(double clip) {
  parallel::optim::AdamWConfig c;
  c.beta1 = 0.9;
  c.beta2 = 0.95;
  c.eps = 0.1;
  c.weight_decay = 0.1;
  c.clip_norm = clip;
  c.lr.max_lr = 0.01;
  c.lr.warmup = 0;
  c.lr.decay_steps = 0;
  return c;
}

// Step 1 with gradients g: m = 0.1 g, v = 0.05 g^2, so after bias correction
// m^ = g and sqrt(v^) = |g|:  p1 = p0 (1 - lr wd) - lr g / (|g| + eps).
//   w[0]: 2 * 0.999 - 0.01 * 3 / 3.1        = 1.998 - 0.00967741935 = 1.98832258065
//   w[1]: -1 * 0.999 - 0.01 * (-0.5) / 0.6  = -0.999 + 0.00833333333 = -0.99066666667
//   b[0]: 0.5 (no decay) - 0.01 * 1 / 1.1   = 0.5 - 0.00909090909   = 0.49090909091
TEST(AdamW, FirstStepByHand) {
  Fixture f(config(0));
  auto st = f.step(1, {3.0f, -0.5f}, 1.0f);
  EXPECT_NEAR(f.w.value[0], 1.98832258065, 5e-7);
  EXPECT_NEAR(f.w.value[1], -0.99066666667, 5e-7);
  EXPECT_NEAR(f.b.value[0], 0.49090909091, 5e-7);
  EXPECT_NEAR(st.grad_norm, std::sqrt(10.25), 1e-6);  // sqrt(9 + 0.25 + 1), reported before clipping
  EXPECT_EQ(st.clip_coef, 1.0);
  EXPECT_DOUBLE_EQ(st.lr, 0.01);
}

// A second step, checked against AdamW written out here in double.
TEST(AdamW, SecondStepMatchesTheFormula) {
  Fixture f(config(0));
  const std::vector<std::vector<double>> g = {{3.0, -0.5, 1.0}, {1.0, 0.25, -2.0}};  // w[0], w[1], b[0] per step
  f.step(1, {3.0f, -0.5f}, 1.0f);
  f.step(2, {1.0f, 0.25f}, -2.0f);
  const double lr = 0.01, b1 = 0.9, b2 = 0.95, eps = 0.1, wd = 0.1;
  std::vector<double> p = {2.0, -1.0, 0.5}, m(3, 0.0), v(3, 0.0);
  const bool decay[] = {true, true, false};
  for (int t = 1; t <= 2; ++t) {
    for (size_t i = 0; i < 3; ++i) {
      const double gi = g[static_cast<size_t>(t - 1)][i];
      m[i] = b1 * m[i] + (1 - b1) * gi;
      v[i] = b2 * v[i] + (1 - b2) * gi * gi;
      const double mh = m[i] / (1 - std::pow(b1, t)), vh = v[i] / (1 - std::pow(b2, t));
      if (decay[i]) p[i] -= lr * wd * p[i];
      p[i] -= lr * mh / (std::sqrt(vh) + eps);
    }
  }
  EXPECT_NEAR(f.w.value[0], p[0], 5e-7);
  EXPECT_NEAR(f.w.value[1], p[1], 5e-7);
  EXPECT_NEAR(f.b.value[0], p[2], 5e-7);
  // The moments the optimizer keeps (what a checkpoint saves) are the raw ones.
  std::vector<double> got_m, got_v;
  f.opt->for_each_moment_run([&](int64_t, int64_t n, const float* mm, const float* vv) {
    got_m.insert(got_m.end(), mm, mm + n);
    got_v.insert(got_v.end(), vv, vv + n);
  });
  ASSERT_EQ(got_m.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(got_m[i], m[i], 1e-6 * std::abs(m[i])) << i;
    EXPECT_NEAR(got_v[i], v[i], 1e-6 * std::abs(v[i])) << i;
  }
}

// Clipping: the global norm is sqrt(10.25) = 3.20156212; with clip 1 every
// gradient is scaled by 1 / (3.20156212 + 1e-6) = 0.31234743 before AdamW.
// With eps = 0.1 the step depends on that scale:
//   w[0]: 1.998 - 0.01 * 0.93704228 / 1.03704228 = 1.998 - 0.00903572 = 1.98896428
TEST(AdamW, ClippingForced) {
  Fixture f(config(1.0));
  auto st = f.step(1, {3.0f, -0.5f}, 1.0f);
  EXPECT_NEAR(st.grad_norm, 3.20156212, 1e-6);
  EXPECT_NEAR(st.clip_coef, 0.31234743, 1e-7);
  EXPECT_NEAR(f.w.value[0], 1.98896428, 5e-7);
  const double c = 0.31234743;
  EXPECT_NEAR(f.w.value[1], -0.999 + 0.01 * 0.5 * c / (0.5 * c + 0.1), 5e-7);
  EXPECT_NEAR(f.b.value[0], 0.5 - 0.01 * c / (c + 0.1), 5e-7);
}

// A norm below the threshold leaves the gradients alone: the unclipped step.
TEST(AdamW, ClippingNotForced) {
  Fixture f(config(3.3));
  auto st = f.step(1, {3.0f, -0.5f}, 1.0f);
  EXPECT_NEAR(st.grad_norm, 3.20156212, 1e-6);
  EXPECT_EQ(st.clip_coef, 1.0);
  EXPECT_NEAR(f.w.value[0], 1.98832258065, 5e-7);
  EXPECT_NEAR(f.b.value[0], 0.49090909091, 5e-7);
}

// The learning rate the step uses is the schedule's: half the peak in the
// first of two warm-up steps, so every term of the update halves.
TEST(AdamW, StepUsesTheScheduledRate) {
  parallel::optim::AdamWConfig c = config(0);
  c.lr.warmup = 2;
  Fixture f(c);
  auto st = f.step(1, {3.0f, -0.5f}, 1.0f);
  EXPECT_DOUBLE_EQ(st.lr, 0.005);
  // 2 (1 - 0.005 * 0.1) - 0.005 * 3 / 3.1 = 1.999 - 0.00483870968 = 1.99416129032
  EXPECT_NEAR(f.w.value[0], 1.99416129032, 5e-7);
}

// Megatron's schedule: max 6e-4, min 6e-5, 10 warm-up steps, cosine to step 110.
TEST(LrSchedule, WarmupPeakCosineAndEnd) {
  parallel::optim::LrSchedule s;
  s.max_lr = 6e-4;
  s.min_lr = 6e-5;
  s.warmup = 10;
  s.decay_steps = 110;
  EXPECT_NEAR(s.at(1), 6e-5, 1e-12);   // 1/10 of the peak
  EXPECT_NEAR(s.at(5), 3e-4, 1e-12);   // half-way up
  EXPECT_NEAR(s.at(10), 6e-4, 1e-12);  // the peak, at the end of warm-up
  // 25 steps into 100 of decay: min + (max - min) (1 + cos(pi/4)) / 2
  //   = 6e-5 + 5.4e-4 * 0.85355339 = 5.20918831e-4
  EXPECT_NEAR(s.at(35), 5.20918831e-4, 1e-12);
  EXPECT_NEAR(s.at(60), 3.3e-4, 1e-12);  // half-way: the mean of max and min
  EXPECT_NEAR(s.at(110), 6e-5, 1e-12);   // the end
  EXPECT_NEAR(s.at(500), 6e-5, 1e-12);   // and after it
  // No decay: constant after warm-up; no warm-up: the peak from step 1.
  parallel::optim::LrSchedule flat;
  flat.max_lr = 1e-3;
  flat.warmup = 4;
  EXPECT_NEAR(flat.at(2), 5e-4, 1e-15);
  EXPECT_NEAR(flat.at(1000), 1e-3, 1e-15);
  flat.warmup = 0;
  EXPECT_NEAR(flat.at(1), 1e-3, 1e-15);
}

}  // namespace
}  // namespace tessera
