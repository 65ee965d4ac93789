// The `tessera` command line, shared by its two executables:
//   tessera        what users type. It runs `tessera run` itself and hands
//                  every other subcommand (and --help, --version) to
//                  tessera_tools beside it, with the same arguments (execv).
//   tessera_tools  every subcommand: run, bench, plan, ckpt.
// A job's launcher thus maps none of the libraries only the tools need (MPI
// for `bench`, OpenBLAS and oneDNN for the planner's and checkpoints'
// kernels): loading and relocating them was half of `tessera run`'s own
// start-up CPU (docs/launcher.md, Benchmark).
// Both open /dev/null on any of descriptors 0, 1 and 2 the caller closed,
// before anything else opens a file.
#pragma once

#include <initializer_list>

#include "launcher/cli.h"

namespace tessera::launcher {

using AddCommand = void (*)(CLI::App& root, cli::Action& action);

// Parses argv with the given subcommands, runs the chosen one's action and
// returns the exit code: 2 with usage for bad flags (docs/errors.md).
int front_end_main(int argc, char** argv, std::initializer_list<AddCommand> commands);

}  // namespace tessera::launcher
