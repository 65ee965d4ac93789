#pragma once
#include "launcher/cli.h"

namespace tessera::launcher {
// `tessera run --nproc-per-node N ... -- PROGRAM ARGS...`
void add_run_command(CLI::App& root, tessera::launcher::cli::Action& action);
}  // namespace tessera::launcher
