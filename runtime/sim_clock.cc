#include "runtime/sim_clock.h"

#include "runtime/device.h"
#include "runtime/kernel_cost.h"

namespace tessera {

namespace {
void atomic_add(std::atomic<double>& a, double v) {
  double cur = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(cur, cur + v, std::memory_order_relaxed)) {
  }
}
}  // namespace

double SimClock::charge_compute(double flops, double bytes, DType dtype) {
  return charge_kernel(cost::Kernel{flops, bytes}, dtype);
}

double SimClock::charge_kernel(const cost::Kernel& k, DType dtype) {
  const double t = spec_ ? cost::kernel_seconds(*spec_, k, dtype) : 0;
  atomic_add(compute_s_, t);
  atomic_add(flops_, k.flops);
  atomic_add(bytes_, k.bytes);
  atomic_add(kernels_, 1);
  return t;
}

void SimClock::charge_comm(double seconds) { atomic_add(comm_s_, seconds); }

void SimClock::charge_idle(double seconds) { atomic_add(idle_s_, seconds); }

ClockTotals SimClock::totals() const {
  ClockTotals t;
  t.compute_s = compute_s_.load();
  t.comm_s = comm_s_.load();
  t.idle_s = idle_s_.load();
  t.kernels = kernels_.load();
  t.flops = flops_.load();
  t.bytes = bytes_.load();
  return t;
}

void SimClock::reset() {
  compute_s_ = 0;
  comm_s_ = 0;
  idle_s_ = 0;
  kernels_ = 0;
  flops_ = 0;
  bytes_ = 0;
}

}  // namespace tessera
