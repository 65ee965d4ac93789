// The waiting primitives of the shared-memory transport, shared with
// tessera_handoff_bench (collectives/bench/handoff.cc), which measures them.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
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

}  // namespace tessera::collectives::shm
