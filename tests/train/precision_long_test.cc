// Long tests (ctest label "long", built with -DTESSERA_LONG_TESTS=ON): bf16
// training of the demo model (scripts/demo.sh: GPT-2, 4 layers, width 128,
// 4 heads, byte tokens, seq 128, micro-batch 4) against fp32 on one
// emulated core (issue 27's Tests; docs/training.md, "bf16"). About four
// minutes of one loaded core in all.
#include <gtest/gtest.h>

#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "parallel/models/gpt/trainer.h"
#include "runtime/device.h"
#include "runtime/kernels.h"

namespace tessera {
namespace {

using parallel::models::gpt::Trainer;
using parallel::models::gpt::TrainOptions;

TrainOptions demo_model(int64_t global_batch, int64_t steps, double lr) {
  TrainOptions o;
  o.model.vocab = 256;
  o.model.max_seq = 128;
  o.model.hidden = 128;
  o.model.heads = 4;
  o.model.layers = 4;
  o.seq = 128;
  o.micro_batch = 4;
  o.global_batch = global_batch;
  o.steps = steps;
  o.lr = lr;  // warm-up min(steps / 10, 100), cosine decay to lr / 10
  return o;
}

TrainOptions with(TrainOptions o, DType precision, bool masters, bool stochastic) {
  o.precision = precision;
  o.master_weights = masters;
  o.stochastic_rounding = stochastic;
  return o;
}

// Each step's training loss of a serial run from the same initialisation and data.
std::vector<double> losses(const TrainOptions& o) {
  kern::default_blas_threads();
  static const auto data =
      std::make_shared<const parallel::data::ByteDataset>(parallel::data::ByteDataset::default_files());
  Device dev(DeviceSpec::preset("trn1-core"));
  auto ps = parallel::layers::serial_state(&dev);
  Trainer t(o, ps, data);
  t.init_random();
  std::vector<double> out;
  out.reserve(static_cast<size_t>(o.steps));
  for (int64_t s = 0; s < o.steps; ++s) out.push_back(t.step().loss);
  return out;
}

double mean(const std::vector<double>& v, size_t begin, size_t end) {
  return std::accumulate(v.begin() + static_cast<std::ptrdiff_t>(begin), v.begin() + static_cast<std::ptrdiff_t>(end),
                         0.0) /
         static_cast<double>(end - begin);
}

// bf16 with fp32 master weights tracks fp32 within 1% over 200 steps at the
// demo's lr (1e-3) and global batch (16). Compared over 10-step means: the
// two runs see the same batches, but their trajectories drift apart by
// bf16's rounding of activations and weights, and single steps differ by up
// to 1.6% (measured: the noisiest steps, 28-46, after warm-up) while their
// 10-step means stay within 0.62% and the last 20 steps' within 0.02%.
// Those last 20 steps, after the cosine decay, are held to 0.3%: updates
// at the final lr (1e-4) fall below bf16's resolution without the fp32
// masters (see the test below), and with the optimizer updating the bf16
// values instead of the masters the run ends 0.94% above fp32 (measured),
// inside the 1% of the windows.
TEST(PrecisionLong, Bf16WithMastersTracksFp32Within1PercentOver200Steps) {
  const TrainOptions base = demo_model(16, 200, 1e-3);
  const std::vector<double> f = losses(base);
  const std::vector<double> b = losses(with(base, DType::BF16, true, false));
  ASSERT_EQ(f.size(), b.size());
  constexpr size_t kWindow = 10;
  for (size_t w = 0; w + kWindow <= f.size(); w += kWindow) {
    const double mf = mean(f, w, w + kWindow), mb = mean(b, w, w + kWindow);
    EXPECT_NEAR(mb, mf, 0.01 * mf) << "steps " << w + 1 << "-" << w + kWindow;
  }
  const double last_f = mean(f, f.size() - 20, f.size()), last_b = mean(b, b.size() - 20, b.size());
  std::printf("mean loss of the last 20 steps: fp32 %.4f, bf16 with master weights %.4f\n", last_f, last_b);
  EXPECT_NEAR(last_b, last_f, 0.003 * last_f);
  EXPECT_LT(last_f, 2.7);  // it learned (from ln 256 = 5.55; measured 2.459)
}

// Pure bf16 loses the small updates; stochastic rounding keeps them on
// average. bf16 has 8 significand bits (7 stored), so its spacing at |w| in
// [2^e, 2^(e+1)) is 2^(e-7), and round-to-nearest drops any update below half
// that, 2^(e-8) >= |w| 2^-9: |lr u| < |w| 2^-9 rounds away. AdamW's update u
// is about 1 per element while the moments are young and smaller later, so
// at lr 1e-4 (cosine down to 1e-5) every update of a weight above
// 1e-4 x 2^9 = 0.05 is lost from the first step (the LayerNorm gains at 1
// never move), and of weights above 0.005 by the end: most of GPT-2's
// N(0, 0.02) initialisation. Stochastic rounding rounds up with probability
// the discarded fraction, so each rounding's mean is the fp32 value and the
// updates add up in expectation. Measured over 200 steps at global batch 4
// (mean loss of the last 20 steps): fp32 3.410, pure bf16 3.629 (+0.219),
// with stochastic rounding 3.412 (99% of the gap recovered).
TEST(PrecisionLong, PureBf16LosesSmallUpdatesAndStochasticRoundingRecoversThem) {
  const TrainOptions base = demo_model(4, 200, 1e-4);
  const std::vector<double> f = losses(base);
  const std::vector<double> pure = losses(with(base, DType::BF16, false, false));
  const std::vector<double> sr = losses(with(base, DType::BF16, false, true));
  const size_t n = f.size();
  const double lf = mean(f, n - 20, n), lp = mean(pure, n - 20, n), ls = mean(sr, n - 20, n);
  std::printf("mean loss of the last 20 steps: fp32 %.4f, pure bf16 %.4f, pure bf16 + stochastic rounding %.4f\n", lf,
              lp, ls);
  // Measurably above: half the measured gap, and 25x the largest 10-step
  // mean difference between fp32 and bf16 with master weights at this lr
  // (0.13%, 0.004 nats).
  EXPECT_GT(lp - lf, 0.1);
  // Most of the gap recovered: at least three quarters of it.
  EXPECT_LT(ls - lf, 0.25 * (lp - lf));
}

}  // namespace
}  // namespace tessera
