// `tessera bench OP ...`: the command line, and how the ranks come to be.
// What one rank does is the bench library's (collectives/bench/bench_rank.h).
//
// Three ways to run (docs/bench.md):
// - `tessera bench OP -r N`: this process runs N ranks of itself as the
//   workers of a one-node `tessera run` job (agent.h, run_job), which join
//   it as below; with --transport mpi (or, for MPI's side, --compare mpi)
//   it runs `mpirun -np N` instead, since MPI must start the processes.
// - under `tessera run`, `mpirun -np N` or srun: the launcher made the
//   ranks; each joins the job through the worker bootstrap
//   (launcher/worker.h: the coordinator's store), and the bench rendezvous
//   in the job's store.
#include "launcher/bench_cli.h"

#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <thread>

#include "collectives/algorithms.h"
#include "collectives/bench/bench.h"
#include "collectives/bench/bench_rank.h"
#include "collectives/mpi/mpi_env.h"
#include "launcher/agent.h"
#include "launcher/agent_options.h"
#include "launcher/root_cause.h"
#include "launcher/spawn.h"
#include "launcher/worker.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/world.h"

extern char** environ;

namespace tessera::launcher {
namespace {

using namespace tessera::collectives;  // the bench library and the communicator

// The rank's options (-r, --transport, --json, ...) and the sweep's flags.
struct BenchArgs : bench::RankOptions {
  std::string op;
  std::string minbytes = "32M", maxbytes = "32M";
  double stepfactor = std::numeric_limits<double>::quiet_NaN();  // NaN: -f not given (-f 0 is refused)
  std::string stepbytes;
  int iters = 20, warmup = 5;
  std::string datatype = "f32", redop = "sum";
  int check = 1;
  int root = 0;
  bool oversubscribe = false;
  bool sweep_given = false;  // any of -b, -e, -f, -i
};

// With --topology and no sweep flags, the default 32M size is joined by the
// latency-bound sizes of decode's per-layer TP all-reduce, one token's
// hidden vector: GPT-2 medium's 1024 in bf16 (2 KiB), Llama-3-8B's 4096 in
// bf16 (8 KiB) and Llama-3-70B's 8192 in fp32 (32 KiB) (docs/inference.md).
constexpr size_t kDecodeSizes[] = {2 << 10, 8 << 10, 32 << 10};

// Ranks per online CPU that -r may start without --oversubscribe. Every rank
// spins while it waits for a peer, so far beyond this a 2-core machine no
// longer makes progress (-r 1000 on 2 cores: 363 ranks joined in 60 s).
constexpr int kRanksPerCpu = 64;

long online_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  return std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
}

// MemAvailable from /proc/meminfo in bytes; 0 when it cannot be read.
// TESSERA_TEST_MEM_AVAILABLE (bytes, or 2G-style) replaces it, for the tests
// of the refusal only (docs/bench.md).
uint64_t mem_available() {
  if (const std::string v = env_or("TESSERA_TEST_MEM_AVAILABLE"); !v.empty()) return bench::parse_size(v);
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  uint64_t kb = 0;
  while (in >> key >> kb) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kb * 1024;
  }
  return 0;
}

// Refuses, before anything is spawned or allocated, a local job the machine
// cannot run: more ranks than kRanksPerCpu x CPUs (unless --oversubscribe),
// or send and receive buffers of all ranks beyond MemAvailable.
void check_fits(const BenchArgs& a, const bench::BenchConfig& cfg, int ranks) {
  const long cpus = online_cpus();
  if (!a.oversubscribe && ranks > kRanksPerCpu * cpus)
    throw InvalidArgument(detail::concat("-r ", ranks, " is more than ", kRanksPerCpu,
                                         " ranks per CPU on this machine (", cpus, " CPUs: at most ",
                                         kRanksPerCpu * cpus, "); pass --oversubscribe to start them anyway"));
  const uint64_t per_rank = 2 * static_cast<uint64_t>(bench::bytes_needed(cfg, ranks));
  const uint64_t need = per_rank * static_cast<uint64_t>(ranks);
  const uint64_t avail = mem_available();
  if (avail > 0 && need > avail)
    throw InvalidArgument(detail::concat(
        "the buffers do not fit in memory: ", ranks, " rank(s) x ", per_rank >> 20, " MiB (send and receive buffer of ",
        bench::bytes_needed(cfg, ranks) >> 20, " MiB each) = ", need >> 20, " MiB, but MemAvailable is ", avail >> 20,
        " MiB", env_or("TESSERA_TEST_MEM_AVAILABLE").empty() ? "" : " (TESSERA_TEST_MEM_AVAILABLE)",
        "; lower -e/--maxbytes or -r"));
}

