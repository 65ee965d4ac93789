#include "launcher/cli.h"

#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "runtime/error.h"
#include "runtime/files.h"

namespace tessera::launcher::cli {

namespace detail {

std::string integer_kind(const std::string& lo, const std::string& hi, bool lo_is_min, bool hi_is_max) {
  if (hi_is_max && lo == "1") return "a positive integer";
  if (hi_is_max && lo == "0") return "a non-negative integer";
  if (lo_is_min && hi_is_max) return "an integer from " + lo + " to " + hi;
  if (hi_is_max) return "an integer of at least " + lo;
  return "an integer from " + lo + " to " + hi;
}

std::string integer_tag(const std::string& lo, const std::string& hi, bool lo_is_min, bool hi_is_max) {
  if (hi_is_max && lo == "1") return "POSITIVE";
  if (hi_is_max && lo == "0") return "NONNEGATIVE";
  if (lo_is_min && hi_is_max) return "";
  return "INT in [" + lo + " - " + hi + "]";
}

}  // namespace detail

namespace {

// "0.05", "86400", "1e-06": the shortest text that reads back as `v`.
std::string num(double v) {
  std::ostringstream os;
  os.precision(15);
  os << v;
  return os.str();
}

// Returns "" when `text` is a finite number for which `ok` holds, else the message.
CLI::Validator number_check(std::string kind, std::string tag, std::function<bool(double)> ok) {
  auto check = [kind = std::move(kind), ok = std::move(ok)](std::string& text) -> std::string {
    errno = 0;
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    const bool number = !text.empty() && end == text.c_str() + text.size() && std::isfinite(v);
    if (number && ok(v)) return {};
    return "must be " + kind + ", got " + (number ? text : "'" + text + "'");
  };
  return CLI::Validator(std::move(check), std::move(tag));
}

}  // namespace

CLI::Validator number_range(double lo, double hi) {
  return number_check("a number from " + num(lo) + " to " + num(hi), "FLOAT in [" + num(lo) + " - " + num(hi) + "]",
                      [lo, hi](double v) { return v >= lo && v <= hi; });
}

CLI::Validator not_a_flag() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        if (v.empty()) return "expected a value, got an empty string";
        if (v[0] == '-')
          return "expected a value, got '" + v + "' (a flag, or the -- before the program: give the value first)";
        return "";
      },
      "");
}

CLI::Validator positive_number() {
  return number_check("a positive number", "POSITIVE", [](double v) { return v > 0; });
}

CLI::Validator non_negative_number() {
  return number_check("a non-negative number", "NONNEGATIVE", [](double v) { return v >= 0; });
}

void check_output_file(const std::string& flag, const std::string& path) {
  namespace fs = std::filesystem;
  auto fail = [&](const std::string& why) { throw InvalidArgument(flag + ": cannot write '" + path + "': " + why); };
  if (path.empty()) fail("empty path");
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_directory(p, ec)) fail("it is a directory");
  // A block device, socket or dangling symlink is refused (runtime/files.h, classify_output); a character device or
  // FIFO is written through, so only it need be writable, not its directory (/dev/stdout).
  if (const std::string why = output_refusal(path); !why.empty()) fail(why);
  if (classify_output(path).kind == OutputKind::WriteThrough) {
    if (::access(path.c_str(), W_OK) != 0) fail(std::strerror(errno));
    return;
  }
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  if (!fs::exists(dir, ec)) fail("directory '" + dir.string() + "' does not exist");
  if (!fs::is_directory(dir, ec)) fail("'" + dir.string() + "' is not a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0) fail("directory '" + dir.string() + "': " + std::strerror(errno));
  if (fs::exists(p, ec) && ::access(p.c_str(), W_OK) != 0) fail(std::strerror(errno));
  // access() says yes to root in /proc, and nothing checks the name's length: the
  // file itself is created and renamed there (write_file_atomic), so try that much.
  if (p.filename().string().size() > NAME_MAX) fail("file name longer than " + std::to_string(NAME_MAX) + " bytes");
  if (const std::string why = file_creation_refusal(dir.string()); !why.empty()) fail(why);
}

}  // namespace tessera::launcher::cli
