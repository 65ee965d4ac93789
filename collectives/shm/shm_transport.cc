// Shared-memory transport.
//
// Each rank owns one segment per communicator (a memfd, so nothing can be
// left in /dev/shm), created, pre-faulted and published once; the peers map
// it through /proc/<pid>/fd. The endpoint published in the store is
// "PID FD BYTES TOKEN FENCES HOSTKEY NAME" (FENCES: 1 if the rank has
// asymmetric fences, futex.h): a peer whose HOSTKEY (collectives/host.h)
// differs is refused without touching /proc, and a mapped segment whose
// header does not hold TOKEN (128 random bits) is not the peer's. A segment
// holds:
//   - a control block: the segment's token, the doorbell (futex word the
//     owner sleeps on in point-to-point waits), the owner's failed flag and
//     reason, the publish rounds of SharedMemoryPeers; group rank 0's also
//     holds the bell of publish waits;
//   - one inbound channel per peer: a single-producer single-consumer ring of
//     kSlots fixed-size slots that the peer writes and the owner reads.
// Whoever changes something another rank may wait for (a message posted, a
// slot freed, a failure) bumps that rank's doorbell and wakes it only if it
// sleeps; the rank whose publish completes a round wakes every rank asleep
// in that round with one FUTEX_WAKE on the group's round bell. With a core
// per rank, waiting spins briefly, then yields; when ranks outnumber cores
// a wait for a small message or a round with little data yields for a short
// window and any other sleeps at once (docs/threads.md). Sleeps are futex waits of at
// most 100 ms; at each wake-up the abort flag and the peers' failed flags
// are checked, every 100 ms the peers' liveness (pidfd), so an exited peer
// is noticed well within a second.
#include "collectives/shm/shm_transport.h"

#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <vector>

#include "collectives/host.h"
#include "collectives/shm/futex.h"
#include "collectives/shm/yield_policy.h"
#include "runtime/shm_memory.h"

namespace tessera::collectives::shm {

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kSlots = 16;
constexpr size_t kReasonBytes = 256;

// A slot's first cache line, the only state a channel has (no head or tail
// counters, after FastForward): the sender writes the header and the
// payload, then stores `seq` (the fragment's index in the channel + 1, mod
// 2^32) last, and writes slot i only once its previous occupant, i - kSlots,
// is `freed` (seq_mark of that index). The receiver polls `seq` of the slot it
// expects next and stores `freed` once it has consumed it. A fragment that
// fits inline (kInlineFrag bytes, in the header's own line) thus moves one
// cache line to the receiver and back per message.
struct SlotHeader {
  std::atomic<uint32_t> seq;
  std::atomic<uint32_t> freed;
  uint32_t tag;
  uint32_t first;  // 1 on a message's first fragment
  uint64_t msg_bytes;
  uint64_t frag_bytes;
};
constexpr size_t kSlotHeader = 64;  // larger payloads start cache-line aligned
static_assert(sizeof(SlotHeader) <= kSlotHeader);
constexpr size_t kInlineFrag = kSlotHeader - sizeof(SlotHeader);
char* frag_data(char* slot, size_t frag) { return slot + (frag <= kInlineFrag ? sizeof(SlotHeader) : kSlotHeader); }

// Messages of at most kBoxMaxBytes go through a channel's box instead of its
// slots (after the fast boxes of OpenMPI's vader BTL): a byte ring of
// kBoxBytes in the owner's segment holding packed records, 16-byte header
// then the payload rounded up to 16, so two 8-byte messages share a cache
// line and a sender runs up to kBoxBytes / 32 messages ahead of its
// receiver. The owner polls `seq` of the record at its read offset and,
// once it has consumed it, stores the offset in `read`, which the sender
// re-reads only when its cached copy says the box is full. Each record's
// writer also zeroes the `seq` word just past it, so the owner never takes
// stale bytes of an older lap for a record. A record that would cross the
// box's end is written at its start and announced by a skip record at the
// old offset. Both sides know a message's size, so each takes it from the
// box or the slots alike; each is FIFO.
constexpr size_t kBoxBytes = 8192;
constexpr size_t kBoxAlign = 16;
constexpr size_t kBoxMaxBytes = 256;
struct BoxRecord {
  std::atomic<uint32_t> seq;  // seq_mark(index); 0: nothing yet
  uint32_t tag;
  uint32_t bytes;
  uint32_t skip;  // 1: the record is at the box's start
};
static_assert(sizeof(BoxRecord) == kBoxAlign && kBoxBytes % kBoxAlign == 0);
constexpr size_t box_record_bytes(size_t bytes) {
  return sizeof(BoxRecord) + (bytes + kBoxAlign - 1) / kBoxAlign * kBoxAlign;
}
// The sequence word of message or fragment `index` of a channel's box or
// slots; never 0, which marks "nothing yet" (a fresh segment reads as zeros).
uint32_t seq_mark(uint64_t index) { return static_cast<uint32_t>(index % 0xffffffffu) + 1; }
struct alignas(64) BoxCtl {
  std::atomic<uint64_t> read;  // bytes the owner consumed, skips included
};
struct alignas(64) Box {
  BoxCtl ctl;
  alignas(64) char ring[kBoxBytes];
};

constexpr size_t kTokenBytes = 16;

// A futex word and the number of ranks asleep on it. Whoever changes what a
// sleeper waits for stores that change (seq_cst), then loads `sleepers` and
// wakes only when it is non-zero; a sleeper increments `sleepers`, then
// re-checks its condition before FUTEX_WAIT (Dekker-style: either the waker
// sees the sleeper or the sleeper sees the change).
struct alignas(64) Bell {
  std::atomic<uint32_t> word;
  std::atomic<uint32_t> sleepers;
};

struct alignas(64) Control {
  unsigned char token[kTokenBytes];  // written once before the endpoint is published
  Bell doorbell;                     // the owner's point-to-point waits
  std::atomic<uint32_t> failed;
  std::atomic<uint32_t> closed;  // the owner destroyed its transport (a clean exit)
  char reason[kReasonBytes];
  // Used in group rank 0's segment only: the bell publish rounds sleep on.
  // The rank whose seq completes a round (it sees every peer's seq of the
  // round after storing its own) rings it once for all the sleepers.
  alignas(64) Bell round_bell;
};

struct PubSlot {
  uint32_t num_buffers;
  uint32_t inline_bytes;
  ShmLocation locs[SharedMemoryPeers::kMaxBuffers];
  uint64_t sizes[SharedMemoryPeers::kMaxBuffers];
  alignas(64) char inline_data[SharedMemoryPeers::kInlineBytes];
};

// The round's sequence number shares one cache line with small inline data
// and the buffer count, so a small all-reduce or a barrier costs a peer one
// line transfer per round. Double buffered by round parity: a rank can only
// reach round s+2 after every peer published s+1, i.e. finished reading s.
constexpr size_t kFastBytes = 48;
struct alignas(64) FastLine {
  std::atomic<uint64_t> seq;
  uint32_t num_buffers;
  uint32_t inline_bytes;
  char data[kFastBytes];
};
static_assert(sizeof(FastLine) == 64);

struct alignas(64) PubBlock {
  FastLine fast[2];
  PubSlot slots[2];
};

static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free);