bench::BenchConfig make_config(const BenchArgs& a) {
  bench::BenchConfig c;
  c.op = bench::parse_bench_op(a.op);
  size_t lo = bench::parse_size(a.minbytes), hi = bench::parse_size(a.maxbytes);
  const bool given = !std::isnan(a.stepfactor);
  if (given && !a.stepbytes.empty()) throw InvalidArgument("give -f/--stepfactor or -i/--stepbytes, not both");
  if (given && !(a.stepfactor > 1.0))
    throw InvalidArgument(detail::concat("-f/--stepfactor must be > 1, got ", a.stepfactor));
  double factor = given ? a.stepfactor : 0;
  size_t step = 0;
  if (!a.stepbytes.empty())
    step = bench::parse_size(a.stepbytes);
  else if (factor == 0)
    factor = 2.0;  // nccom-test's default sweep doubles
  c.sizes = bench::size_sweep(lo, hi, factor, step);
  if (!a.topology.empty() && !a.sweep_given)
    c.sizes.insert(c.sizes.begin(), std::begin(kDecodeSizes), std::end(kDecodeSizes));
  c.iters = a.iters;
  c.warmup = a.warmup;
  c.dtype = parse_dtype(a.datatype);
  c.redop = parse_reduce_op(a.redop);
  c.check = a.check != 0;
  c.root = a.root;
  if (std::string s = env_or("TESSERA_BENCH_CORRUPT"); !s.empty()) {
    char* end = nullptr;
    long r = std::strtol(s.c_str(), &end, 10);
    if (!end || *end || r < 0) throw InvalidArgument("TESSERA_BENCH_CORRUPT='" + s + "' is not a rank");
    c.corrupt_rank = static_cast<int>(r);
  }
  return c;
}

// ---- spawning ranks ------------------------------------------------------------

std::vector<std::string> own_argv() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> out;
  std::string s;
  while (std::getline(f, s, '\0')) out.push_back(s);
  return out;
}

// mpirun's flags for n ranks at OpenMPI's best: --oversubscribe only when
// the ranks outnumber the CPUs (it also turns on mpi_yield_when_idle and
// turns off binding, both of which slow ranks that have a core each).
std::vector<std::string> mpirun_prefix(int n) {
  std::vector<std::string> args{"mpirun"};
  if (n > online_cpus()) args.push_back("--oversubscribe");
  args.insert(args.end(), {"-np", std::to_string(n)});
  return args;
}

// "SIGKILL" for 9: the name users see in kill -l.
std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

// A stop signal (SIGTERM, SIGINT, SIGHUP, SIGQUIT) this parent took and
// passed on: the command ends with 128 + signal once its child is gone
// (thrown through the callers' cleanups, which remove their temp dirs).
struct Stopped {
  int sig;
};

// The stop signals and SIGCHLD, blocked while this parent waits for its
// child and taken with sigtimedwait (restored by the destructor): the wait
// ends as soon as the child exits, not at the next tick.
class StopSignals {
 public:
  StopSignals() {
    sigemptyset(&set_);
    for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGCHLD}) sigaddset(&set_, sig);
    pthread_sigmask(SIG_BLOCK, &set_, &old_);
  }
  ~StopSignals() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // A stop signal that arrived within `tick`, else 0 (also when a child
  // exited: the caller reaps it).
  int take(const timespec& tick) const {
    const int sig = sigtimedwait(&set_, nullptr, &tick);
    return sig > 0 && sig != SIGCHLD ? sig : 0;
  }

 private:
  sigset_t set_{}, old_{};
};

