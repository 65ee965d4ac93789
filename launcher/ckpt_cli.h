#pragma once
#include "launcher/cli.h"

namespace tessera::launcher {
// `tessera ckpt ...`: checkpoint tools (inspect, shard, consolidate,
// reshard) over the library in parallel/checkpoint/ckpt_tool.h.
void add_ckpt_command(CLI::App& root, tessera::launcher::cli::Action& action);
}  // namespace tessera::launcher
