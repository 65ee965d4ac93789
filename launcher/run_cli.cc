#include "launcher/run_cli.h"

#include <iostream>

namespace tessera::launcher {

void add_run_command(CLI::App& root, tessera::cli::Action& action) {
  auto* cmd = root.add_subcommand("run", "Launch workers (torchrun-style) with a gRPC coordinator");
  cmd->allow_extras();
  cmd->callback([&action] {
    action = [] {
      std::cerr << "tessera run: not built yet\n";
      return tessera::cli::kUsageExit;
    };
  });
}

}  // namespace tessera::launcher