// Runs argv (argv[0] looked up in PATH; mpirun) under the launcher's
// spawner (spawn.h): a keeper leading the child's process group SIGKILLs the
// group when this parent dies, however it dies, so mpirun and the ranks it
// started go along. A stop signal is forwarded to the group, which gets 5 s
// (none after a second signal) before SIGKILL; then Stopped is thrown.
// Returns the child's exit code (128 + signal when killed).
int run_child(const std::vector<std::string>& args) {
  // mpirun refuses root unless told; the user asked us to start the ranks.
  if (geteuid() == 0) {
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  }
  const std::string program = resolve_program(args[0]);
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  std::cout.flush();
  std::cerr.flush();
  const StopSignals stop;
  const SpawnedWorker child = spawn_worker(program, args, env, /*stdin_fd=*/0, /*cpu=*/-1, /*inherit_output=*/true);
  int interrupted = 0;
  auto kill_at = std::chrono::steady_clock::time_point::max();
  for (;;) {
    int status = 0;
    const pid_t p = waitpid(child.pid, &status, WNOHANG);
    if (p < 0 && errno != EINTR) throw Error(std::string("bench: waitpid: ") + std::strerror(errno));
    if (p == child.pid) {
      if (!interrupted) return exit_code_of_status(status);
      // mpirun can exit before the last of its ranks: nothing of the group
      // outlives this parent (bounded: a process in D state may take a while).
      kill(-child.pid, SIGKILL);
      for (int i = 0; i < 200 && kill(-child.pid, 0) == 0; ++i) ::usleep(10 * 1000);
      throw Stopped{interrupted};
    }
    if (std::chrono::steady_clock::now() > kill_at) {
      kill(-child.pid, SIGKILL);
      kill_at = std::chrono::steady_clock::time_point::max();
    }
    if (const int sig = stop.take(timespec{0, 100L * 1000 * 1000})) {  // the tick bounds the grace's end
      if (!interrupted) {
        interrupted = sig;
        std::cerr << "tessera bench: got " << signal_name(sig) << "; stopping " << args[0] << "\n";
        kill(-child.pid, sig);
        kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      } else {
        kill_at = std::chrono::steady_clock::now();  // a second signal: no more grace
      }
    }
  }
}

// mpirun on ourselves: MPI has to start the processes it connects.
int spawn_with_mpirun(int n) {
  std::vector<std::string> args = mpirun_prefix(n);
  args.push_back(own_executable());
  auto mine = own_argv();
  args.insert(args.end(), mine.begin() + 1, mine.end());
  return run_child(args);
}

// N ranks of ourselves on this host, as `tessera run --nproc-per-node N`
// starts and supervises its workers (agent.h, run_job): one spawner, one
// exit-code and root-cause path. The coordinator serves this process; each
// rank joins the job through it (join_launched_job: its store, heartbeats,
// abort when a peer fails). Their lines reach this process's stdout and
// stderr without run's "[rank] " prefix, so rank 0's table reads as before.
// Stopping, root causes and exit codes are tessera run's (docs/launcher.md,
// "Failure semantics"): a stop signal is forwarded to every rank, which get
// the kill grace (2 s) before SIGKILL, and the command exits 128 + signal.
int spawn_local(int n) {
  RunOptions o;
  o.nproc_per_node = n;
  o.prefix_output = false;
  o.command = own_argv();
  o.command[0] = own_executable();
  std::cout.flush();
  std::cerr.flush();
  return run_job(o);
}

