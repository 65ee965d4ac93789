#include "examples/gpt/resume_flags.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "examples/gpt/model_flags.h"
#include "parallel/checkpoint/checkpoint.h"
#include "parallel/models/gpt/hf.h"
#include "parallel/models/gpt/trainer_state.h"
#include "runtime/error.h"

namespace tessera::gpt {

namespace ckpt = parallel::checkpoint;
namespace models = parallel::models;

// --resume: the run configuration comes from the checkpoint; explicit flags
// that disagree are an error naming both values. The layout (--tp, --dp,
// --zero1, --sequence-parallel, --micro-batch, --bucket-mb) may change.
std::string apply_resume_flags(models::gpt::TrainOptions& t, const std::string& resume, const std::string& save,
                               const std::string& init, int64_t save_every, int64_t keep,
                               const std::function<bool(const char*)>& given) {
  TESSERA_ARG_CHECK(save_every == 0 || !save.empty(), "--save-every needs --save DIR");
  TESSERA_ARG_CHECK(keep == 0 || !save.empty(), "--keep needs --save DIR");
  if (!save.empty()) {
    // A --save directory that cannot be written is exit 2 now, not an error after the first K steps.
    std::error_code ec;
    std::filesystem::create_directories(save, ec);
    TESSERA_ARG_CHECK(std::filesystem::is_directory(save) && ::access(save.c_str(), W_OK | X_OK) == 0, "--save ", save,
                      ": not a writable directory", ec ? " (" + ec.message() + ")" : std::string());
  }
  if (resume.empty()) return "";
  TESSERA_ARG_CHECK(init.empty(), "--resume and --init exclude each other");
  std::string dir = resume;
  if (dir == "latest") {
    TESSERA_ARG_CHECK(!save.empty(), "--resume latest needs --save DIR");
    auto l = ckpt::latest_checkpoint(save);
    if (!l) return "";  // nothing saved yet: start at step 0
    dir = *l;
  } else {
    // A checkpoint directory, or a --save directory (its newest complete checkpoint).
    auto r = ckpt::resolve_checkpoint(dir);
    TESSERA_ARG_CHECK(r.has_value(), "--resume ", dir, ": not a checkpoint, nor a directory holding a complete one");
    dir = *r;
  }
  ckpt::Checkpoint ck(dir);
  if (!ck.has_trainer_state()) {
    // Weights only (a `tessera ckpt shard` output): a fresh optimizer at step 0; sizes as for --init.
    const parallel::ModelConfig c =
        parallel::ModelConfig::from_json_text(ck.model_json(), ck.where() + " (the manifest's model)");
    agree_model_flags(t.model, c, dir, given);
    t.model = c;
    if (!given("--seq")) t.seq = std::min<int64_t>(t.seq, c.max_seq);
    return ck.dir();
  }
  const models::gpt::TrainerState st =
      models::gpt::decode_trainer_state(ck.read_trainer_state(), "checkpoint " + ck.dir());
  auto agree = [&](const char* flag, auto value, auto saved) {
    TESSERA_ARG_CHECK(!given(flag) || value == saved, flag, " ", value, " does not match checkpoint ", ck.dir(),
                      ", which has ", saved);
  };
  agree_model_flags(t.model, models::gpt::model_of(st, "checkpoint " + ck.dir()), "checkpoint " + ck.dir(), given);
  agree("--seq", t.seq, st.seq);
  agree("--global-batch", t.global_batch, st.global_batch);
  agree("--steps", t.steps, st.steps);
  agree("--lr", t.lr, st.lr);
  agree("--min-lr", t.min_lr, st.min_lr);
  agree("--warmup", t.warmup, st.warmup);
  agree("--weight-decay", t.adamw.weight_decay, st.weight_decay);
  agree("--clip-grad", t.adamw.clip_norm, st.clip_norm);
  agree("--seed", t.seed, st.seed);
  TESSERA_ARG_CHECK(!given("--data") || t.data == st.data, "--data differs from checkpoint ", ck.dir(), "'s");
  const models::gpt::TrainOptions saved = models::gpt::options_of(st, "checkpoint " + ck.dir());
  t.model = saved.model;
  t.seq = saved.seq;
  t.global_batch = saved.global_batch;
  t.steps = saved.steps;
  t.lr = saved.lr;
  t.min_lr = saved.min_lr;
  t.warmup = saved.warmup;
  t.adamw.weight_decay = saved.adamw.weight_decay;
  t.adamw.clip_norm = saved.adamw.clip_norm;
  t.adamw.beta1 = saved.adamw.beta1;
  t.adamw.beta2 = saved.adamw.beta2;
  t.adamw.eps = saved.adamw.eps;
  t.seed = saved.seed;
  t.data = saved.data;
  t.val_fraction = saved.val_fraction;
  if (!given("--micro-batch")) t.micro_batch = saved.micro_batch;
  try {
    models::validate_layout(t.model, t.tp);
  } catch (const InvalidArgument& e) {
    // Name the tensor the new layout cannot split (the first split by heads: GPT's fused QKV, Llama's q_proj).
    std::string tensor = "?", file = "?";
    for (const auto& p : models::parameter_layout(saved.model, 2, 0))
      if (p.layer >= 0 && p.split_dim >= 0) {
        tensor = p.name;
        break;
      }
    for (const auto& p : ck.pieces())
      if (p.tensor == tensor) file = ck.files()[p.file].name;
    throw InvalidArgument(detail::concat("checkpoint ", ck.dir(), ": cannot resume under --tp ", t.tp, ": tensor ",
                                         tensor, " (in ", file, ") does not divide: ", e.what()));
  }
  return ck.dir();
}

}  // namespace tessera::gpt
