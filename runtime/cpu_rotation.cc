#include "runtime/cpu_rotation.h"

#include <sched.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "runtime/error.h"

namespace tessera {

namespace {

// 0 or an error number.
int set_mask(pthread_t t, const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  return pthread_setaffinity_np(t, sizeof set, &set);
}

int64_t period_index(std::chrono::steady_clock::time_point t, std::chrono::milliseconds period) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count() / period.count();
}

}  // namespace

std::vector<int> current_cpu_mask() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (pthread_getaffinity_np(pthread_self(), sizeof set, &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

CpuRotationPlan plan_cpu_rotation(const World& world, const std::vector<int>& allowed, const std::string& setting) {
  CpuRotationPlan plan;
  plan.cpus = allowed;
  if (setting == "off") {
    plan.reason = "TESSERA_CPU_ROTATION=off";
    return plan;
  }
  if (!setting.empty() && setting != "auto") {
    char* end = nullptr;
    errno = 0;
    long long ms = std::strtoll(setting.c_str(), &end, 10);
    TESSERA_ARG_CHECK(errno == 0 && end && *end == '\0' && ms > 0 && ms <= 60000, "TESSERA_CPU_ROTATION='", setting,
                      "' is not auto, off or a period in milliseconds (1 to 60000)");
    plan.period = std::chrono::milliseconds(ms);
  }
  const int n = static_cast<int>(allowed.size());
  if (world.size <= 1) {
    plan.reason = "a single-rank job";
  } else if (world.local_size < 2) {
    plan.reason = "one rank on this host";
  } else if (world.local_size > n) {
    plan.reason = detail::concat(world.local_size, " local ranks, ", n,
                                 " CPU(s) in this process's affinity mask: placement is left to the launcher and "
                                 "the kernel (under mpirun, --bind-to none lets tessera rotate)");
  } else {
    plan.enabled = true;
    plan.reason =
        detail::concat(world.local_size, " local ranks over ", n, " CPUs, every ", plan.period.count(), " ms");
  }
  return plan;
}

CpuRotation::CpuRotation(int local_rank, std::vector<int> cpus, std::chrono::milliseconds period)
    : local_rank_(local_rank), cpus_(std::move(cpus)), period_(period), target_(pthread_self()) {
  TESSERA_ARG_CHECK(!cpus_.empty(), "CpuRotation needs at least one CPU");
  TESSERA_ARG_CHECK(local_rank_ >= 0, "CpuRotation: local rank ", local_rank_, " < 0");
  TESSERA_ARG_CHECK(period_.count() > 0, "CpuRotation: period must be > 0 ms");
  original_ = current_cpu_mask();
  thread_ = std::thread([this] { run(); });
}

CpuRotation::~CpuRotation() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (!original_.empty()) (void)set_mask(target_, original_);
}

int64_t CpuRotation::moves() const {
  std::lock_guard<std::mutex> l(mu_);
  return moves_;
}

void CpuRotation::run() {
  const int n = static_cast<int>(cpus_.size());
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    const auto now = std::chrono::steady_clock::now();
    const int64_t k = period_index(now, period_);
    if (int err = set_mask(target_, {cpus_[rotation_slot(local_rank_, k, n)]}); err != 0) {
      // The CPU went offline or left our cpuset: stop moving the thread.
      spdlog::warn("CPU rotation stopped: cannot set the affinity ({})", std::strerror(err));
      return;
    }
    ++moves_;
    const auto next = std::chrono::steady_clock::time_point(std::chrono::milliseconds((k + 1) * period_.count()));
    cv_.wait_until(l, next, [this] { return stop_; });
  }
}

std::unique_ptr<CpuRotation> maybe_start_cpu_rotation(const World& world) {
  const char* v = std::getenv("TESSERA_CPU_ROTATION");
  CpuRotationPlan plan = plan_cpu_rotation(world, current_cpu_mask(), v ? v : "");
  spdlog::debug("CPU rotation {}: {}", plan.enabled ? "on" : "off", plan.reason);
  if (!plan.enabled) return nullptr;
  return std::make_unique<CpuRotation>(world.local_rank, plan.cpus, plan.period);
}

}  // namespace tessera
