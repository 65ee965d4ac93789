// The waiting primitives of the shared-memory transport, shared with
// tessera_handoff_bench (collectives/bench/handoff.cc), which measures them.
#pragma once

#include <linux/futex.h>
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace tessera::collectives::shm {

// futex(2) on an atomic word shared between processes (no FUTEX_PRIVATE_FLAG).
inline long futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const struct timespec* ts) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, ts, nullptr, 0);
}

// One spin-wait hint (a pause takes ~70 ns on this VM).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Asymmetric fences for the doorbells (as in folly's asymmetric barriers, on
// membarrier(2) across processes): a rank that changes what a peer may be
// asleep waiting for stores the change with a plain release store and then
// loads the peer's sleeper count (the light side: no locked instruction, so
// the store's cache miss stays in the store buffer instead of stalling the
// sender); a rank about to sleep counts itself a sleeper and then calls
// heavy_barrier(), which runs a full barrier on every CPU running a process
// that registered, before it re-checks its condition. Either the sleeper
// sees the change or the changer sees the sleeper.
//
// True once this process is registered (MEMBARRIER_CMD_GLOBAL_EXPEDITED,
// Linux 4.16+). False when the kernel lacks it or TESSERA_SHM_MEMBARRIER=0:
// then changes are stored seq_cst and heavy_barrier() is not needed.
inline bool asymmetric_fences() {
  static const bool on = [] {
    const char* env = std::getenv("TESSERA_SHM_MEMBARRIER");
    if (env && std::strcmp(env, "0") == 0) return false;
    const long cmds = ::syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    if (cmds < 0 || (cmds & MEMBARRIER_CMD_GLOBAL_EXPEDITED) == 0) return false;
    return ::syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0) == 0;
  }();
  return on;
}

// The heavy side (only when asymmetric_fences()). A peer that has not
// registered yet has not created its transport, so it has stored nothing a
// sleeper here waits for.
inline void heavy_barrier() { ::syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0); }

}  // namespace tessera::collectives::shm
