#include "collectives/bench/bench_cli.h"

#include <iostream>

namespace tessera::coll {

void add_bench_command(CLI::App& root, tessera::cli::Action& action) {
  auto* cmd = root.add_subcommand("bench", "Measure collective bandwidth (nccl-tests style)");
  cmd->allow_extras();
  cmd->callback([&action] {
    action = [] {
      std::cerr << "tessera bench: not built yet\n";
      return tessera::cli::kUsageExit;
    };
  });
}

}  // namespace tessera::coll
