#include "runtime/library_text.h"

namespace tessera {

std::string json_library_text(std::string_view s) {
  // The tag: "[json.exception.<kind>.<id>] ".
  if (s.substr(0, 16) == "[json.exception.") {
    const size_t close = s.find("] ");
    if (close != std::string_view::npos) s.remove_prefix(close + 2);
  }
  auto drop = [&s](std::string_view prefix) {
    if (s.substr(0, prefix.size()) == prefix) s.remove_prefix(prefix.size());
  };
  drop("parse error ");  // "at line L, column C: ..." follows
  drop("type ");         // "must be number, but is string"
  return std::string(s);
}

}  // namespace tessera