// --compare mpi for ranks this process starts: MPI's side runs first, as
// its own job of tessera_mpi_peer (a plain MPI program next to this binary:
// no tessera threads polling beside MPI's, MPI_THREAD_SINGLE, buffers
// allocated once and pre-faulted) under mpirun at its best settings for n
// ranks; when the ranks outnumber the CPUs both yield modes
// (mpi_yield_when_idle 0 and 1) are measured and the faster kept per size.
// Then the tessera ranks run and rank 0 reads the figures
// (TESSERA_BENCH_MPI_FIGURES, TESSERA_BENCH_MPI_SETTINGS).
int compare_with_mpi(const BenchArgs& a, const bench::BenchConfig& cfg, int n) {
  const std::string peer = beside_own_executable("tessera_mpi_peer");
  if (access(peer.c_str(), X_OK) != 0)
    throw Error("bench: --compare mpi needs " + peer + " (build target tessera_mpi_peer)");
  const std::string dir = bench::make_temp_dir();
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{dir};
  const auto counts = bench::row_counts(cfg, n);
  const bool over = n > online_cpus();
  // Oversubscribed, OpenMPI's best depends on the size and the machine:
  // each yield mode, with its default binding (none) and with every rank
  // bound to a core (overload allowed), the fastest kept per size.
  struct Mode {
    std::string yield, bind;
  };
  std::vector<Mode> modes;
  if (over) {
    for (const char* bind : {"", "core:overload-allowed"})
      for (const char* y : {"0", "1"}) modes.push_back(Mode{y, bind});
  } else {
    modes.push_back(Mode{"", ""});
  }
  bench::CompareFigures best;
  for (size_t mi = 0; mi < modes.size(); ++mi) {
    const std::string& y = modes[mi].yield;
    const std::string& bind = modes[mi].bind;
    const std::string out = detail::concat(dir, "/mpi", mi, ".txt");
    std::vector<std::string> args = mpirun_prefix(n);
    if (!y.empty()) args.insert(args.end(), {"--mca", "mpi_yield_when_idle", y});
    if (!bind.empty()) args.insert(args.end(), {"--bind-to", bind});
    args.insert(args.end(), {peer, "--out", out, "--budget", "2", bench::bench_op_name(cfg.op), dtype_name(cfg.dtype),
                             bench::op_reduces(cfg.op) ? reduce_op_name(cfg.redop) : "none", std::to_string(cfg.root),
                             std::to_string(cfg.iters), std::to_string(cfg.warmup)});
    for (size_t c : counts) args.push_back(std::to_string(c));
    if (int code = run_child(args); code != 0)
      throw Error(detail::concat("bench: the MPI side of --compare mpi (", args[0],
                                 " ... tessera_mpi_peer) exited with ", code));
    auto figs = bench::read_compare_figures(out);
    for (auto& [count, f] : figs) {
      if (!bind.empty()) f.setting = detail::concat("bind=", bind, " ", f.setting);  // f.setting: "iters=N"
      if (!y.empty()) f.setting = detail::concat("yield_when_idle=", y, " ", f.setting);
      const auto c = count;  // clang 14 cannot capture a structured binding in a lambda
      auto it = std::find_if(best.begin(), best.end(), [&](const auto& b) { return b.first == c; });
      if (it == best.end())
        best.emplace_back(count, f);
      else if (f.time_us < it->second.time_us)
        it->second = f;
    }
  }
  std::string library;
  {
    std::ifstream in(dir + "/mpi0.txt");
    std::string line;
    if (std::getline(in, line) && line.rfind("# library ", 0) == 0) library = line.substr(10) + ", ";
  }
  const std::string figures = dir + "/mpi.txt";
  bench::write_compare_figures(figures, best);
  std::string settings = library + "tessera_mpi_peer run before tessera's ranks: mpirun";
  const std::vector<std::string> prefix = mpirun_prefix(n);
  for (size_t i = 1; i < prefix.size(); ++i) settings += " " + prefix[i];
  settings += over
                  ? " (ranks > " + std::to_string(online_cpus()) +
                        " CPUs), mpi_yield_when_idle 0 and 1 each measured with the default binding (none) and "
                        "with --bind-to core:overload-allowed, the fastest kept per size"
                  : " (ranks <= " + std::to_string(online_cpus()) + " CPUs: no --oversubscribe, MPI's default binding)";
  settings +=
      "; a size's warm-up capped at about 0.5 s and its timed calls at about 2 s (JSON compare_setting: "
      "iters, warmup)";
  setenv("TESSERA_BENCH_MPI_FIGURES", figures.c_str(), 1);
  setenv("TESSERA_BENCH_MPI_SETTINGS", settings.c_str(), 1);
  return n > 1 ? spawn_local(n) : bench::run_rank(a, cfg, nullptr);
}

