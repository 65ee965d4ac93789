// Shared-memory device memory: an emulated core's tensors live in a memfd
// arena that the other ranks on the host can map, so the collectives read
// peers' tensors in place (the way NeuronLink DMA reads another chip's HBM)
// instead of staging them through a copy.
//
// ShmSegment is the building block: an anonymous shared mapping (memfd, never
// named in /dev/shm, so nothing is left behind when a process dies) that a
// process on the same host opens through /proc/<pid>/fd/<fd> while the owner
// is alive.
//
// Thread-safety: ShmArena allocate/free and find_shm_location are
// thread-safe. Lifetime: an arena's memory stays valid until the arena (the
// DeviceMemory) is destroyed; peers that mapped it keep their mapping (and
// the pages) until they unmap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "runtime/device.h"

namespace tessera {

class ShmSegment {
 public:
  // Creates a segment of `bytes` (rounded up to pages). prefault: touch every
  // page now, so the data path never takes a first-touch fault.
  static std::unique_ptr<ShmSegment> create(size_t bytes, const std::string& label, bool prefault,
                                            bool noreserve = false);
  // Maps the segment that process `pid` holds open as descriptor `fd`.
  // Throws Error naming pid and fd when it cannot (owner gone, no permission).
  static std::unique_ptr<ShmSegment> open_peer(int pid, int fd, size_t bytes);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  int fd() const { return fd_; }

 private:
  ShmSegment(void* data, size_t size, int fd) : data_(data), size_(size), fd_(fd) {}
  void* data_;
  size_t size_;
  int fd_;
};

// Where a pointer lives in a shared arena of this process: enough for a peer
// to map the arena (open_peer(pid, fd, arena_bytes)) and find the bytes.
struct ShmLocation {
  int32_t pid = 0;
  int32_t fd = -1;
  uint64_t arena_id = 0;  // unique per arena, so a recycled fd is not mistaken
  uint64_t arena_bytes = 0;
  uint64_t offset = 0;
};

// The arena as a DeviceMemory backend. Blocks are carved from one segment
// reserved up front (MAP_NORESERVE: pages are backed when first touched) and
// freed blocks are cached by rounded size and reused, so steady-state
// training touches no fresh page. Returns nullptr when the arena is full.
std::unique_ptr<DeviceMemory> make_shm_memory(size_t capacity_bytes);

// Finds the arena of this process holding [p, p + bytes); nullopt if none.
std::optional<ShmLocation> find_shm_location(const void* p, size_t bytes);

}  // namespace tessera
