// TrainerState: what a training checkpoint records about the Trainer besides
// its tensors (trainer_state.cereal, cereal's portable binary archive), and
// the checks that a resumed run continues the same run.
//
// The RNG state is the seed: initialisation and batches come from
// counter-based generators keyed by (seed, tensor name, index) and (seed,
// split, sample), so (seed, step) is their whole state; the data position
// is the next global sample (step x global batch). The learning-rate
// schedule, AdamW hyperparameters, the model config and the layout are
// recorded so that a resume can be checked against them. Pure functions;
// thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/models/gpt/trainer.h"

namespace tessera::parallel::models::gpt {

struct TrainerState {
  static constexpr uint32_t kVersion = 2;  // 2: the model as ModelConfig's JSON (1: GPT-2's five sizes)
  int64_t step = 0;
  std::string run_id;
  uint64_t seed = 0;
  int64_t next_sample = 0;  // data position: global sample index of step + 1's first row
  // the model (parallel/model_config.h ModelConfig::to_json, name cleared)
  std::string model_json;
  // batches and schedule
  int64_t seq = 0, micro_batch = 0, global_batch = 0, steps = 0;
  double lr = 0, min_lr = 0;
  int64_t warmup = 0, decay_steps = 0;
  double beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0, clip_norm = 0;
  // layout at save time
  int tp = 1, dp = 1, pp = 1;
  bool zero1 = false, sequence_parallel = false;
  int64_t bucket_elems = 0;
  std::vector<std::string> data;
  double val_fraction = 0;

  template <class Archive>
  void serialize(Archive& a) {
    a(step, run_id, seed, next_sample, model_json, seq, micro_batch, global_batch, steps, lr, min_lr, warmup,
      decay_steps, beta1, beta2, eps, weight_decay, clip_norm, tp, dp, pp, zero1, sequence_parallel, bucket_elems, data,
      val_fraction);
  }
};

// The state of a trainer with these (normalized) options at `step`.
TrainerState make_trainer_state(const TrainOptions& o, int64_t step, const std::string& run_id, int pp);
// The options `s` was saved with (layout fields included). FormatError
// naming `where` when its model does not parse.
TrainOptions options_of(const TrainerState& s, const std::string& where = "trainer state");
// The model `s` records (FormatError naming `where`).
ModelConfig model_of(const TrainerState& s, const std::string& where = "trainer state");
// cereal portable binary, a version number first.
std::string encode_trainer_state(const TrainerState& s);
// FormatError "<where>: trainer state ..." for bytes that do not decode.
TrainerState decode_trainer_state(const std::string& bytes, const std::string& where);
// Everything that makes a resumed run continue the saved one (model, data,
// batch, seed, schedule, AdamW) must be equal; the layout and micro-batch may
// differ. Returns "" or one line per difference naming the field and both values.
std::string resume_mismatches(const TrainerState& saved, const TrainOptions& now);
// The encoded state `bytes` with its recorded layout set to (tp, dp, pp)
// (`tessera ckpt reshard` of a training checkpoint). FormatError as decode.
std::string relayout_trainer_state(const std::string& bytes, int tp, int dp, int pp, const std::string& where);

}  // namespace tessera::parallel::models::gpt
