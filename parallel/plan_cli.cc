#include "parallel/plan_cli.h"

#include <iostream>

namespace tessera::parallel {

namespace {
void add_stub(CLI::App& root, const char* name, const char* help, tessera::cli::Action& action) {
  auto* cmd = root.add_subcommand(name, help);
  cmd->allow_extras();
  cmd->callback([&action, name] {
    action = [name] {
      std::cerr << "tessera " << name << ": not built yet\n";
      return tessera::cli::kUsageExit;
    };
  });
}
}  // namespace

void add_plan_command(CLI::App& root, tessera::cli::Action& action) {
  add_stub(root, "plan", "Plan TP x PP x DP sharding of a model over a topology", action);
}

void add_ckpt_command(CLI::App& root, tessera::cli::Action& action) {
  add_stub(root, "ckpt", "Shard, reshard and inspect checkpoints", action);
}

}  // namespace tessera::parallel
