#include "runtime/error.h"

namespace tessera::detail {

void throw_check_failure(const char* file, int line, const std::string& what) {
  throw InternalError(concat(what, " [", file, ":", line, "]"));
}

}  // namespace tessera::detail
