// tessera_handoff_bench: how a waiting rank should hand over its core.
//
// N forked processes share one page and run R rounds of the pattern of
// shm's publish round (collectives/shm/shm_transport.cc), the one every
// small one-shot collective is made of: each rank adds its arrival to one
// counter; the rank whose arrival completes the round wakes the sleepers
// with one FUTEX_WAKE; every rank waits until the round is complete. Only
// the way of waiting differs:
//
//   futex        a few polls, then FUTEX_WAIT (shm's wait when ranks > CPUs)
//   yield        sched_yield() until done (OpenMPI's mpi_yield_when_idle=1)
//   spin         pause until done (OpenMPI's default; hopeless when ranks > CPUs)
//   spinU        pause for U us, then FUTEX_WAIT
//   yieldU       sched_yield() for U us, then FUTEX_WAIT
//   adaptiveU    as yieldU, but slow yields (the core went to some other task
//                for a slice) make this rank sleep at once in its waits for a
//                backoff period (shm's wait: collectives/shm/yield_policy.h)
//
//   tessera_handoff_bench [-n RANKS] [-i ROUNDS] [-k REPEATS] MODE...
//
// Prints, per mode, the median over REPEATS of the time per round (us), and
// the voluntary and involuntary context switches per round and rank.
// docs/threads.md has the figures and the choice they made.
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/shm/futex.h"
#include "collectives/shm/yield_policy.h"

namespace {

using tessera::collectives::shm::cpu_relax;
using tessera::collectives::shm::futex;
using Clock = std::chrono::steady_clock;

struct alignas(64) Shared {
  std::atomic<uint64_t> arrivals;
  alignas(64) std::atomic<uint32_t> word;
  std::atomic<uint32_t> sleepers;
  alignas(64) std::atomic<uint32_t> start;
  alignas(64) std::atomic<uint64_t> nvcsw, nivcsw;
};

enum class Kind { Futex, Yield, Spin, SpinThenFutex, YieldThenFutex, Adaptive };
struct Mode {
  std::string name;
  Kind kind;
  long us;  // window of SpinThenFutex / YieldThenFutex
};

void ring(Shared* s) {
  if (s->sleepers.load(std::memory_order_seq_cst)) {
    s->word.fetch_add(1, std::memory_order_seq_cst);
    futex(&s->word, FUTEX_WAKE, INT_MAX, nullptr);
  }
}

void sleep_until(Shared* s, uint64_t target) {
  for (;;) {
    const uint32_t w = s->word.load(std::memory_order_seq_cst);
    s->sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (s->arrivals.load(std::memory_order_seq_cst) >= target) {
      s->sleepers.fetch_sub(1, std::memory_order_relaxed);
      return;
    }
    struct timespec ts {
      0, 100000000
    };
    futex(&s->word, FUTEX_WAIT, w, &ts);
    s->sleepers.fetch_sub(1, std::memory_order_relaxed);
  }
}

void wait_round(Shared* s, uint64_t target, const Mode& m) {
  auto done = [&] { return s->arrivals.load(std::memory_order_acquire) >= target; };
  switch (m.kind) {
    case Kind::Spin:
      while (!done()) cpu_relax();
      return;
    case Kind::Yield:
      while (!done()) ::sched_yield();
      return;
    case Kind::Futex:
      for (int i = 0; i < 4; ++i) {
        if (done()) return;
        cpu_relax();
      }
      break;
    case Kind::SpinThenFutex: {
      const auto end = Clock::now() + std::chrono::microseconds(m.us);
      while (Clock::now() < end)
        for (int k = 0; k < 16; ++k) {
          if (done()) return;
          cpu_relax();
        }
      break;
    }
    case Kind::Adaptive: {
      static tessera::collectives::shm::YieldPolicy policy;
      if (policy.yield_until(done, Clock::now(), std::chrono::microseconds(m.us))) return;
      break;
    }
    case Kind::YieldThenFutex: {
      const auto end = Clock::now() + std::chrono::microseconds(m.us);
      while (Clock::now() < end) {
        if (done()) return;
        ::sched_yield();
      }
      break;
    }
  }
  sleep_until(s, target);
}

// Seconds per round of `rounds` rounds of n ranks waiting the way of `m`.
double run(const Mode& m, int n, long rounds, double* vcs, double* ivcs) {
  void* mem = ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  auto* s = new (mem) Shared{};
  std::vector<pid_t> kids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("fork");
      std::exit(1);
    }
    if (pid == 0) {
      while (s->start.load(std::memory_order_acquire) == 0) ::sched_yield();
      struct rusage a {};
      struct rusage b {};
      ::getrusage(RUSAGE_SELF, &a);
      for (long i = 1; i <= rounds; ++i) {
        const uint64_t target = static_cast<uint64_t>(i) * static_cast<uint64_t>(n);
        if (s->arrivals.fetch_add(1, std::memory_order_seq_cst) + 1 == target) ring(s);
        wait_round(s, target, m);
      }
      ::getrusage(RUSAGE_SELF, &b);
      s->nvcsw.fetch_add(static_cast<uint64_t>(b.ru_nvcsw - a.ru_nvcsw));
      s->nivcsw.fetch_add(static_cast<uint64_t>(b.ru_nivcsw - a.ru_nivcsw));
      ::_exit(0);
    }
    kids.push_back(pid);
  }
  const auto t0 = Clock::now();
  s->start.store(1, std::memory_order_release);
  for (pid_t k : kids) ::waitpid(k, nullptr, 0);
  const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  const double per = static_cast<double>(rounds) * n;
  *vcs = static_cast<double>(s->nvcsw.load()) / per;
  *ivcs = static_cast<double>(s->nivcsw.load()) / per;
  ::munmap(mem, sizeof(Shared));
  return sec / static_cast<double>(rounds);
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "tessera_handoff_bench: %s\nusage: tessera_handoff_bench [-n RANKS] [-i ROUNDS] [-k REPEATS] "
               "MODE...\n  MODE: futex | yield | spin | spinU | yieldU | adaptiveU (U: microseconds, then futex)\n",
               why);
  std::exit(2);
}

