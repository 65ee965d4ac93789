// Timing-sensitive tests (a sleep or a speed ratio against a machine other
// builds load) are out of the default set: they skip unless
// TESSERA_TIMING_TESTS=1, which their `timing` ctest entries set
// (ctest -L timing; the label also carries `long`, so scripts/test.sh's
// default -LE 'long|tidy' leaves them out).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#define TESSERA_TIMING_TEST()                                                                  \
  do {                                                                                         \
    const char* tessera_timing_ = std::getenv("TESSERA_TIMING_TESTS");                         \
    if (!tessera_timing_ || std::string(tessera_timing_) != "1")                               \
      GTEST_SKIP() << "timing-sensitive: runs under ctest -L timing (TESSERA_TIMING_TESTS=1)"; \
  } while (0)