// Ranks a launcher started (`tessera run`, mpirun, srun) join their job
// through the worker bootstrap (launcher/worker.h), the one way tessera's
// ranks find each other: the job's store, heartbeats, abort on a failed
// peer. The bench places its ranks itself (bench_rank.cc), so no CPU
// rotation.
std::optional<bench::JoinedJob> join_launched_job() {
  const World w = discover_world();
  const bool launched = !env_or("TESSERA_COORDINATOR").empty() || w.source == WorldSource::OpenMPI ||
                        (w.source == WorldSource::Slurm && w.size > 1);
  if (!launched) return std::nullopt;
  launcher::WorkerOptions wo;
  wo.create_communicator = false;
  wo.cpu_rotation = false;
  auto ctx = std::make_shared<launcher::WorkerContext>(launcher::init_worker(wo));
  return bench::JoinedJob{ctx->world, ctx->store, ctx->reach, [ctx] { launcher::shutdown(*ctx); }};
}

int bench_main(const BenchArgs& a) {
  const bench::BenchConfig cfg = make_config(a);  // validate before spawning anything
  if (!a.compare.empty() && a.compare != "mpi") throw InvalidArgument("--compare takes 'mpi', got '" + a.compare + "'");
  const TransportKind kind = parse_transport(a.transport);
  if (!a.topology.empty()) {  // fail early on bad names and files, and on more ranks than it has cores
    int nodes = 0;
    try {
      nodes = bench::topology_model(a.topology, std::max(a.nworkers, 1)).num_nodes();
    } catch (const FormatError& e) {
      throw InvalidArgument(e.what());  // a bad input file exits 2 like a bad flag (docs/errors.md)
    }
    const int ranks = a.nworkers > 0 ? a.nworkers : discover_world().size;
    if (ranks > nodes)
      throw InvalidArgument(detail::concat("--topology ", a.topology, " has ", nodes, " cores, fewer than the ", ranks,
                                           " ranks (each rank is placed on a core of it)"));
  }
  if (discover_world().rank == 0) {  // rank 0 writes them: fail before any rank starts
    if (!a.json.empty()) cli::check_output_file("--json", a.json);
    if (!a.plot.empty()) {
      cli::check_output_file("--plot", a.plot);
      // FILE.dat and FILE.gp are written beside the image (collectives/bench/baseline.h, plot_png).
      const std::string ext = std::filesystem::path(a.plot).extension().string();
      if (ext == ".dat" || ext == ".gp")
        throw InvalidArgument("--plot: '" + a.plot + "' would be overwritten by the plot's own " + ext +
                              " file (written beside the image); name the image FILE.png");
    }
  }
  const bool launched =
      !env_or("TESSERA_RANK").empty() || !env_or("TESSERA_COORDINATOR").empty() || mpi::under_mpirun();
  // Checked here as the ranks check them, so a bad value exits 2 once, before any rank starts.
  if (!a.algo.empty() && find_algorithm(a.algo) == nullptr) {
    std::string known;
    for (const std::string& n : algorithm_names()) known += (known.empty() ? "" : ", ") + n;
    throw InvalidArgument("--algo: unknown collective algorithm '" + a.algo + "' (known: " + known + ")");
  }
  if (!launched && (cfg.root < 0 || cfg.root >= std::max(a.nworkers, 1)))
    throw InvalidArgument(detail::concat("--root ", cfg.root, " is not a rank of ", std::max(a.nworkers, 1)));
  if (!launched) check_fits(a, cfg, std::max(a.nworkers, 1));
  try {
    if (!launched && kind == TransportKind::Mpi && a.nworkers > 1) return spawn_with_mpirun(a.nworkers);
    if (!launched && a.compare == "mpi") return compare_with_mpi(a, cfg, std::max(a.nworkers, 1));
  } catch (const Stopped& s) {
    return 128 + s.sig;
  }
  if (!launched && a.nworkers > 1) return spawn_local(a.nworkers);
  return bench::run_rank(a, cfg, join_launched_job);
}

}  // namespace

