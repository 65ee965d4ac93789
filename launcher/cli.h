// The `tessera` command line: one subcommand per feature, in two executables
// (launcher/front_end.h: `tessera` runs `run` and hands the rest to
// tessera_tools). Each subcommand's front-end (flags, rank modes) lives here in launcher/
// (bench_cli, plan_cli, ckpt_cli, run_cli) and drives a library in its own
// layer (the bench in collectives/bench/, the planner and the checkpoint tool
// in parallel/). This header is the common shape: a function that adds the
// subcommand to the root app and sets the action to run when it was chosen.
// Actions return the process exit code (docs/errors.md).
//
// It also holds the option checks every front-end (and train_gpt) uses, so a
// bad value reads the same everywhere. They check the text before CLI11
// converts it, which prefixes the flag:
//   --tp: must be a positive integer, got 0
//   --tp: must be a positive integer no larger than 2147483647, got 2147483648
// (CLI11's own Range prints its bounds as doubles and lets an int wrap.)
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <functional>
#include <limits>
#include <string>
#include <system_error>
#include <type_traits>

namespace tessera::launcher::cli {

using Action = std::function<int()>;

// Exit code for bad usage or bad input: an unknown flag, a bad value, or an
// input file that is missing or malformed (as getopt-style tools do).
constexpr int kUsageExit = 2;

namespace detail {
// "a positive integer", "an integer from 0 to 1", ... (bounds as text).
std::string integer_kind(const std::string& lo, const std::string& hi, bool lo_is_min, bool hi_is_max);
// The help text's tag: POSITIVE, NONNEGATIVE, INT in [lo - hi], or none.
std::string integer_tag(const std::string& lo, const std::string& hi, bool lo_is_min, bool hi_is_max);
}  // namespace detail

// A whole decimal number in [lo, hi]. The default bounds are those of T, so
// a value that does not fit the option's type is refused, never wrapped.
template <typename T>
CLI::Validator int_range(T lo = std::numeric_limits<T>::min(), T hi = std::numeric_limits<T>::max()) {
  static_assert(std::is_integral_v<T>);
  const bool lo_is_min = lo == std::numeric_limits<T>::min();
  const bool hi_is_max = hi == std::numeric_limits<T>::max();
  const std::string lo_s = std::to_string(lo), hi_s = std::to_string(hi);
  const std::string kind = detail::integer_kind(lo_s, hi_s, lo_is_min, hi_is_max);
  const bool say_max = hi_is_max && !lo_is_min;  // the kind does not name hi yet
  auto check = [lo, hi, kind, say_max, hi_s](std::string& text) -> std::string {
    const char* first = text.data();
    const char* last = first + text.size();
    if (first != last && *first == '+') ++first;
    T v{};
    auto [ptr, ec] = std::from_chars(first, last, v);
    const bool whole = first != last && ptr == last;  // digits only, perhaps too many
    if (whole && ec == std::errc() && v >= lo && v <= hi) return {};
    const bool above = whole && (ec == std::errc::result_out_of_range ? text[0] != '-' : v > hi);
    std::string what = "must be " + kind;
    if (above && say_max) what += " no larger than " + hi_s;
    return what + ", got " + (whole ? text : "'" + text + "'");
  };
  return CLI::Validator(check, detail::integer_tag(lo_s, hi_s, lo_is_min, hi_is_max));
}
// 1 .. max of T.
template <typename T>
CLI::Validator positive_int() {
  return int_range<T>(1);
}
// 0 .. max of T.
template <typename T>
CLI::Validator non_negative_int() {
  return int_range<T>(0);
}

// A finite number in [lo, hi], printed as written ("from 0.05 to 86400").
CLI::Validator number_range(double lo, double hi);
// A finite number > 0; a finite number >= 0.
CLI::Validator positive_number();
CLI::Validator non_negative_number();

// A path or address, not empty and not the next flag or "--" taken as the
// value (`--log-dir -- prog` made a directory named "--"; argparse refuses
// it too; `--json ""` wrote nothing and said nothing).
CLI::Validator not_a_flag();

// The check that fits the option's variable, integer or floating point:
//   cmd->add_option("--tp", args.tp, "...")->check(cli::positive(args.tp));
template <typename T>
CLI::Validator positive(const T&) {
  if constexpr (std::is_integral_v<T>)
    return positive_int<T>();
  else
    return positive_number();
}
template <typename T>
CLI::Validator non_negative(const T&) {
  if constexpr (std::is_integral_v<T>)
    return non_negative_int<T>();
  else
    return non_negative_number();
}
// Any value of an integer variable's type (refuses what would wrap).
template <typename T>
CLI::Validator any_int(const T&) {
  return int_range<T>();
}

// Throws InvalidArgument ("--export: cannot write 'x': directory 'd' does not
// exist") unless `path` could be created or replaced now: its directory
// exists and is writable, and `path` is not a directory. Front-ends call it
// before any work starts, so a bad output path fails at once, not after a
// training run. Creates nothing.
void check_output_file(const std::string& flag, const std::string& path);

}  // namespace tessera::launcher::cli
