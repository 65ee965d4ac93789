#include "runtime/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <atomic>
#include <cstdlib>
#include <string>

namespace tessera {

void init_logging(int rank) {
  static auto logger = [] {
    auto l = spdlog::stderr_color_mt("tessera");
    spdlog::set_default_logger(l);
    return l;
  }();
  std::string prefix = rank >= 0 ? "[" + std::to_string(rank) + "] " : "";
  logger->set_pattern(prefix + "[%H:%M:%S.%e] [%^%l%$] %v");
  // spdlog reads a name it does not know as "off", which hid every error,
  // root causes included: such a value keeps info and says so, once.
  const char* lvl = std::getenv("TESSERA_LOG_LEVEL");
  spdlog::level::level_enum level = spdlog::level::info;
  bool known = lvl == nullptr || *lvl == '\0';
  if (!known) {
    level = spdlog::level::from_str(lvl);
    known = level != spdlog::level::off || std::string(lvl) == "off";
    if (!known) level = spdlog::level::info;
  }
  logger->set_level(level);
  static std::atomic<bool> said{false};
  if (!known && !said.exchange(true)) {
    logger->warn("TESSERA_LOG_LEVEL='{}' is not a level (trace, debug, info, warn, error, critical, off); using info",
                 lvl);
  }
}

}  // namespace tessera