struct Layout {
  size_t slot_payload = 0, slot_bytes = 0, control = 0, pub = 0, boxes = 0, chan_data = 0, total = 0;
  Layout(int p) {
    // Per-peer inbound budget: ~4 MiB split among the peers, 32 KiB..512 KiB slots.
    size_t per_peer = (size_t{4} << 20) / static_cast<size_t>(std::max(1, p - 1));
    size_t payload = size_t{512} << 10;
    while (payload > (size_t{32} << 10) && payload * kSlots > per_peer) payload /= 2;
    slot_payload = payload;
    slot_bytes = payload + kSlotHeader;
    control = 0;
    pub = sizeof(Control);
    boxes = pub + sizeof(PubBlock);
    chan_data = boxes + sizeof(Box) * static_cast<size_t>(p);
    total = chan_data + slot_bytes * kSlots * static_cast<size_t>(p);
  }
};

std::chrono::microseconds env_us(const char* name, long dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::chrono::microseconds(dflt);
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  TESSERA_ARG_CHECK(end && *end == '\0' && x >= 0, name, "='", v, "' is not a number of microseconds");
  return std::chrono::microseconds(x);
}

std::string to_hex(const unsigned char* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += d[p[i] >> 4];
    s += d[p[i] & 15];
  }
  return s;
}

