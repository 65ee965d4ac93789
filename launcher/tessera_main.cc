// `tessera`: runs `tessera run` itself and hands every other subcommand to
// tessera_tools in the same directory (launcher/front_end.h says why).
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string>

#include "launcher/front_end.h"
#include "launcher/run_cli.h"

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "run") == 0)
    return tessera::launcher::front_end_main(argc, argv, {&tessera::launcher::add_run_command});
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) {
    std::fprintf(stderr, "tessera: cannot resolve /proc/self/exe: %s\n", std::strerror(errno));
    return 127;
  }
  std::string tools(self, static_cast<size_t>(n));
  tools.resize(tools.rfind('/') + 1);
  tools += "tessera_tools";
  execv(tools.c_str(), argv);  // argv[0] stays the command the user typed
  std::fprintf(stderr, "tessera: cannot execute '%s': %s (it is built and installed beside tessera)\n", tools.c_str(),
               std::strerror(errno));
  return 127;
}
