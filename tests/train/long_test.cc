// Long test (ctest label "long", built with -DTESSERA_LONG_TESTS=ON): a
// small GPT trained on the default corpus (/usr/share/common-licenses)
// brings the held-out loss below 2.5 nats per byte within 300 steps.
// About a minute of one core.
#include <gtest/gtest.h>

#include <cmath>

#include "parallel/models/gpt/trainer.h"
#include "runtime/device.h"
#include "runtime/kernels.h"

namespace tessera {
namespace {

TEST(LongTraining, ValidationLossBelow2p5NatsPerByte) {
  kern::default_blas_threads();
  Device dev(DeviceSpec::preset("trn1-core"));
  auto ps = parallel::layers::serial_state(&dev);
  parallel::models::gpt::TrainOptions o;
  o.model.vocab = 256;
  o.model.max_seq = 64;
  o.model.hidden = 128;
  o.model.heads = 4;
  o.model.layers = 2;
  o.seq = 64;
  o.micro_batch = 16;
  o.steps = 300;
  o.lr = 3e-3;
  o.warmup = 20;
  auto data = std::make_shared<const parallel::data::ByteDataset>(parallel::data::ByteDataset::default_files());
  parallel::models::gpt::Trainer t(o, ps, data);
  t.init_random();
  const double before = t.validation_loss(4);
  EXPECT_NEAR(before, std::log(256.0), 0.2);  // ~uniform at initialisation
  for (int64_t s = 0; s < o.steps; ++s) t.step();
  const double after = t.validation_loss(4);
  std::printf("validation loss %.4f -> %.4f nats/byte after %lld steps\n", before, after, (long long)o.steps);
  EXPECT_LT(after, 2.5);
}

}  // namespace
}  // namespace tessera
