#pragma once
#include "launcher/cli.h"

namespace tessera::launcher {
// `tessera plan ...`: the sharding planner (the planner library is
// parallel/planner.h; plan files are parallel/plan_io.h).
void add_plan_command(CLI::App& root, tessera::launcher::cli::Action& action);
}  // namespace tessera::launcher
