// Logging through spdlog. Every line carries the rank: "[3] message" for
// workers, no prefix for single-process tools. Call init_logging once the
// rank is known; before that the prefix is empty.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace tessera {

// Sets the process-wide logger's pattern to "[rank] [level] msg" (rank < 0: no
// prefix) and its level from TESSERA_LOG_LEVEL (trace, debug, info, warn, error;
// default info; a name that is none of spdlog's keeps info, with a warning). Safe to call again (e.g. after rank
// discovery).
void init_logging(int rank = -1);

}  // namespace tessera
