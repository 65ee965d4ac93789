// SimClock: the modeled time an emulated core would spend on the work
// charged to it. Compute uses a roofline: max(FLOPs / peak FLOP/s,
// bytes / HBM bandwidth). Communication time comes from the collectives'
// link model (runtime/netmodel.h). Wall time is measured beside it so a run
// can report both.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "runtime/dtype.h"

namespace tessera {

struct DeviceSpec;

struct ClockTotals {
  double compute_s = 0;  // roofline time of kernels
  double comm_s = 0;     // modeled interconnect time
  double flops = 0;      // FLOPs charged
  double bytes = 0;      // HBM bytes charged
  double total_s() const { return compute_s + comm_s; }
};

class SimClock {
 public:
  explicit SimClock(const DeviceSpec* spec) : spec_(spec) {}

  // Charges one kernel; returns its modeled seconds.
  double charge_compute(double flops, double bytes, DType dtype);
  // Charges modeled communication time (already computed by the link model).
  void charge_comm(double seconds);

  ClockTotals totals() const;
  void reset();

 private:
  const DeviceSpec* spec_;
  // Stored as doubles in atomics: charged from compute and progress threads.
  std::atomic<double> compute_s_{0}, comm_s_{0}, flops_{0}, bytes_{0};
};

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
