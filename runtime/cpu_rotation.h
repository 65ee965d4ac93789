// Host-CPU rotation: emulated cores that share a host take turns on its CPUs.
//
// Why: emulated cores are identical, a host's CPUs need not be. On a shared
// VM one vCPU can run up to 40% slower than another for seconds at a time
// (other tenants of the host). Synchronous parallelism runs
// at the pace of its slowest rank, so with one rank per vCPU every step waits
// for whichever vCPU is slow at the moment; independent processes would not.
// Rotating the ranks over the CPUs gives each one the CPUs' average speed.
// (Measured with examples/gpt/bench_train.sh: DP=2 on two vCPUs waited a
// median 3.4% and 8.9% of each step in two runs, up to 16%, without
// rotation; 0.2% with it.)
//
// How: time is cut into periods of `period` on the host's monotonic clock,
// which every process of the host shares. In period k the local rank r runs
// on cpus[(r + k) mod cpus.size()]: distinct CPUs for distinct local ranks in
// every period, and each CPU for an equal share of time. A background thread
// sets the rotated thread's affinity at each period boundary (one
// pthread_setaffinity_np call; the thread sleeps in between). Only the thread
// that created the CpuRotation moves, normally the rank's main (compute)
// thread; other threads keep the process's mask.
//
// When: plan_cpu_rotation() decides from TESSERA_CPU_ROTATION
// (auto | off | a period in ms). `auto` (the default, 50 ms) rotates only when
// it cannot hurt placement: a multi-rank job with 2 <= local ranks <= CPUs in
// the process's affinity mask. More local ranks than CPUs are left to the
// kernel's scheduler (pinning would strand runnable ranks on a busy CPU while
// another idles), and a process bound to fewer CPUs (mpirun binds to a core
// at -np 2; pass --bind-to none to rotate) keeps the binding it was given.
#pragma once

#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/world.h"

namespace tessera {

struct CpuRotationPlan {
  bool enabled = false;
  std::chrono::milliseconds period{50};
  std::vector<int> cpus;  // the CPUs to rotate over, ascending
  std::string reason;     // why it is on or off, for the log
};

// `setting` is TESSERA_CPU_ROTATION's value (empty = auto); `allowed` the
// CPUs of the process's affinity mask. Throws InvalidArgument naming the
// variable for a value that is not auto, off or a positive number of ms.
CpuRotationPlan plan_cpu_rotation(const World& world, const std::vector<int>& allowed, const std::string& setting);

// The CPUs of the calling thread's affinity mask, ascending.
std::vector<int> current_cpu_mask();

// The CPU index (into the plan's cpus) of local rank `local_rank` in period `period_index`.
inline int rotation_slot(int local_rank, int64_t period_index, int num_cpus) {
  return static_cast<int>((local_rank + period_index) % num_cpus);
}

class CpuRotation {
 public:
  // Starts rotating the calling thread over `cpus` (non-empty).
  CpuRotation(int local_rank, std::vector<int> cpus, std::chrono::milliseconds period);
  // Stops the rotation and restores the rotated thread's original mask.
  // Call it from the rotated thread, or while that thread is still alive.
  ~CpuRotation();
  CpuRotation(const CpuRotation&) = delete;
  CpuRotation& operator=(const CpuRotation&) = delete;

  // Period boundaries at which the affinity was changed (for tests).
  int64_t moves() const;

 private:
  void run();

  const int local_rank_;
  const std::vector<int> cpus_;
  const std::chrono::milliseconds period_;
  const pthread_t target_;
  std::vector<int> original_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  int64_t moves_ = 0;
  std::thread thread_;
};

// Reads TESSERA_CPU_ROTATION and the process's mask; starts rotating the
// calling thread when the plan says so (logged at debug level either way).
std::unique_ptr<CpuRotation> maybe_start_cpu_rotation(const World& world);

}  // namespace tessera
