// `tessera`: one binary that dispatches to each feature's subcommand.
#include <iostream>

#include "launcher/bench_cli.h"
#include "launcher/ckpt_cli.h"
#include "launcher/cli.h"
#include "launcher/plan_cli.h"
#include "launcher/run_cli.h"
#include "runtime/error.h"
#include "runtime/log.h"
#include "tessera_version.h"

namespace {

int run(int argc, char** argv) {
  CLI::App app{"tessera: a distributed training runtime on emulated accelerator cores", "tessera"};
  app.set_version_flag("--version", std::string("tessera ") + TESSERA_VERSION);
  app.require_subcommand(1);
  tessera::launcher::cli::Action action;
  tessera::launcher::add_run_command(app, action);
  tessera::launcher::add_bench_command(app, action);
  tessera::launcher::add_plan_command(app, action);
  tessera::launcher::add_ckpt_command(app, action);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);  // prints the error
    // Print the usage of the subcommand that failed, else of the root.
    const CLI::App* failed = &app;
    for (const auto* sub : app.get_subcommands()) failed = sub;
    std::cerr << failed->help();
    return tessera::launcher::cli::kUsageExit;
  }
  if (!action) {
    std::cerr << app.help();
    return tessera::launcher::cli::kUsageExit;
  }
  tessera::init_logging();
  try {
    return action();
  } catch (const tessera::InvalidArgument& e) {
    std::cerr << "tessera: " << e.what() << "\n";
    return tessera::launcher::cli::kUsageExit;
  } catch (const std::exception& e) {
    std::cerr << "tessera: error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::run_main("tessera", [&] { return run(argc, argv); });
}