long parse_long(const char* s, long lo) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (!end || *end || end == s || v < lo) usage((std::string("bad number '") + s + "'").c_str());
  return v;
}

Mode parse_mode(const std::string& s) {
  if (s == "futex") return {s, Kind::Futex, 0};
  if (s == "yield") return {s, Kind::Yield, 0};
  if (s == "spin") return {s, Kind::Spin, 0};
  for (const auto& [prefix, kind] : {std::pair<std::string, Kind>{"spin", Kind::SpinThenFutex},
                                     std::pair<std::string, Kind>{"yield", Kind::YieldThenFutex},
                                     std::pair<std::string, Kind>{"adaptive", Kind::Adaptive}})
    if (s.rfind(prefix, 0) == 0 && s.size() > prefix.size()) return {s, kind, parse_long(s.c_str() + prefix.size(), 0)};
  usage(("unknown mode '" + s + "'").c_str());
}

}  // namespace

int main(int argc, char** argv) {
  int n = 4;
  long rounds = 20000, reps = 3;
  std::vector<Mode> modes;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "-n" || a == "-i" || a == "-k") && i + 1 < argc) {
      const long v = parse_long(argv[++i], 1);
      if (a == "-n") n = static_cast<int>(std::min(v, 256L));
      if (a == "-i") rounds = v;
      if (a == "-k") reps = v;
    } else if (!a.empty() && a[0] == '-') {
      usage(("unknown flag '" + a + "'").c_str());
    } else {
      modes.push_back(parse_mode(a));
    }
  }
  if (modes.empty()) usage("no MODE");
  std::printf(
      "# %d ranks, %ld CPUs online, %ld rounds, median of %ld\n# mode us/round vcsw/round/rank ivcsw/round/rank\n", n,
      ::sysconf(_SC_NPROCESSORS_ONLN), rounds, reps);
  // Interleaved: repeat r runs every mode once, so load changes hit all alike.
  std::vector<std::vector<double>> t(modes.size()), v(modes.size()), iv(modes.size());
  for (long r = 0; r < reps; ++r)
    for (size_t m = 0; m < modes.size(); ++m) {
      double a = 0, b = 0;
      t[m].push_back(run(modes[m], n, rounds, &a, &b) * 1e6);
      v[m].push_back(a);
      iv[m].push_back(b);
    }
  auto median = [](std::vector<double> x) {
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
  };
  for (size_t m = 0; m < modes.size(); ++m)
    std::printf("%-10s %8.2f %6.2f %6.2f\n", modes[m].name.c_str(), median(t[m]), median(v[m]), median(iv[m]));
  return 0;
}
