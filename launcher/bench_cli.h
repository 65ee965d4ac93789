#pragma once
#include "launcher/cli.h"

namespace tessera::launcher {
// `tessera bench OP ...`: collective bandwidth, nccl-tests style (the bench
// library is collectives/bench/).
void add_bench_command(CLI::App& root, tessera::launcher::cli::Action& action);
}  // namespace tessera::launcher
