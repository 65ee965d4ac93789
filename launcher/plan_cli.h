#pragma once
#include "launcher/cli.h"

namespace tessera::parallel {
// `tessera plan ...`: the sharding planner.
void add_plan_command(CLI::App& root, tessera::cli::Action& action);
// `tessera ckpt ...`: checkpoint tools (inspect, shard, consolidate, reshard);
// defined in launcher/ckpt_cli.cc.
void add_ckpt_command(CLI::App& root, tessera::cli::Action& action);
}  // namespace tessera::parallel
