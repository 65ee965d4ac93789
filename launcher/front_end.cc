#include "launcher/front_end.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <iostream>

#include "runtime/error.h"
#include "runtime/log.h"
#include "tessera_version.h"

namespace tessera::launcher {

namespace {

// Descriptors 0, 1 and 2 on /dev/null where the caller closed them, before
// anything opens a file: the first pipe or socket would otherwise take the
// closed number, and what the launcher writes to stdout or stderr (workers'
// output, the root-cause report) would go into it. Started with all three
// closed, `tessera run` wrote a worker's lines into its own descriptors and
// failed the job. (OpenSSH's sanitise_stdfd does the same.)
void open_closed_std_fds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    const int got = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);  // the lowest free number: fd
    if (got > fd) {
      dup2(got, fd);
      close(got);
    }
  }
}

int parse_and_run(int argc, char** argv, std::initializer_list<AddCommand> commands) {
  CLI::App app{"tessera: a distributed training runtime on emulated accelerator cores", "tessera"};
  app.set_version_flag("--version", std::string("tessera ") + TESSERA_VERSION);
  app.require_subcommand(1);
  cli::Action action;
  for (AddCommand add : commands) add(app, action);

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
    return cli::kUsageExit;
  }
  if (!action) {
    std::cerr << app.help();
    return cli::kUsageExit;
  }
  init_logging();
  try {
    return action();
  } catch (const InvalidArgument& e) {
    std::cerr << "tessera: " << e.what() << "\n";
    return cli::kUsageExit;
  } catch (const std::exception& e) {
    std::cerr << "tessera: error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace

int front_end_main(int argc, char** argv, std::initializer_list<AddCommand> commands) {
  open_closed_std_fds();
  return run_main("tessera", [&] { return parse_and_run(argc, argv, commands); });
}

}  // namespace tessera::launcher
