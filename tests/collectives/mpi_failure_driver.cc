// tessera_mpi_failure_driver: the MPI backend's failure paths, run under
// mpirun by mpi_failure_test (tests/collectives/mpi_failure_test.cc).
//   --mode timeout        rank 1 never joins an all_reduce: the watchdog ends the job (MPI_Abort)
//   --mode split-timeout  rank 1 never joins split(): the same, naming "split"
//   --mode dead           rank 1 is killed (SIGKILL) while the others all-reduce: mpirun ends the job
//   --mode abort          every rank aborts its communicator: every later call (blocking, async,
//                         split) throws CollectiveError at once, naming the group and the reason
// Prints "rank R ok" when a rank saw what its mode expects.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/mpi/mpi_env.h"

using namespace tessera;
using namespace tessera::collectives;

namespace {

// Runs fn, which must throw at once, naming group 'victims' and containing
// `needle`: a CollectiveError, or after this rank's own abort() an
// AbortedError (as the shm and tcp transports throw).
template <typename F>
bool fails_at_once(const char* what, const std::string& needle, F fn) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    fn();
    std::fprintf(stderr, "%s succeeded on an aborted communicator\n", what);
    return false;
  } catch (const CollectiveError& e) {
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string w = e.what();
    if (w.find(needle) == std::string::npos || e.group() != "victims" || dt > 1.0) {
      std::fprintf(stderr, "%s: unexpected error after %.3f s: %s\n", what, dt, w.c_str());
      return false;
    }
    return true;
  } catch (const AbortedError& e) {
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string w = e.what();
    if (w.find(needle) == std::string::npos || w.find("'victims'") == std::string::npos || dt > 1.0) {
      std::fprintf(stderr, "%s: unexpected error after %.3f s: %s\n", what, dt, w.c_str());
      return false;
    }
    return true;
  }
}

int run(int argc, char** argv) {
  CLI::App app{"MPI failure-path driver"};
  std::string mode;
  int timeout_ms = 1000;
  app.add_option("--mode", mode)->required()->check(CLI::IsMember({"timeout", "split-timeout", "dead", "abort"}));
  app.add_option("--timeout-ms", timeout_ms);
  CLI11_PARSE(app, argc, argv);

  mpi::install();
  mpi::init();
  const int rank = mpi::world_rank(), size = mpi::world_size();
  CommOptions o;
  o.transport = TransportKind::Mpi;
  o.name = "victims";
  o.timeout = std::chrono::milliseconds(mode == "dead" ? 60000 : timeout_ms);
  auto c = Communicator::create(nullptr, rank, size, o);
  std::vector<float> buf(4096, 1.0f), out(4096 * static_cast<size_t>(size));
  c->all_reduce(buf.data(), buf.data(), buf.size(), DType::F32, ReduceOp::Sum);
  if (buf[0] != static_cast<float>(size)) {
    std::fprintf(stderr, "rank %d: warm-up sum %g\n", rank, buf[0]);
    return 3;
  }
  if (mode == "abort") {
    c->abort("test abort");
    bool ok = fails_at_once("all_reduce", "aborted",
                            [&] { c->all_reduce(buf.data(), buf.data(), buf.size(), DType::F32, ReduceOp::Sum); });
    ok = ok && fails_at_once("all_gather_async", "aborted",
                             [&] { c->all_gather_async(buf.data(), out.data(), buf.size(), DType::F32)->wait(); });
    ok = ok && fails_at_once("split", "aborted", [&] { c->split(0, rank); });
    ok = ok && fails_at_once("barrier", "aborted", [&] { c->barrier(); });
    if (!ok) return 4;
    std::printf("rank %d ok\n", rank);
    std::fflush(stdout);
    c.reset();
    mpi::finalize();
    return 0;
  }
  if (rank == 1) {
    if (mode == "dead") {
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        ::raise(SIGKILL);
      }).detach();
      for (;;) c->all_reduce(buf.data(), buf.data(), buf.size(), DType::F32, ReduceOp::Sum);
    }
    std::this_thread::sleep_for(std::chrono::seconds(60));  // never joins; the job must end without it
    return 5;
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < end) {
    if (mode == "split-timeout") {
      c->split(0, rank);
    } else {
      c->all_reduce(buf.data(), buf.data(), buf.size(), DType::F32, ReduceOp::Sum);
    }
  }
  std::fprintf(stderr, "rank %d: the job was not ended\n", rank);
  return 6;
}

}  // namespace

int main(int argc, char** argv) {
  // A call that throws where the mode expects none ends the whole job (as
  // an uncaught exception's abort did), naming the error.
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_failure_driver: error: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "mpi_failure_driver: error: unknown exception\n");
  }
  mpi::abort(1);
}
