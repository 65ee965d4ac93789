// Mixed precision in the trainer (TrainOptions::precision, docs/training.md
// "bf16"): what the emulated device holds, the clock it is charged, and the
// numerics of bf16 training against fp32.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "parallel/models/gpt/trainer.h"
#include "runtime/bf16.h"
#include "runtime/device.h"

namespace tessera {
namespace {

using parallel::models::gpt::Trainer;
using parallel::models::gpt::TrainOptions;

std::shared_ptr<const parallel::data::ByteDataset> dataset() {
  static auto ds = std::make_shared<const parallel::data::ByteDataset>(parallel::data::ByteDataset::default_files());
  return ds;
}

TrainOptions tiny(DType precision, bool masters = true, bool fp32_grads = false) {
  TrainOptions o;
  o.model.vocab = 256;
  o.model.max_seq = 16;
  o.model.hidden = 32;
  o.model.heads = 4;
  o.model.layers = 2;
  o.seq = 16;
  o.micro_batch = 2;
  o.steps = 3;
  o.lr = 3e-4;
  o.warmup = 1;
  o.seed = 7;
  o.precision = precision;
  o.master_weights = masters;
  o.fp32_grads = fp32_grads;
  return o;
}

struct Bytes {
  uint64_t states = 0;       // after construction: parameters, gradients, optimizer
  uint64_t activations = 0;  // what the first step adds
  int64_t total = 0, state = 0;
};

Bytes device_bytes(const TrainOptions& o) {
  Device dev(DeviceSpec::preset("test-core"));
  auto ps = parallel::layers::serial_state(&dev);
  Trainer t(o, ps, dataset());
  t.init_random();
  Bytes b;
  b.states = dev.memory_stats().in_use;
  b.total = t.optimizer().total_elems();
  b.state = t.optimizer().optimizer_state_bytes();
  t.step();
  b.activations = dev.memory_stats().in_use - b.states;
  return b;
}

// Parameters and gradients at 2 bytes, masters and moments at 4, and every
// activation buffer at half its fp32 bytes except the fp32 ones: per row
// (token) the LayerNorms' mean and 1/std (2 per LayerNorm: 2 per block and
// the final one), the per-token loss, the loss's 3-float scratch, and the
// token ids (int32).
TEST(Precision, Bf16StepHoldsHalfTheBytesExceptMastersAndMoments) {
  const Bytes f = device_bytes(tiny(DType::F32));
  const Bytes b = device_bytes(tiny(DType::BF16));
  const Bytes pure = device_bytes(tiny(DType::BF16, false));
  const Bytes g32 = device_bytes(tiny(DType::BF16, true, true));
  const auto t = static_cast<uint64_t>(f.total);
  ASSERT_GT(t, 10000u);
  // Moments (fp32): 8 bytes per element this rank updates (all of them here).
  EXPECT_EQ(f.state, 8 * f.total);
  EXPECT_EQ(f.states, 4 * t + 4 * t + 8 * t);
  EXPECT_EQ(b.state, 12 * b.total);  // + the fp32 masters
  EXPECT_EQ(b.states, 2 * t + 2 * t + 12 * t);
  EXPECT_EQ(pure.states, 2 * t + 2 * t + 8 * t);
  EXPECT_EQ(g32.states, 2 * t + 4 * t + 12 * t);
  const uint64_t rows = uint64_t{2} * 16, layers = 2;
  const uint64_t fp32_rows = 4 * rows * (2 * (2 * layers + 1) + 1 + 3 + 1);
  ASSERT_GT(f.activations, fp32_rows);
  EXPECT_EQ(b.activations - fp32_rows, (f.activations - fp32_rows) / 2)
      << "fp32 activations " << f.activations << ", bf16 " << b.activations;
  EXPECT_EQ(pure.activations, b.activations);
}

}  // namespace
}  // namespace tessera
