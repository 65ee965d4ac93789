#include "launcher/run_cli.h"

#include <iostream>
#include <memory>

#include "launcher/agent.h"
#include "runtime/error.h"

namespace tessera::launcher {

void add_run_command(CLI::App& root, tessera::launcher::cli::Action& action) {
  auto opts = std::make_shared<RunOptions>();
  auto secs = std::make_shared<std::array<double, 3>>(std::array<double, 3>{10.0, 300.0, 2.0});
  auto* cmd =
      root.add_subcommand("run",
                          "Launch workers (torchrun-style) with a gRPC coordinator.\n"
                          "Usage: tessera run --nproc-per-node N [--nnodes M --node-rank K --coordinator HOST:PORT]\n"
                          "                   [--max-restarts R] [--log-dir DIR] -- PROGRAM ARGS...");
  cmd->add_option("--nproc-per-node,--nproc_per_node", opts->nproc_per_node, "Workers on this node")
      ->required()
      ->check(cli::int_range(1, 4096));
  cmd->add_option("--nnodes", opts->nnodes, "Nodes in the job")->check(cli::int_range(1, 4096));
  cmd->add_option("--node-rank,--node_rank", opts->node_rank, "This node's rank (node 0 hosts the coordinator)")
      ->check(cli::non_negative(opts->node_rank));
  cmd->add_option("--coordinator", opts->coordinator,
                  "HOST:PORT of the coordinator (node 0 listens there); default 127.0.0.1 and a free port")
      ->check(cli::not_a_flag());
  cmd->add_option("--max-restarts,--max_restarts", opts->max_restarts, "Restart the whole group up to R times")
      ->check(cli::int_range(0, 1000));
  cmd->add_option("--master-port,--master_port", opts->master_port,
                  "MASTER_PORT: the port node 0 keeps for rank 0's store (torch's TCPStore); default a free one, "
                  "never the coordinator's")
      ->check(cli::int_range(0, 65535));
  cmd->add_option("--log-dir,--log_dir", opts->log_dir, "Also write each rank's output to DIR/rank_<r>.log")
      ->check(cli::not_a_flag());
  cmd->add_option("--heartbeat-timeout", (*secs)[0],
                  "Seconds without a heartbeat before a worker or node is declared lost (default 10)")
      ->check(cli::number_range(0.05, 86400.0));
  cmd->add_option("--rdzv-timeout", (*secs)[1], "Seconds to wait for all nodes to join (default 300)")
      ->check(cli::number_range(0.1, 86400.0));
  cmd->add_option("--kill-grace", (*secs)[2], "Seconds between SIGTERM and SIGKILL when stopping workers (default 2)")
      ->check(cli::number_range(0.0, 60.0));
  // Everything from the program on belongs to the program, flags included
  // (`tessera run -n 2 prog --lr 1` as with torchrun, or after `--`).
  cmd->add_option("command", opts->command, "PROGRAM ARGS...");
  cmd->positionals_at_end();
  cmd->footer(
      "Temporary files: none of its own; workers inherit TMPDIR. Every process of the job inherits TESSERA_JOB_ID "
      "(the launcher's, else the run id).");
  cmd->callback([opts, secs, cmd, &action] {
    auto ms = [](double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000.0)); };
    opts->heartbeat_timeout = ms((*secs)[0]);
    opts->rdzv_timeout = ms((*secs)[1]);
    opts->kill_grace = ms((*secs)[2]);
    action = [opts, cmd] {
      try {
        if (opts->command.empty()) throw InvalidArgument("no program given");
        if (!opts->command.front().empty() && opts->command.front()[0] == '-')
          throw InvalidArgument("unknown option '" + opts->command.front() + "' (the program goes after --)");
        return run_job(*opts);
      } catch (const InvalidArgument& e) {
        std::cerr << "tessera run: " << e.what() << "\n" << cmd->help();
        return tessera::launcher::cli::kUsageExit;
      }
    };
  });
}

}  // namespace tessera::launcher
