// tessera_hello: the launcher's test program. Joins the job (init_worker),
// checks the store (every rank's key visible, Add counts every rank), passes
// a barrier and exits. Flags inject failures for the launcher's tests:
//   --exit-code N [--fail-rank R]   exit with N (on rank R only; default every rank)
//   --fail-round K                  inject the failure only in restart rounds < K
//   --throw-rank R                  rank R throws (reported as the root cause)
//   --stop-rank R                   rank R sends itself SIGSTOP after the barrier
//   --kill-rank R                   rank R sends itself SIGKILL after the barrier
//   --sleep S                       sleep S seconds after the barrier (failing ranks don't)
//   --pid-dir DIR                   write DIR/<rank>.pid (tests check nothing survives)
//   --term-dir DIR                  on SIGTERM, SIGINT, SIGHUP or SIGQUIT write the signal's number
//                                   to DIR/<rank>.term and exit 128 + the number
//   --print-env                     print the launcher's variables
//   --comm                          build the world communicator and all-reduce the ranks
//   --loop-seconds S                with --comm: all-reduce in a loop for S seconds (after injections)
//   --bare                          under `tessera run` only: one channel to the coordinator and one
//                                   barrier, nothing else (no heartbeat, watch, CPU binding): what any
//                                   program that speaks the launcher's protocol pays at least to meet
//                                   (the launch benchmark's floor, launcher/bench_launch.sh)
#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <string>

#include "launcher/client.h"
#include "launcher/worker.h"
#include "runtime/env.h"
#include "runtime/error.h"

