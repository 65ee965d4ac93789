// `tessera`: runs `tessera run` itself and hands every other subcommand to
// tessera_tools in the same directory (launcher/front_end.h says why).
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "launcher/front_end.h"
#include "launcher/run_cli.h"
#include "launcher/spawn.h"

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "run") == 0)
    return tessera::launcher::front_end_main(argc, argv, {&tessera::launcher::add_run_command});
  std::string tools;
  try {
    tools = tessera::launcher::beside_own_executable("tessera_tools");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera: %s\n", e.what());
    return 127;
  }
  execv(tools.c_str(), argv);  // argv[0] stays the command the user typed
  std::fprintf(stderr, "tessera: cannot execute '%s': %s (it is built and installed beside tessera)\n", tools.c_str(),
               std::strerror(errno));
  return 127;
}
