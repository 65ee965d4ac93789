#include "runtime/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>

namespace tessera {

void init_logging(int rank) {
  static auto logger = [] {
    auto l = spdlog::stderr_color_mt("tessera");
    spdlog::set_default_logger(l);
    return l;
  }();
  std::string prefix = rank >= 0 ? "[" + std::to_string(rank) + "] " : "";
  logger->set_pattern(prefix + "[%H:%M:%S.%e] [%^%l%$] %v");
  const char* lvl = std::getenv("TESSERA_LOG_LEVEL");
  logger->set_level(lvl ? spdlog::level::from_str(lvl) : spdlog::level::info);
}

}  // namespace tessera