void add_bench_command(CLI::App& root, tessera::launcher::cli::Action& action) {
  auto a = std::make_shared<BenchArgs>();
  auto* cmd = root.add_subcommand("bench", "Measure collective bandwidth (nccl-tests / nccom-test style)");
  cmd->add_option("op", a->op,
                  "all_reduce|allr, all_gather|allg, reduce_scatter|redsct, all_to_all|alltoall, broadcast, reduce, "
                  "sendrecv")
      ->required();
  cmd->add_option("-r,--nworkers", a->nworkers, "Ranks to spawn on this host")->check(cli::int_range(1, 1024));
  cmd->add_flag("--oversubscribe", a->oversubscribe,
                "Allow -r beyond " + std::to_string(kRanksPerCpu) + " ranks per CPU");
  cmd->add_option(
      "-b,--minbytes", a->minbytes,
      "Smallest size, e.g. 8, 64K, 1M (default 32M; with --topology and no -b, -e, -f, -i: also 2K, 8K, 32K, "
      "decode's all-reduces)");
  cmd->add_option("-e,--maxbytes", a->maxbytes, "Largest size (default 32M)");
  // NaN is this flag's "not given": a given nan (or inf) is refused here.
  auto* f = cmd->add_option("-f,--stepfactor", a->stepfactor, "Multiply the size by this factor (default 2)")
                ->check(cli::number_range(0, 1e6));
  auto* i = cmd->add_option("-i,--stepbytes", a->stepbytes, "Add this many bytes per step instead");
  f->excludes(i);
  cmd->add_option("-n,--iters", a->iters, "Timed iterations per size (default 20)")->check(cli::int_range(1, 1000000));
  cmd->add_option("-w,--warmup_iters", a->warmup, "Warm-up iterations (default 5)")->check(cli::int_range(0, 1000000));
  cmd->add_option("-d,--datatype", a->datatype, "f32, bf16, f16, i32, i64 (also float, half, ...)");
  cmd->add_option("-o,--op", a->redop, "Reduction: sum, prod, min, max, avg");
  cmd->add_option("-c,--check", a->check, "Check every result element (0 or 1; -c alone is 1; default 1)")
      ->expected(0, 1)
      ->default_str("1")
      ->check(cli::int_range(0, 1));
  cmd->add_option("--root", a->root, "Root rank of broadcast and reduce (default 0)")->check(cli::any_int(a->root));
  cmd->add_option("--transport", a->transport,
                  "auto (shm inside a host, tcp between hosts; the default), shm, tcp or mpi")
      ->check(CLI::IsMember({"auto", "shm", "tcp", "mpi"}));
  cmd->add_option("--algo", a->algo, "Force an algorithm (ring, rhd, torus, ...)");
  cmd->add_option("--topology", a->topology, "Topology preset or JSON file for the modeled busbw");
  cmd->add_option("--json", a->json, "Also write the results as JSON to FILE")->check(cli::not_a_flag());
  cmd->add_option("--plot", a->plot, "Draw busbw vs size to FILE.png (gnuplot)")->check(cli::not_a_flag());
  cmd->add_flag("--baseline", a->baseline, "Also measure single-core memcpy and raw TCP loopback bandwidth");
  cmd->add_option("--compare", a->compare, "Run the same sizes through MPI's own collectives: mpi")
      ->check(CLI::IsMember({"mpi"}));
  cmd->add_option("--timeout", a->timeout_s, "Seconds any wait may take (default 120)")
      ->check(cli::number_range(1e-3, 1e6));
  cmd->footer(
      "Temporary files: a single rank's store and --compare mpi's figures go to a directory "
      "$TMPDIR/tessera-bench-<pid>-XXXXXX (TMPDIR unset: /tmp), removed when the run ends, by the next one that makes "
      "such a directory when the process was killed. -r N makes none: its ranks meet at the coordinator of a one-node "
      "tessera run job.");
  cmd->callback([&action, a, cmd] {
    a->sweep_given = cmd->count("-b") + cmd->count("-e") + cmd->count("-f") + cmd->count("-i") > 0;
    action = [a] { return bench_main(*a); };
  });
}

}  // namespace tessera::launcher
