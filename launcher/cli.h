// The `tessera` command line: one binary, one subcommand per feature. Each
// subcommand's code lives beside what it drives (bench in collectives/,
// plan and ckpt in parallel/, run in launcher/); this header is the common
// shape: a function that adds the subcommand to the root app and sets the
// action to run when it was chosen. Actions return the process exit code.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace tessera::cli {

using Action = std::function<int()>;

// Exit code for bad usage (unknown flag, bad value), as getopt-style tools do.
constexpr int kUsageExit = 2;

}  // namespace tessera::cli
