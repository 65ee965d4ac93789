#include "runtime/shm_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <vector>

#include "runtime/error.h"

namespace tessera {

namespace {
size_t page_round(size_t b) {
  const size_t pg = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return (std::max<size_t>(b, 1) + pg - 1) / pg * pg;
}
}  // namespace

std::unique_ptr<ShmSegment> ShmSegment::create(size_t bytes, const std::string& label, bool prefault, bool noreserve) {
  const size_t size = page_round(bytes);
  int fd = ::memfd_create(("tessera-" + label).c_str(), MFD_CLOEXEC);
  if (fd < 0) throw Error("memfd_create(" + label + "): " + std::strerror(errno));
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    const int e = errno;
    ::close(fd);
    throw Error("ftruncate shared segment " + label + " to " + std::to_string(size) + " bytes: " + std::strerror(e));
  }
  int flags = MAP_SHARED | (noreserve ? MAP_NORESERVE : 0);
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, flags, fd, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    ::close(fd);
    throw Error("mmap shared segment " + label + " (" + std::to_string(size) + " bytes): " + std::strerror(e));
  }
  if (prefault) {
    // Writing (not just reading) allocates the shmem pages now.
    const size_t pg = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    auto* c = static_cast<volatile char*>(p);
    for (size_t off = 0; off < size; off += pg) c[off] = 0;
  }
  return std::unique_ptr<ShmSegment>(new ShmSegment(p, size, fd));
}

std::unique_ptr<ShmSegment> ShmSegment::open_peer(int pid, int fd, size_t bytes) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  int my = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (my < 0) throw Error("cannot open peer shared segment " + path + ": " + std::strerror(errno));
  const size_t size = page_round(bytes);
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, my, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    ::close(my);
    throw Error("mmap peer shared segment " + path + ": " + std::strerror(e));
  }
  return std::unique_ptr<ShmSegment>(new ShmSegment(p, size, my));
}

ShmSegment::~ShmSegment() {
  ::munmap(data_, size_);
  ::close(fd_);
}

namespace {

struct ArenaEntry {
  uintptr_t base;
  size_t bytes;
  ShmLocation loc;
};

std::shared_mutex& registry_mu() {
  static std::shared_mutex mu;
  return mu;
}
std::vector<ArenaEntry>& registry() {
  static std::vector<ArenaEntry> r;
  return r;
}

uint64_t random_id() {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ (counter.fetch_add(1) << 1) ^ static_cast<uint64_t>(::getpid());
}

class ShmArenaMemory : public DeviceMemory {
 public:
  explicit ShmArenaMemory(size_t capacity) : seg_(ShmSegment::create(capacity, "arena", false, true)) {
    loc_.pid = static_cast<int32_t>(::getpid());
    loc_.fd = seg_->fd();
    loc_.arena_id = random_id();
    loc_.arena_bytes = seg_->size();
    std::unique_lock<std::shared_mutex> lk(registry_mu());
    registry().push_back({reinterpret_cast<uintptr_t>(seg_->data()), seg_->size(), loc_});
  }
  ~ShmArenaMemory() override {
    std::unique_lock<std::shared_mutex> lk(registry_mu());
    auto& r = registry();
    for (size_t i = 0; i < r.size(); ++i) {
      if (r[i].loc.arena_id == loc_.arena_id) {
        r.erase(r.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
    }
  }

  void* allocate(size_t bytes) override {
    const size_t r = round(bytes);
    std::lock_guard<std::mutex> lk(mu_);
    auto it = cache_.find(r);
    if (it != cache_.end() && !it->second.empty()) {
      size_t off = it->second.back();
      it->second.pop_back();
      return static_cast<char*>(seg_->data()) + off;
    }
    if (r > seg_->size() - top_) return nullptr;
    size_t off = top_;
    top_ += r;
    return static_cast<char*>(seg_->data()) + off;
  }

  void free(void* p, size_t bytes) override {
    if (!p) return;
    const size_t off = static_cast<size_t>(static_cast<char*>(p) - static_cast<char*>(seg_->data()));
    std::lock_guard<std::mutex> lk(mu_);
    cache_[round(bytes)].push_back(off);
  }

 private:
  static size_t round(size_t b) { return round_block_size(b); }

  std::unique_ptr<ShmSegment> seg_;
  ShmLocation loc_;
  std::mutex mu_;
  size_t top_ = 0;
  std::map<size_t, std::vector<size_t>> cache_;
};

}  // namespace

std::unique_ptr<DeviceMemory> make_shm_memory(size_t capacity_bytes) {
  TESSERA_ARG_CHECK(capacity_bytes > 0, "shared-memory arena capacity must be positive");
  return std::make_unique<ShmArenaMemory>(capacity_bytes);
}

std::optional<ShmLocation> find_shm_location(const void* p, size_t bytes) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::shared_lock<std::shared_mutex> lk(registry_mu());
  for (const auto& e : registry()) {
    if (a >= e.base && a - e.base <= e.bytes && bytes <= e.bytes - (a - e.base)) {
      ShmLocation l = e.loc;
      l.offset = a - e.base;
      return l;
    }
  }
  return std::nullopt;
}

}  // namespace tessera
