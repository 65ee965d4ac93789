// SimClock: the modeled time an emulated core would spend on the work
// charged to it. A kernel costs runtime/kernel_cost.h's kernel_seconds()
// (launch + roofline at the sustained FLOP rate), the same figure the
// planner sums. Communication time comes from the collectives' link model
// (runtime/netmodel.h, collectives/coll_cost.h). Idle time is what a
// pipeline stage waits for its neighbours (charged by the pipeline
// executor). Wall time is measured beside it so a run can report both.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "runtime/dtype.h"
#include "runtime/kernel_cost.h"

namespace tessera {

struct DeviceSpec;

struct ClockTotals {
  double compute_s = 0;  // roofline time of kernels
  double comm_s = 0;     // modeled interconnect time
  double idle_s = 0;     // waiting for other ranks (pipeline bubbles)
  double flops = 0;      // FLOPs charged
  double bytes = 0;      // HBM bytes charged
  double kernels = 0;    // kernels charged
  double total_s() const { return compute_s + comm_s + idle_s; }
};

class SimClock {
 public:
  explicit SimClock(const DeviceSpec* spec) : spec_(spec) {}

  // Charges one kernel; returns its modeled seconds.
  double charge_compute(double flops, double bytes, DType dtype);
  // The same with the kernel's shape (a GEMM's efficiency, runtime/kernel_cost.h).
  double charge_kernel(const cost::Kernel& k, DType dtype);
  // Charges modeled communication time (already computed by the link model).
  void charge_comm(double seconds);
  // Charges time spent waiting for another rank.
  void charge_idle(double seconds);

  ClockTotals totals() const;
  void reset();

 private:
  const DeviceSpec* spec_;
  // Stored as doubles in atomics: charged from compute and progress threads.
  std::atomic<double> compute_s_{0}, comm_s_{0}, idle_s_{0}, flops_{0}, bytes_{0}, kernels_{0};
};

// Seconds since the Unix epoch (trace timestamps on the wall clock).
inline double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Wall-clock stopwatch.
class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  void reset() { start_ = std::chrono::steady_clock::now(); }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace tessera
