// train_gpt's --save / --resume flags: which checkpoint to resume and the
// run configuration it imposes (docs/checkpoint.md, "Training checkpoints").
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "parallel/models/gpt/trainer.h"

namespace tessera::gpt {

// Checks the flag combination and resolves --resume (a checkpoint directory,
// a --save directory's newest complete one, "latest" of --save, or a
// `tessera ckpt shard` directory). Fills `t` with the checkpoint's run
// configuration (model, seq, global batch, steps, seed, lr schedule, AdamW,
// data); `given(flag)` says whether the user gave a flag, and a given flag
// that disagrees is InvalidArgument naming both values. The layout (--tp,
// --dp, --zero1, --sequence-parallel, --micro-batch, --bucket-mb) may change;
// a --tp that cannot split the checkpoint's tensors is InvalidArgument naming
// the checkpoint, the tensor and its file. Returns the directory to load, or
// "" to start at step 0 (no --resume, or "latest" with nothing saved yet).
// FormatError for a damaged checkpoint.
std::string apply_resume_flags(parallel::models::gpt::TrainOptions& t, const std::string& resume,
                               const std::string& save, const std::string& init, int64_t save_every, int64_t keep,
                               const std::function<bool(const char*)>& given);

}  // namespace tessera::gpt
