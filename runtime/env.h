// Reading the process environment.
#pragma once

#include <cstdlib>
#include <string>

namespace tessera {

// The value of environment variable `name`, or `dflt` when it is unset or empty.
inline std::string env_or(const char* name, const std::string& dflt = "") {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : dflt;
}

}  // namespace tessera
