#pragma once
#include <string>
#include <vector>

#include "launcher/cli.h"

namespace tessera::launcher {
// `tessera ckpt` for training checkpoints (train_gpt --save, parallel/checkpoint/train_ckpt.h).
// True when `path` is a training checkpoint directory (it has a train manifest).
bool is_train_ckpt_path(const std::string& path);
// inspect: step, run, layout, every tensor's shape and bytes, every file (after checking sizes, not hashes).
int run_train_inspect(const std::string& dir);
// consolidate --out FILE [--with-optimizer] DIR.
int run_train_consolidate(const std::string& dir, const std::string& out, bool with_optimizer);
// reshard of a training checkpoint (a step directory, or a --save directory's newest):
// OUT/step_NNNNNNNN in the new layout (dp <= 0: the checkpoint's), its trainer state's layout updated.
int run_train_reshard(const std::string& src, const std::string& out, int tp, int pp, int dp,
                      const std::vector<int>& stages, bool allow_nonfinite);
// `tessera ckpt verify DIR`: a training checkpoint (every hash, every element once) or a shard directory.
void add_ckpt_verify_command(CLI::App* ckpt, tessera::launcher::cli::Action& action);
}  // namespace tessera::launcher