class ShmTransport final : public Transport, public SharedMemoryPeers {
 public:
  ShmTransport(const std::shared_ptr<Store>& store, int rank, int size, const CommOptions& options, ShmOptions shm)
      : host_of_wider_group_(shm.part_of_wider_group),
        rank_(rank),
        size_(size),
        timeout_(options.timeout),
        group_(options.name),
        layout_(size),
        labels_(std::move(shm.labels)) {
    if (labels_.empty())
      for (int i = 0; i < size_; ++i) labels_.push_back(i);
    TESSERA_CHECK(static_cast<int>(labels_.size()) == size_, "shm transport: ", labels_.size(), " labels for ", size_,
                  " ranks");
    own_ = ShmSegment::create(layout_.total, "comm-" + options.name, /*prefault=*/true);
    std::memset(own_->data(), 0, sizeof(Control) + sizeof(PubBlock));  // slots: a new memfd reads as zeros
    unsigned char token[kTokenBytes];
    {
      std::random_device rd;
      for (size_t i = 0; i < kTokenBytes; i += 4) {
        const uint32_t x = rd();
        std::memcpy(token + i, &x, 4);
      }
    }
    std::memcpy(ctl(rank_, own_->data())->token, token, kTokenBytes);
    const HostIdentity host = this_host();
    const int fences = asymmetric_fences() ? 1 : 0;  // registers this process first
    {
      std::ostringstream os;
      os << ::getpid() << ' ' << own_->fd() << ' ' << own_->size() << ' ' << to_hex(token, kTokenBytes) << ' ' << fences
         << ' ' << host.key << ' ' << host.name;
      store->set("shm/" + std::to_string(rank_), os.str());
    }
    // Every endpoint first, and every host checked, before anything is
    // opened: a group that spans hosts fails on every rank with the same
    // reason, and no /proc entry of another host's pid is ever touched.
    struct Endpoint {
      int pid = 0, fd = -1;
      size_t bytes = 0;
      std::string token;
      int fences = 0;
    };
    std::vector<Endpoint> eps(size_);
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      std::string v;
      try {
        v = store->get("shm/" + std::to_string(j), timeout_);
      } catch (const TimeoutError& e) {
        throw TransportError(TransportError::Kind::Timeout, j,
                             "shm transport of group '" + group_ + "': rank " + label(j) +
                                 " never published its segment (" + e.what() + ")");
      }
      std::istringstream is(v);
      std::string peer_key, peer_name;
      is >> eps[j].pid >> eps[j].fd >> eps[j].bytes >> eps[j].token >> eps[j].fences >> peer_key;
      std::getline(is >> std::ws, peer_name);
      TESSERA_CHECK(is && eps[j].bytes >= layout_.total, "bad shm endpoint '", v, "' from rank ", label(j));
      if (peer_key != host.key)
        throw TransportError(TransportError::Kind::Protocol, j,
                             "shm transport of group '" + group_ + "': rank " + label(j) + " is on host '" + peer_name +
                                 "', not on this host '" + host.name +
                                 "'; shared memory cannot reach another host (use the tcp transport)");
    }
    // Light fences only if every rank has them (a sleeper without membarrier
    // could miss a light store).
    light_ = fences == 1;
    for (int j = 0; j < size_; ++j)
      if (j != rank_ && eps[j].fences != 1) light_ = false;
    set_waits(shm.oversubscribed);  // the same on every rank (from the host map)
    segs_.resize(size_);
    pids_.resize(size_, 0);
    pidfds_.resize(size_, -1);
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) {
        segs_[j] = own_->data();
        pids_[j] = ::getpid();
        continue;
      }
      const Endpoint& ep = eps[j];
      pids_[j] = ep.pid;
      if (ep.pid != ::getpid()) {
        int pfd = static_cast<int>(::syscall(SYS_pidfd_open, ep.pid, 0));
        pidfds_[j] = pfd;  // -1: fall back to kill(pid, 0)
      }
      try {
        peer_segs_.push_back(ShmSegment::open_peer(ep.pid, ep.fd, ep.bytes));
      } catch (const Error& e) {
        throw TransportError(
            TransportError::Kind::PeerDead, j,
            "shm transport of group '" + group_ + "': cannot map rank " + label(j) + "'s segment (" + e.what() + ")");
      }
      segs_[j] = peer_segs_.back()->data();
      if (to_hex(ctl(j)->token, kTokenBytes) != ep.token)
        throw TransportError(TransportError::Kind::Protocol, j,
                             "shm transport of group '" + group_ + "': the segment at /proc/" + std::to_string(ep.pid) +
                                 "/fd/" + std::to_string(ep.fd) + " is not rank " + label(j) +
                                 "'s (its token differs from the one rank " + label(j) + " published)");
    }
    send_head_.assign(size_, 0);
    for (auto* v : {&box_written_, &box_freed_, &box_read_, &box_sent_, &box_received_}) v->assign(size_, 0);
    recv_tail_.assign(size_, 0);
    peer_ptrs_.assign(static_cast<size_t>(size_) * kMaxBuffers, nullptr);
    peer_inline_.assign(size_, nullptr);
    // Nobody returns before every rank has mapped every segment, so a rank
    // that dies right after creation fails the others' first collective,
    // not their creation.
    publish(nullptr, nullptr, 0, nullptr, 0);
    // Slow yields while the group's processes started (loading, mapping)
    // must not make the first collectives sleep: at 4 ranks the first size
    // a bench run timed took 11.4 us for 8 B against 3.2 when timed later.
    yield_policy_.reset();
  }

  ~ShmTransport() override {
    ctl(rank_)->closed.store(1, std::memory_order_seq_cst);
    ring_everyone();
    for (int fd : pidfds_)
      if (fd >= 0) ::close(fd);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "shm"; }

  void send(int peer, uint32_t tag, const void* buf, size_t bytes) override {
    check_peer(peer);
    SendState s{peer, tag, static_cast<const char*>(buf), bytes, 0, false};
    while (!s.done) {
      if (!progress_send(s)) wait_until([&] { return can_send(peer, bytes); }, peer, brief(bytes));
    }
  }

  void recv(int peer, uint32_t tag, void* buf, size_t bytes) override {
    CopySink sink(static_cast<char*>(buf));
    sendrecv_sink(-1, nullptr, 0, peer, bytes, sink, tag, /*with_send=*/false);
  }

  void sendrecv(int to, const void* sbuf, size_t sbytes, int from, void* rbuf, size_t rbytes, uint32_t tag) override {
    CopySink sink(static_cast<char*>(rbuf));
    sendrecv_sink(to, sbuf, sbytes, from, rbytes, sink, tag, true);
  }

  void sendrecv_sink(int to, const void* sbuf, size_t sbytes, int from, size_t rbytes, RecvSink& sink,
                     uint32_t tag) override {
    sendrecv_sink(to, sbuf, sbytes, from, rbytes, sink, tag, true);
  }

  void recv_sink(int from, size_t bytes, RecvSink& sink, uint32_t tag) override {
    sendrecv_sink(-1, nullptr, 0, from, bytes, sink, tag, false);
  }

  void abort(const std::string& reason) override {
    {
      std::lock_guard<std::mutex> lk(abort_mu_);
      if (aborted_.load()) return;
      abort_reason_ = reason;
      aborted_.store(true);
    }
    mark_failed("aborted: " + reason);
    ring_everyone();  // our own waiter too, on whichever bell it sleeps
  }
  bool aborted() const override { return aborted_.load(); }

  bool peer_alive(int peer) const override {
    if (peer < 0 || peer >= size_ || peer == rank_) return true;
    if (ctl(peer)->failed.load(std::memory_order_acquire)) return false;
    return process_alive(peer);
  }

  SharedMemoryPeers* shared_memory() override { return this; }

  // ---- SharedMemoryPeers ----
  bool is_shared(const void* p, size_t bytes) const override {
    return bytes == 0 || find_shm_location(p, bytes).has_value();
  }

  void publish(const void* const* buffers, const size_t* sizes, int n, const void* inline_data,
               size_t inline_bytes) override {
    TESSERA_CHECK(n >= 0 && n <= kMaxBuffers && inline_bytes <= kInlineBytes);
    fail_fast(-1);
    const uint64_t round = ++round_;
    const bool small = inline_bytes <= kFastBytes;
    if (n > 0 || !small) {
      PubSlot& slot = pub(rank_)->slots[round % 2];
      slot.num_buffers = static_cast<uint32_t>(n);
      for (int i = 0; i < n; ++i) {
        slot.sizes[i] = sizes[i];
        if (sizes[i] == 0) {
          slot.locs[i] = ShmLocation{};
          continue;
        }
        auto loc = find_shm_location(buffers[i], sizes[i]);
        TESSERA_CHECK(loc.has_value(), "publish of a buffer outside every shared arena");
        slot.locs[i] = *loc;
      }
      slot.inline_bytes = static_cast<uint32_t>(inline_bytes);
      if (!small) std::memcpy(slot.inline_data, inline_data, inline_bytes);
    }
    FastLine& fl = pub(rank_)->fast[round % 2];
    fl.num_buffers = static_cast<uint32_t>(n);
    fl.inline_bytes = static_cast<uint32_t>(inline_bytes);
    if (small && inline_bytes) std::memcpy(fl.data, inline_data, inline_bytes);
    fl.seq.store(round, std::memory_order_seq_cst);
    // The round is complete once every rank's seq of it is stored (each
    // rank's slot is written before its seq, so these loads see every slot).
    // A rank reaches round s+2 only after round s+1 completed, so a seq of
    // this parity is this round's or older. Seq_cst stores and loads: the
    // rank whose store is last sees all the others and rings the round bell
    // if anyone sleeps (a sleeper counts itself, then checks the seqs again);
    // two ranks may both see it complete and ring, which costs only a wake.
    int missing = -1;  // blamed on timeout: a rank that has not published
    const auto complete = [&] {
      for (int j = 0; j < size_; ++j)
        if (j != rank_ && pub(j)->fast[round % 2].seq.load(std::memory_order_seq_cst) < round) {
          missing = j;
          return false;
        }
      return true;
    };
    Bell& bell = group_ctl()->round_bell;
    if (complete())
      ring_bell(bell);
    else
      wait_until(complete, -1, brief_round(n, sizes), &missing, &bell);
    for (int j = 0; j < size_; ++j) {
      const FastLine& f = pub(j)->fast[round % 2];
      const PubSlot& ps = pub(j)->slots[round % 2];
      peer_inline_[j] = f.inline_bytes <= kFastBytes ? f.data : ps.inline_data;
      for (int i = 0; i < kMaxBuffers; ++i) {
        void*& out = peer_ptrs_[static_cast<size_t>(j) * kMaxBuffers + i];
        out = nullptr;
        if (i >= static_cast<int>(f.num_buffers) || ps.sizes[i] == 0) continue;
        if (j == rank_) {
          out = const_cast<void*>(buffers[i]);
          continue;
        }
        out = static_cast<char*>(map_arena(ps.locs[i])) + ps.locs[i].offset;
      }
    }
  }

  void* peer_buffer(int peer, int index) const override {
    return peer_ptrs_[static_cast<size_t>(peer) * kMaxBuffers + index];
  }
  const void* peer_inline(int peer) const override { return peer_inline_[peer]; }

 private:
  struct SendState {
    int peer;
    uint32_t tag;
    const char* buf;
    size_t bytes;
    size_t off;
    bool done;
  };

  class CopySink final : public RecvSink {
   public:
    explicit CopySink(char* dst) : dst_(dst) {}
    void consume(size_t off, const void* data, size_t bytes) override {
      if (bytes) std::memcpy(dst_ + off, data, bytes);
    }

   private:
    char* dst_;
  };

  struct RecvState {
    int peer;
    uint32_t tag;
    size_t bytes;
    size_t off;
    bool started;
    bool done;
  };

  Control* ctl(int j) const { return static_cast<Control*>(segs_[j]); }
  static Control* ctl(int, void* seg) { return static_cast<Control*>(seg); }
  std::string label(int j) const { return std::to_string(labels_[j]); }
  PubBlock* pub(int j) const { return reinterpret_cast<PubBlock*>(static_cast<char*>(segs_[j]) + layout_.pub); }
  // Slot `index` of the channel in `owner`'s segment carrying messages from `sender`.
  char* slot(int owner, int sender, uint64_t index) const {
    return static_cast<char*>(segs_[owner]) + layout_.chan_data +
           (static_cast<size_t>(sender) * kSlots + index % kSlots) * layout_.slot_bytes;
  }

  void check_peer(int peer) const {
    TESSERA_ARG_CHECK(peer >= 0 && peer < size_ && peer != rank_, "shm transport: bad peer ", peer, " for rank ", rank_,
                      " of ", size_);
  }

  // Called after a store of the state a sleeper on `b` may wait for: a
  // seq_cst store, or for a doorbell with light_, a release store (futex.h).
  // Dekker-style with the waiter (which increments `sleepers` and then
  // re-checks its state): either we see it asleep and wake it, or it sees
  // our state change; so a busy peer costs only this load.
  static void ring_bell(Bell& b) {
    if (b.sleepers.load(std::memory_order_seq_cst)) {
      b.word.fetch_add(1, std::memory_order_seq_cst);
      futex(&b.word, FUTEX_WAKE, INT_MAX, nullptr);
    }
  }
  void ring(int j) { ring_bell(ctl(j)->doorbell); }
  // Group rank 0's segment holds the publish rounds' bell.
  Control* group_ctl() const { return ctl(0); }
  // A failure, abort or close: every waiter of every rank must look again.
  void ring_everyone() {
    for (int j = 0; j < size_; ++j) ring(j);
    ring_bell(group_ctl()->round_bell);
  }

  static SlotHeader* header(char* slot) { return reinterpret_cast<SlotHeader*>(slot); }
  bool can_send(int peer, size_t bytes) {
    if (bytes <= kBoxMaxBytes) return box_fits(peer, bytes);
    const uint64_t i = send_head_[peer];
    return i < kSlots || header(slot(peer, rank_, i))->freed.load(std::memory_order_acquire) == seq_mark(i - kSlots);
  }
  bool can_recv(int peer, size_t bytes) const {
    if (bytes <= kBoxMaxBytes)
      return record(box(rank_, peer), box_read_[peer] % kBoxBytes)->seq.load(std::memory_order_acquire) ==
             seq_mark(box_received_[peer]);
    const uint64_t i = recv_tail_[peer];
    return header(slot(rank_, peer, i))->seq.load(std::memory_order_acquire) == seq_mark(i);
  }

  // ---- boxes (messages of at most kBoxMaxBytes) ----
  // The box in `owner`'s segment carrying messages from `sender`.
  Box* box(int owner, int sender) const {
    return reinterpret_cast<Box*>(static_cast<char*>(segs_[owner]) + layout_.boxes) + sender;
  }
  static BoxRecord* record(Box* b, size_t pos) { return reinterpret_cast<BoxRecord*>(b->ring + pos); }
  static char* payload(BoxRecord* r) { return reinterpret_cast<char*>(r) + sizeof(BoxRecord); }
  // Bytes a message of `bytes` takes at write offset `w`: the skip to the
  // box's start if it would cross the end, the record, and the next
  // record's header, which the writer zeroes.
  static size_t box_need(uint64_t w, size_t bytes) {
    const size_t pos = w % kBoxBytes, rec = box_record_bytes(bytes);
    return (pos + rec > kBoxBytes ? kBoxBytes - pos : 0) + rec + sizeof(BoxRecord);
  }
  bool box_fits(int peer, size_t bytes) {
    const uint64_t w = box_written_[peer], need = box_need(w, bytes);
    if (w + need - box_freed_[peer] <= kBoxBytes) return true;
    box_freed_[peer] = box(peer, rank_)->ctl.read.load(std::memory_order_acquire);
    return w + need - box_freed_[peer] <= kBoxBytes;
  }
  // Posts one message; box_fits() said it fits.
  void box_send(int peer, uint32_t tag, const void* buf, size_t bytes) {
    Box* b = box(peer, rank_);
    const uint64_t w = box_written_[peer];
    const size_t pos = w % kBoxBytes, rec = box_record_bytes(bytes);
    const bool wrap = pos + rec > kBoxBytes;
    const size_t at = wrap ? 0 : pos;
    BoxRecord* r = record(b, at);
    r->tag = tag;
    r->bytes = static_cast<uint32_t>(bytes);
    r->skip = 0;
    if (bytes) std::memcpy(payload(r), buf, bytes);
    record(b, (at + rec) % kBoxBytes)->seq.store(0, std::memory_order_relaxed);
    const uint32_t m = seq_mark(box_sent_[peer]++);
    if (wrap) {
      // The record first, then the skip that leads the owner to it.
      r->seq.store(m, std::memory_order_release);
      BoxRecord* skip = record(b, pos);
      skip->tag = tag;
      skip->bytes = static_cast<uint32_t>(bytes);
      skip->skip = 1;
      store_change(skip->seq, m);
    } else {
      store_change(r->seq, m);
    }
    box_written_[peer] = w + (wrap ? kBoxBytes - pos : 0) + rec;
    ring(peer);
  }
  [[noreturn]] void mismatch(const RecvState& r, uint32_t tag, uint64_t bytes, const std::string& what) {
    fail(TransportError::Kind::Protocol, r.peer,
         detail::concat("protocol mismatch receiving from rank ", label(r.peer), ": expected tag ", r.tag, " and ",
                        r.bytes, " bytes, got tag ", tag, " and ", bytes, " bytes", what));
  }
  // Takes the message can_recv() saw.
  void box_recv(RecvState& rs, RecvSink& sink) {
    const int peer = rs.peer;
    Box* b = box(rank_, peer);
    uint64_t& rd = box_read_[peer];
    size_t pos = rd % kBoxBytes;
    const size_t rec = box_record_bytes(rs.bytes);
    BoxRecord* r = record(b, pos);
    const bool wrap = pos + rec > kBoxBytes;
    if (r->skip && wrap && r->tag == rs.tag && r->bytes == rs.bytes) {
      rd += kBoxBytes - pos;
      pos = 0;
      r = record(b, 0);
    }
    if (r->tag != rs.tag || r->bytes != rs.bytes || r->skip || pos + rec > kBoxBytes ||
        r->seq.load(std::memory_order_acquire) != seq_mark(box_received_[peer]))
      mismatch(rs, r->tag, r->bytes, r->skip ? " (a skip record)" : "");
    sink.consume(0, payload(r), rs.bytes);
    rd += rec;
    ++box_received_[peer];
    store_change(b->ctl.read, rd);
    ring(peer);
    rs.done = true;
  }

  // Writes as many fragments as there are free slots; true if any was written.
  bool progress_send(SendState& s) {
    if (s.bytes <= kBoxMaxBytes) {
      if (!box_fits(s.peer, s.bytes)) return false;
      box_send(s.peer, s.tag, s.buf, s.bytes);
      s.done = true;
      return true;
    }
    bool any = false;
    while (!s.done && can_send(s.peer, s.bytes)) {
      char* sl = slot(s.peer, rank_, send_head_[s.peer]);
      SlotHeader* h = header(sl);
      const size_t frag = std::min(layout_.slot_payload, s.bytes - s.off);
      h->tag = s.tag;
      h->first = (s.off == 0);
      h->msg_bytes = s.bytes;
      h->frag_bytes = frag;
      if (frag) std::memcpy(frag_data(sl, frag), s.buf + s.off, frag);
      s.off += frag;
      s.done = (s.off == s.bytes);
      store_change(h->seq, seq_mark(send_head_[s.peer]++));
      ring(s.peer);
      any = true;
    }
    return any;
  }

  bool progress_recv(RecvState& r, RecvSink& sink) {
    if (r.bytes <= kBoxMaxBytes) {
      if (!can_recv(r.peer, r.bytes)) return false;
      box_recv(r, sink);
      return true;
    }
    bool any = false;
    while (!r.done && can_recv(r.peer, r.bytes)) {
      char* sl = slot(rank_, r.peer, recv_tail_[r.peer]);
      const SlotHeader* h = header(sl);
      if (h->tag != r.tag || h->msg_bytes != r.bytes || (h->first != 0) != (r.off == 0) ||
          h->frag_bytes > std::min(layout_.slot_payload, r.bytes - r.off) || (h->frag_bytes == 0 && r.bytes != 0)) {
        mismatch(r, h->tag, h->msg_bytes, detail::concat(" (a fragment of ", h->frag_bytes, " at offset ", r.off, ")"));
      }
      sink.consume(r.off, frag_data(sl, h->frag_bytes), h->frag_bytes);
      r.off += h->frag_bytes;
      r.done = (r.off == r.bytes);
      store_change(header(sl)->freed, seq_mark(recv_tail_[r.peer]++));
      ring(r.peer);
      any = true;
    }
    return any;
  }

  void sendrecv_sink(int to, const void* sbuf, size_t sbytes, int from, size_t rbytes, RecvSink& sink, uint32_t tag,
                     bool with_send) {
    check_peer(from);
    if (with_send) check_peer(to);
    fail_fast(from);
    SendState s{to, tag, static_cast<const char*>(sbuf), sbytes, 0, !with_send};
    RecvState r{from, tag, rbytes, 0, false, false};
    while (!s.done || !r.done) {
      bool a = !s.done && progress_send(s);
      bool b = !r.done && progress_recv(r, sink);
      if (a || b) continue;
      int blame = !r.done ? from : to;
      wait_until([&] { return (!s.done && can_send(to, sbytes)) || (!r.done && can_recv(from, rbytes)); }, blame,
                 brief(std::max(sbytes, rbytes)));
    }
  }

  bool process_alive(int j) const {
    if (pids_[j] == ::getpid()) return true;
    if (pidfds_[j] >= 0) {
      struct pollfd pf {
        pidfds_[j], POLLIN, 0
      };
      return ::poll(&pf, 1, 0) == 0;  // readable once the process exited (zombie too)
    }
    return ::kill(pids_[j], 0) == 0 || errno == EPERM;
  }

  void mark_failed(const std::string& reason) {
    Control* c = ctl(rank_);
    if (marked_.exchange(true)) return;  // one writer of the reason
    std::strncpy(c->reason, reason.c_str(), kReasonBytes - 1);
    c->failed.store(1, std::memory_order_seq_cst);
    ring_everyone();
  }

  [[noreturn]] void fail(TransportError::Kind kind, int peer, const std::string& what) {
    if (kind != TransportError::Kind::Aborted) mark_failed("failed: " + what);
    first_error_kind_ = kind;
    first_error_peer_ = peer;
    first_error_ = what;
    throw TransportError(kind, peer, what);
  }

  struct Failure {
    TransportError::Kind kind;
    int peer;
    std::string what;
  };

  // A reason to stop: this transport was aborted or already failed, or a
  // peer failed or exited.
  std::optional<Failure> detect(int prefer_peer, bool check_processes) const {
    if (aborted_.load()) {
      std::lock_guard<std::mutex> lk(abort_mu_);
      return Failure{TransportError::Kind::Aborted, -1, "aborted: " + abort_reason_};
    }
    if (!first_error_.empty()) return Failure{first_error_kind_, first_error_peer_, first_error_};
    // Exited processes first, so the root cause is named rather than a peer
    // that failed because of it.
    // Order: crashed processes (exited without closing their communicator)
    // first, then peers that reported a failure, then a peer this rank waits
    // for that closed its communicator; so the root cause is named.
    auto crashed = [&](int j) -> std::optional<Failure> {
      if (j < 0 || j == rank_ || !check_processes || ctl(j)->closed.load(std::memory_order_acquire) || process_alive(j))
        return std::nullopt;
      return Failure{TransportError::Kind::PeerDead, j,
                     "peer rank " + label(j) + " (pid " + std::to_string(pids_[j]) + ") exited"};
    };
    auto failed = [&](int j) -> std::optional<Failure> {
      if (j < 0 || j == rank_ || !ctl(j)->failed.load(std::memory_order_acquire)) return std::nullopt;
      char reason[kReasonBytes];
      std::memcpy(reason, ctl(j)->reason, kReasonBytes);
      reason[kReasonBytes - 1] = 0;
      return Failure{TransportError::Kind::PeerFailed, j, "peer rank " + label(j) + " " + reason};
    };
    if (check_processes) {
      if (auto f = crashed(prefer_peer)) return f;
      for (int j = 0; j < size_; ++j)
        if (auto f = crashed(j)) return f;
    }
    if (auto f = failed(prefer_peer)) return f;
    for (int j = 0; j < size_; ++j)
      if (auto f = failed(j)) return f;
    if (check_processes && prefer_peer >= 0 && prefer_peer != rank_ &&
        ctl(prefer_peer)->closed.load(std::memory_order_acquire))
      return Failure{TransportError::Kind::PeerDead, prefer_peer,
                     "peer rank " + label(prefer_peer) + " closed its communicator while this rank waits for it"};
    return std::nullopt;
  }

  // Cheap (no system calls): called at the start of every operation.
  void fail_fast(int prefer_peer) {
    if (auto f = detect(prefer_peer, false)) {
      // A peer failed: name the root cause if it is a process that died.
      if (f->kind == TransportError::Kind::PeerFailed)
        if (auto g = detect(prefer_peer, true)) f = g;
      fail(f->kind, f->peer, f->what);
    }
  }

  // Waits until ready(); `peer` (or *peer_ref when given) is blamed on
  // timeout. Sleeps on `bell` (default: this rank's doorbell), which whoever
  // makes ready() true rings. `brief`: the wait belongs to a small message or
  // a publish round without buffers, so it usually ends within microseconds.
  template <typename Ready>
  void wait_until(Ready ready, int peer, bool brief, const int* peer_ref = nullptr, Bell* bell = nullptr) {
    const bool doorbell = bell == nullptr;
    if (doorbell) bell = &ctl(rank_)->doorbell;
    for (int i = 0; i < polls_; ++i) {
      if (ready()) return;
      cpu_relax();
    }
    const auto start = Clock::now();
    const auto deadline = start + timeout_;
    // With a core per rank: spin, then yield, for short windows, since the
    // peer usually answers within microseconds and a sleep + wake costs more.
    // When ranks outnumber cores there is no spin; a brief wait yields,
    // which hands the core to the next runnable rank without a wake-up (a
    // futex wake costs the waker a system call and the sleeper a reschedule
    // interrupt), and sleeps once the window is over; any other wait sleeps
    // at once, since yielding ranks share a core with the rank doing the
    // work (CFS runs the yielders, whose vruntime is lower, in turn).
    // YieldPolicy stops the yielding for a while when yields come back slow
    // (the cores go to other tasks for slices: a woken sleeper preempts
    // them, a yielder queues behind them).
    const auto yield = oversubscribed_ && !brief ? std::chrono::microseconds(0) : yield_;
    if (spin_.count() > 0) {
      while (Clock::now() - start < spin_) {
        for (int k = 0; k < 16; ++k) {
          if (ready()) return;
          cpu_relax();
        }
      }
    }
    if (yield.count() > 0 && yield_policy_.yield_until(ready, start, spin_ + yield)) return;
    // Peers' processes (a system call each) are checked every 100 ms; their
    // failed flags (plain loads) at every wake-up.
    auto last_check = start;
    const auto blame = [&] { return peer_ref ? *peer_ref : peer; };
    for (;;) {
      const uint32_t word = bell->word.load(std::memory_order_seq_cst);
      bell->sleepers.fetch_add(1, std::memory_order_seq_cst);
      if (doorbell && light_) heavy_barrier();  // the peers' changes are light (futex.h)
      if (ready()) {
        bell->sleepers.fetch_sub(1, std::memory_order_relaxed);
        return;
      }
      const auto now = Clock::now();
      const bool processes = now - last_check >= std::chrono::milliseconds(100);
      if (processes) last_check = now;
      auto f = detect(blame(), processes);
      // A peer failed: name the root cause if it is a process that died.
      if (f && f->kind == TransportError::Kind::PeerFailed && !processes)
        if (auto g = detect(blame(), true)) f = g;
      if (f) {
        bell->sleepers.fetch_sub(1, std::memory_order_relaxed);
        // A peer may have delivered everything and then exited.
        if (f->kind != TransportError::Kind::Aborted && ready()) return;
        fail(f->kind, f->peer, f->what);
      }
      if (now >= deadline) {
        bell->sleepers.fetch_sub(1, std::memory_order_relaxed);
        fail(TransportError::Kind::Timeout, blame(),
             detail::concat("timed out after ", timeout_.count(), " ms waiting for ",
                            blame() >= 0 ? "rank " + label(blame()) : std::string("the group")));
      }
      const auto slice = std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(100));
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(slice).count();
      struct timespec ts {
        static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)
      };
      futex(&bell->word, FUTEX_WAIT, word, &ts);
      bell->sleepers.fetch_sub(1, std::memory_order_relaxed);
    }
  }

  void* map_arena(const ShmLocation& loc) {
    auto it = arenas_.find(loc.arena_id);
    if (it == arenas_.end()) {
      it = arenas_.emplace(loc.arena_id, ShmSegment::open_peer(loc.pid, loc.fd, loc.arena_bytes)).first;
    }
    return it->second->data();
  }

  const bool host_of_wider_group_;
  const int rank_, size_;
  const std::chrono::milliseconds timeout_;
  // Busy waiting before sleeping (TESSERA_SHM_SPIN_US, TESSERA_SHM_YIELD_US;
  // docs/threads.md has the measurements behind the defaults, made with
  // tessera_handoff_bench). With a core per rank, waiting busy for up to 2 ms
  // avoids paying a wake-up (scheduler latency) whenever a peer is briefly
  // preempted. When ranks outnumber cores, every microsecond a waiter spins
  // delays the rank it waits for (a pause takes ~70 ns here), so it polls a
  // few times and then, for a small message or a publish round without
  // buffers, yields for up to 200 us before it sleeps: a publish round of
  // yielding ranks took half the time of sleeping ones.
  // Whether the group's ranks outnumber the CPUs they may run on together
  // (the union of their affinities), set in the constructor.
  bool oversubscribed_ = false;
  // Point-to-point changes (a message posted, a slot or box space freed) are
  // stored with light fences when every rank of the group has them
  // (asymmetric_fences() in futex.h); set in the constructor.
  bool light_ = false;
  // Stores such a change (constant orders: GCC makes any run-time order seq_cst).
  template <typename T>
  void store_change(std::atomic<T>& a, T v) const {
    if (light_)
      a.store(v, std::memory_order_release);
    else
      a.store(v, std::memory_order_seq_cst);
  }
  int polls_ = 64;
  std::chrono::microseconds spin_{0}, yield_{0};
  void set_waits(bool oversubscribed) {
    oversubscribed_ = oversubscribed;
    polls_ = oversubscribed ? 4 : 64;
    spin_ = env_us("TESSERA_SHM_SPIN_US", oversubscribed ? 0 : 50);
    // A host's part of a group spanning hosts: a brief wait often covers a
    // host-mate's step across hosts (hier_leader's broadcast, hier's
    // rounds), tens to hundreds of microseconds in which the core has
    // nothing else to run, so it yields as long as with a core per rank;
    // sleeping instead costs the leader a futex wake and the waiter a
    // wake-up (docs/threads.md).
    yield_ = env_us("TESSERA_SHM_YIELD_US", oversubscribed && !host_of_wider_group_ ? 200 : 2000);
  }
  YieldPolicy yield_policy_;
  // Messages up to this size wait briefly (see wait_until): as for rounds,
  // the sender produces one in microseconds. At 4 KiB, 8-rank broadcasts of
  // 8 KiB by `flat` took 35-60 us (each receiver slept and was woken) and
  // 3.5-9 us at 64 KiB (docs/algorithms.md, "Crossovers").
  static constexpr size_t kBriefBytes = size_t{64} << 10;
  static bool brief(size_t bytes) { return bytes <= kBriefBytes; }
  // A publish round waits briefly without buffers, or when the buffers are
  // small enough that the work between rounds (an algorithm reads and
  // writes about their bytes) takes microseconds. At 64 KiB, every 128 KiB
  // direct broadcast, all-gather and reduce-scatter at 4 ranks slept in its
  // rounds: 34-44 us against 8.6-9.5 at 256 KiB (load 3-4, docs/bench.md).
  static constexpr size_t kBriefRoundBytes = size_t{256} << 10;
  static bool brief_round(int n, const size_t* sizes) {
    size_t total = 0;
    for (int i = 0; i < n; ++i) total += sizes[i];
    return total <= kBriefRoundBytes;
  }
  const std::string group_;
  const Layout layout_;
  std::vector<int> labels_;  // local rank -> rank named in messages
  std::unique_ptr<ShmSegment> own_;
  std::vector<std::unique_ptr<ShmSegment>> peer_segs_;
  std::vector<void*> segs_;
  std::vector<int> pids_, pidfds_;
  std::vector<uint64_t> send_head_, recv_tail_;  // fragments sent to / received from each peer
  // Boxes, per peer: bytes written and the owner's read offset last seen;
  // bytes read; messages sent and received.
  std::vector<uint64_t> box_written_, box_freed_, box_read_, box_sent_, box_received_;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> marked_{false};
  mutable std::mutex abort_mu_;
  std::string abort_reason_;
  TransportError::Kind first_error_kind_ = TransportError::Kind::Timeout;
  int first_error_peer_ = -1;
  std::string first_error_;
  uint64_t round_ = 0;
  std::vector<void*> peer_ptrs_;
  std::vector<const void*> peer_inline_;
  std::map<uint64_t, std::unique_ptr<ShmSegment>> arenas_;
};

}  // namespace

std::unique_ptr<Transport> create_transport(const std::shared_ptr<Store>& store, int rank, int size,
                                            const CommOptions& options, ShmOptions shm) {
  return std::make_unique<ShmTransport>(store, rank, size, options, std::move(shm));
}

}  // namespace tessera::collectives::shm
