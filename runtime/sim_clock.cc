#include "runtime/sim_clock.h"

#include <algorithm>

#include "runtime/device.h"

namespace tessera {

namespace {
void atomic_add(std::atomic<double>& a, double v) {
  double cur = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(cur, cur + v, std::memory_order_relaxed)) {
  }
}
}  // namespace

double SimClock::charge_compute(double flops, double bytes, DType dtype) {
  double t_flops = (spec_ && spec_->peak_flops(dtype) > 0) ? flops / spec_->peak_flops(dtype) : 0;
  double t_bytes = (spec_ && spec_->hbm_bandwidth > 0) ? bytes / spec_->hbm_bandwidth : 0;
  double t = std::max(t_flops, t_bytes);
  atomic_add(compute_s_, t);
  atomic_add(flops_, flops);
  atomic_add(bytes_, bytes);
  return t;
}

void SimClock::charge_comm(double seconds) { atomic_add(comm_s_, seconds); }

ClockTotals SimClock::totals() const {
  ClockTotals t;
  t.compute_s = compute_s_.load();
  t.comm_s = comm_s_.load();
  t.flops = flops_.load();
  t.bytes = bytes_.load();
  return t;
}

void SimClock::reset() {
  compute_s_ = 0;
  comm_s_ = 0;
  flops_ = 0;
  bytes_ = 0;
}

}  // namespace tessera
