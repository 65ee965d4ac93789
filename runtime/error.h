// tessera's error policy (docs/errors.md): library code throws exceptions
// derived from tessera::Error for every failure a caller can act on (bad
// input, out of memory, timeouts, aborted or failed peers, malformed files).
// Invariants that only a bug can break use TESSERA_CHECK*, which throws
// InternalError with both operands printed. Exceptions never cross an Asio
// handler or a gRPC callback: those layers convert to values at the boundary.
#pragma once

#include <cstdio>
#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>

namespace tessera {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A caller passed something wrong (shape mismatch, unknown preset, bad flag value).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A file or message did not have the expected format; the message names the file.
class FormatError : public Error {
 public:
  using Error::Error;
};

// A wait ran past its deadline.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// The job or a communicator was aborted (by abort(), a failed peer, or the launcher).
class AbortedError : public Error {
 public:
  using Error::Error;
};

// A bug: an invariant did not hold.
class InternalError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void throw_check_failure(const char* file, int line, const std::string& what);
}  // namespace detail

// The body of a program's main(): returns what `body` returns; anything that
// escapes it (setting up the command line can throw too, e.g. bad_alloc) is
// printed as "<prog>: error: ..." and gives exit code 1, instead of
// std::terminate's abort.
template <class Body>
int run_main(const char* prog, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", prog, e.what());
  } catch (...) {
    std::fprintf(stderr, "%s: error: unknown exception\n", prog);
  }
  return 1;
}

}  // namespace tessera

#define TESSERA_CHECK(cond, ...)                                                                                    \
  do {                                                                                                              \
    if (!(cond))                                                                                                    \
      ::tessera::detail::throw_check_failure(__FILE__, __LINE__,                                                    \
                                             ::tessera::detail::concat("check failed: " #cond " ", ##__VA_ARGS__)); \
  } while (0)

#define TESSERA_CHECK_OP(a, b, op, ...)                                                                            \
  do {                                                                                                             \
    const auto& tessera_a_ = (a);                                                                                  \
    const auto& tessera_b_ = (b);                                                                                  \
    if (!(tessera_a_ op tessera_b_))                                                                               \
      ::tessera::detail::throw_check_failure(                                                                      \
          __FILE__, __LINE__,                                                                                      \
          ::tessera::detail::concat("check failed: " #a " " #op " " #b " (", tessera_a_, " vs ", tessera_b_, ") ", \
                                    ##__VA_ARGS__));                                                               \
  } while (0)

#define TESSERA_CHECK_EQ(a, b, ...) TESSERA_CHECK_OP(a, b, ==, ##__VA_ARGS__)
#define TESSERA_CHECK_NE(a, b, ...) TESSERA_CHECK_OP(a, b, !=, ##__VA_ARGS__)
#define TESSERA_CHECK_LT(a, b, ...) TESSERA_CHECK_OP(a, b, <, ##__VA_ARGS__)
#define TESSERA_CHECK_LE(a, b, ...) TESSERA_CHECK_OP(a, b, <=, ##__VA_ARGS__)
#define TESSERA_CHECK_GE(a, b, ...) TESSERA_CHECK_OP(a, b, >=, ##__VA_ARGS__)

// Argument validation that throws InvalidArgument (a caller's mistake, not a bug).
#define TESSERA_ARG_CHECK(cond, ...)                                                       \
  do {                                                                                     \
    if (!(cond)) throw ::tessera::InvalidArgument(::tessera::detail::concat(__VA_ARGS__)); \
  } while (0)