namespace {

char g_term_path[4096];

void on_term(int sig) {
  if (g_term_path[0]) {
    int fd = open(g_term_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      char text[3];
      size_t n = 0;
      if (sig >= 10) text[n++] = static_cast<char>('0' + sig / 10);
      text[n++] = static_cast<char>('0' + sig % 10);
      text[n++] = '\n';
      ssize_t w = write(fd, text, n);  // write(2) only: async-signal-safe
      (void)w;
      close(fd);
    }
  }
  _exit(128 + sig);
}

// --bare: the coordinator's Unix socket (or its TCP address), the job token
// and the rank, as `tessera run` sets them; one Barrier call.
int bare_meet() {
  using tessera::env_or;
  std::string to = env_or("TESSERA_COORDINATOR_LOCAL", env_or("TESSERA_COORDINATOR"));
  const std::string token = env_or("TESSERA_JOB_TOKEN");
  if (to.empty() || token.empty()) throw tessera::InvalidArgument("--bare runs only under `tessera run`");
  const int rank = std::stoi(env_or("RANK", "0")), size = std::stoi(env_or("WORLD_SIZE", "1"));
  const int round = std::stoi(env_or("TESSERA_RESTART_COUNT", "0"));
  tessera::launcher::CoordinatorClient client(to, token);
  client.set_round(round);
  client.barrier("hello", rank, size, std::chrono::seconds(60));
  std::printf("rank %d of %d ok (round %d)\n", rank, size, round);
  std::fflush(stdout);
  return 0;
}

void sleep_seconds(double s) {
  timespec ts{static_cast<time_t>(s), static_cast<long>((s - static_cast<double>(static_cast<time_t>(s))) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

int run(int argc, char** argv) {
  CLI::App app{"tessera launcher test program"};
  int exit_code = 0, fail_rank = -1, fail_round = 1 << 30, throw_rank = -1, stop_rank = -1, kill_rank = -1;
  double sleep_s = 0, loop_s = 0;
  std::string pid_dir, term_dir;
  bool print_env = false, comm = false, meet_only = false, bare = false;
  app.add_option("--exit-code", exit_code);
  app.add_option("--fail-rank", fail_rank);
  app.add_option("--fail-round", fail_round);
  app.add_option("--throw-rank", throw_rank);
  app.add_option("--stop-rank", stop_rank);
  app.add_option("--kill-rank", kill_rank);
  app.add_option("--sleep", sleep_s);
  app.add_option("--pid-dir", pid_dir);
  app.add_option("--term-dir", term_dir);
  app.add_flag("--print-env", print_env);
  app.add_flag("--comm", comm);
  // Only join and pass one barrier (the launch benchmark's "start and meet"),
  // without the store checks, which cost size^2 calls.
  app.add_flag("--meet-only", meet_only);
  app.add_option("--loop-seconds", loop_s);
  app.add_flag("--bare", bare);
  CLI11_PARSE(app, argc, argv);
  if (bare) return bare_meet();

  tessera::launcher::WorkerOptions opts;
  opts.create_communicator = comm;
  return tessera::launcher::run_worker(opts, [&](tessera::launcher::WorkerContext& ctx) -> int {
    const int rank = ctx.world.rank, size = ctx.world.size;
    if (!pid_dir.empty()) std::ofstream(pid_dir + "/" + std::to_string(rank) + ".pid") << getpid() << "\n";
    if (!term_dir.empty()) {
      std::snprintf(g_term_path, sizeof g_term_path, "%s/%d.term", term_dir.c_str(), rank);
      for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGQUIT}) signal(sig, on_term);
    }
    if (print_env) {
      for (const char* v :
           {"TESSERA_RANK", "TESSERA_WORLD_SIZE", "TESSERA_LOCAL_RANK", "TESSERA_LOCAL_SIZE", "TESSERA_NODE_RANK",
            "TESSERA_COORDINATOR", "TESSERA_COORDINATOR_LOCAL", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
            "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT"}) {
        const char* x = std::getenv(v);
        std::printf("env %s=%s\n", v, x ? x : "");
      }
      std::printf("env TESSERA_JOB_TOKEN=%s\n", std::getenv("TESSERA_JOB_TOKEN") ? "set" : "");
      std::fflush(stdout);
    }
    if (meet_only) {
      ctx.barrier("hello");
      std::printf("rank %d of %d ok (round %d)\n", rank, size, ctx.restart_count);
      std::fflush(stdout);
      return 0;
    }
    // Store: every rank publishes, reads everyone, and counts itself in.
    ctx.store->set("hello/" + std::to_string(rank), std::to_string(rank * 7));
    std::vector<std::string> keys;
    keys.reserve(size);
    for (int r = 0; r < size; ++r) keys.push_back("hello/" + std::to_string(r));
    ctx.store->wait(keys, std::chrono::seconds(60));
    for (int r = 0; r < size; ++r) {
      // Present (wait() saw it): 30 s only for a loaded machine (1 s timed out with 128 ranks at load 15).
      auto v = ctx.store->get("hello/" + std::to_string(r), std::chrono::seconds(30));
      if (v != std::to_string(r * 7)) throw tessera::Error("store: rank " + std::to_string(r) + " wrote '" + v + "'");
    }
    ctx.store->add("hello/count", 1);
    ctx.barrier("hello");
    int64_t count = ctx.store->add("hello/count", 0);
    if (count != size)
      throw tessera::Error("store add: count " + std::to_string(count) + " != " + std::to_string(size));
    if (comm && ctx.world_comm) {
      int64_t v = rank, sum = 0;
      ctx.world_comm->all_reduce(&v, &sum, 1, tessera::DType::I64, tessera::collectives::ReduceOp::Sum);
      if (sum != int64_t(size) * (size - 1) / 2) throw tessera::Error("all_reduce: wrong sum " + std::to_string(sum));
    }
    std::printf("rank %d of %d ok (round %d)\n", rank, size, ctx.restart_count);
    std::fflush(stdout);
    const bool inject = ctx.restart_count < fail_round;
    if (inject && rank == throw_rank) throw tessera::Error("injected failure on rank " + std::to_string(rank));
    if (inject && rank == stop_rank) raise(SIGSTOP);
    if (inject && rank == kill_rank) raise(SIGKILL);
    if (inject && exit_code != 0 && (fail_rank < 0 || fail_rank == rank)) {
      std::fprintf(stderr, "rank %d exiting with code %d as asked\n", rank, exit_code);
      return exit_code;
    }
    if (comm && ctx.world_comm && loop_s > 0) {
      auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(loop_s);
      // Every rank stops after the same iteration (any rank's time being up
      // ends the loop for all), so none leaves while a peer still waits for it.
      for (;;) {
        int64_t v[2] = {rank, std::chrono::steady_clock::now() >= end ? 1 : 0}, sum[2] = {0, 0};
        ctx.world_comm->all_reduce(v, sum, 2, tessera::DType::I64, tessera::collectives::ReduceOp::Sum);
        if (sum[0] != int64_t(size) * (size - 1) / 2) throw tessera::Error("all_reduce: wrong sum");
        if (sum[1] > 0) break;
      }
    }
    if (sleep_s > 0) sleep_seconds(sleep_s);
    return 0;
  });
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::run_main("hello", [&] { return run(argc, argv); });
}
