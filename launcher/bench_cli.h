#pragma once
#include "launcher/cli.h"

namespace tessera::coll {
// `tessera bench OP ...`: collective bandwidth, nccl-tests style.
void add_bench_command(CLI::App& root, tessera::cli::Action& action);
}  // namespace tessera::coll
