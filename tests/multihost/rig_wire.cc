// The rig's delayed wire (tests/multihost/rig.sh, RIG_DELAY_US): a fixed
// one-way delay on every link between the test hosts.
//
// This kernel has no time-based qdisc (sch_netem, sch_fq, sch_etf are not
// built and cannot be loaded; "Specified qdisc kind is unknown"), so no
// tc/BPF setup can hold a packet for a while. Instead each host's eth0 is a
// TUN device and this process is the wire between them: it reads every IPv4
// packet a host sends, and writes it to the host that owns the destination
// address DELAY microseconds after it read it.
//
// One thread per sending device, like each host's own outgoing link: packets
// going opposite ways (the two directions of an exchange) or from different
// hosts never wait for each other's forwarding, only packets one host sends
// share its thread, in order. Each thread needs only one FIFO: every packet
// is held for the same time, so its deadlines come in arrival order.
//
// The hold of data is kept exact on a VM, where a timer sleep overshoots by
// tens of microseconds (measured: median 21-27 us, p90 40-55 us on the
// 2-core rig): each thread sleeps until its measured overshoot before the
// deadline and spins (reading new packets meanwhile) for the rest; the
// overshoot estimate follows the sleeps (an exponential average, at most
// kMaxEarly). Pure TCP ACKs are held at least as long, without the spin:
// written at their own timer wake (late by its overshoot) or after the spin
// of a data packet due soon after them (up to kMaxEarly late).
//
//   tessera_rig_wire DELAY_US READY_FILE NETNS_PATH=ADDR[@CPU] ...
//
// Each NETNS_PATH (/run/netns/NAME) must hold a persistent TUN device named
// eth0 (`ip tuntap add dev eth0 mode tun`) with address ADDR. With @CPU, the
// thread forwarding what that device sends runs on CPU only: writing a packet
// into a device runs the receiving host's network stack and wakes its
// reader in the writing thread, so on a rig whose hosts each have a core of
// their own (rig.sh, RIG_HOST_CPUS) it belongs on the core of the host it
// sends to (measured on 2 hosts x 2 ranks, 100 us: a small all-reduce took
// 180-200 us so, 270-330 us with the threads anywhere else). READY_FILE is
// created once every device is attached. It runs until killed. To keep the
// delay fixed on a loaded machine it asks for SCHED_FIFO and a 1 ns timer
// slack (both best effort: it says so on stderr when it cannot). With
// RIG_WIRE_STATS=1 it prints each thread's hold times of data (read to write) after
// a SIGUSR1, when that thread next wakes, and clears them.
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collectives/shm/futex.h"

namespace {

int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "tessera_rig_wire: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

// Opens the TUN device eth0 of the network namespace at `path`.
int attach(const std::string& path) {
  const int ns = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (ns < 0) die("cannot open " + path);
  if (setns(ns, CLONE_NEWNET) != 0) die("cannot enter " + path);
  close(ns);
  const int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) die("cannot open /dev/net/tun");
  ifreq ifr{};
  ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
  std::strncpy(ifr.ifr_name, "eth0", IFNAMSIZ - 1);
  if (ioctl(fd, TUNSETIFF, &ifr) != 0) die("cannot attach to eth0 in " + path);
  return fd;
}

struct Packet {
  int64_t due;
  int to;
  bool pure_ack;  // a TCP segment without payload or SYN/FIN/RST (is_pure_ack)
  size_t len;
  std::vector<unsigned char> bytes;  // kMaxPacket long (never resized: no zero-filling per read)
};

constexpr size_t kMaxQueued = 8192;  // per sender; beyond this the wire drops, as a full queue does
constexpr size_t kMaxPacket = 65536;
constexpr int64_t kMaxEarly = 60000;  // ns: the most a thread spins before a deadline
constexpr int64_t kMargin = 3000;     // ns woken before the expected overshoot
constexpr int64_t kSpinPoll = 2000;   // ns between reads while spinning

// A TCP segment that carries no data and no SYN, FIN or RST: an
// acknowledgement (or window update) only.
bool is_pure_ack(const unsigned char* p, size_t n) {
  if (n < 20 || (p[0] >> 4) != 4 || p[9] != 6) return false;  // IPv4, TCP
  if ((p[6] & 0x3f) != 0 || p[7] != 0) return false;          // a fragment (MF or an offset)
  const size_t ihl = static_cast<size_t>(p[0] & 15) * 4;
  const size_t total = static_cast<size_t>(p[2]) << 8 | p[3];
  if (ihl < 20 || n < ihl + 20 || total > n) return false;
  const size_t thl = static_cast<size_t>(p[ihl + 12] >> 4) * 4;
  const unsigned flags = p[ihl + 13];
  return total == ihl + thl && (flags & 0x07) == 0;  // no FIN (1), SYN (2), RST (4)
}

// SIGUSR1 count; each thread prints its figures when it sees a new one.
std::atomic<unsigned> g_dumps{0};
void on_usr1(int) { g_dumps.fetch_add(1); }

// One sending device's forwarding: reads what it sends, writes each packet
// to its destination's device `delay_ns` later.
class Sender {
 public:
  Sender(size_t self, const std::vector<int>& fds, const std::vector<uint32_t>& addrs, int64_t delay_ns, bool stats)
      : self_(self), fds_(fds), addrs_(addrs), delay_ns_(delay_ns), stats_(stats) {}

  [[noreturn]] void run() {
    for (;;) {
      deliver_due();
      if (stats_ && g_dumps.load() != dumps_seen_) {
        dumps_seen_ = g_dumps.load();
        dump();
      }
      if (queue_.empty()) {
        wait_readable(-1);
        read_all();
        continue;
      }
      // Data keeps its time exactly (sleep, then spin); a pure ACK at the
      // head is written when the thread next runs after its time (its own
      // timer wake, or after a data packet's spin): the data it acknowledges
      // has arrived, so its lateness (a timer's overshoot, tens of
      // microseconds) delays no message, while a spin for it took the
      // receiving host's core for tens of microseconds at the moment that
      // host's ranks compute (64 KiB messages, two segments, make the
      // receiver acknowledge at once).
      int64_t due = -1;
      for (const Packet& p : queue_)
        if (!p.pure_ack) {
          due = p.due;
          break;
        }
      const bool ack_first = queue_.front().pure_ack;
      const int64_t wake = due < 0 ? queue_.front().due : due - early_;
      const int64_t sleep_until = ack_first ? std::min(queue_.front().due, wake) : wake;
      int64_t now = now_ns();
      if (sleep_until > now) {
        if (wait_readable(sleep_until - now)) {
          read_all();
          continue;  // woken by a packet: sleep again for what is left
        }
        now = now_ns();
        if (sleep_until != wake || due < 0) continue;  // an ACK's time: write it (and anything due)
        // A timer wake before data: learn how far past its time it came.
        const int64_t over = std::max<int64_t>(0, now - sleep_until);
        over_avg_ += (over - over_avg_) / 8;
        early_ = std::min(kMaxEarly, over_avg_ + kMargin);
      }
      if (due < 0) continue;
      // Spin to the deadline, taking in what arrives meanwhile (a read
      // every kSpinPoll, so a packet's time is at most that late).
      for (int64_t next_read = 0, t = now_ns(); t < due; t = now_ns()) {
        if (t >= next_read) {
          read_all();
          next_read = now_ns() + kSpinPoll;
        }
        tessera::collectives::shm::cpu_relax();
      }
    }
  }

 private:
  // True when the device became readable within `ns` (< 0: no limit).
  bool wait_readable(int64_t ns) {
    pollfd pf{fds_[self_], POLLIN, 0};
    timespec ts{};
    timespec* tsp = nullptr;
    if (ns >= 0) {
      ts.tv_sec = static_cast<time_t>(ns / 1000000000);
      ts.tv_nsec = static_cast<long>(ns % 1000000000);
      tsp = &ts;
    }
    const int r = ppoll(&pf, 1, tsp, nullptr);
    if (r < 0 && errno != EINTR) die("poll");
    return r > 0;
  }

  void deliver_due() {
    const int64_t now = now_ns();
    while (!queue_.empty() && queue_.front().due <= now) {
      Packet& p = queue_.front();
      // A full device queue on the receiving side drops the packet (TCP resends).
      [[maybe_unused]] const ssize_t w = write(fds_[static_cast<size_t>(p.to)], p.bytes.data(), p.len);
      if (stats_ && !p.pure_ack) held_.push_back(now_ns() - (p.due - delay_ns_));  // data's hold
      spare_.push_back(std::move(p.bytes));
      queue_.pop_front();
    }
  }

  void read_all() {
    for (;;) {
      std::vector<unsigned char> buf;
      if (spare_.empty()) {
        buf.resize(kMaxPacket);
      } else {
        buf = std::move(spare_.back());
        spare_.pop_back();
      }
      const ssize_t n = read(fds_[self_], buf.data(), buf.size());
      const int64_t now = now_ns();
      if (n <= 0) {
        spare_.push_back(std::move(buf));
        return;
      }
      // IPv4 only: the destination address is at bytes 16..19.
      int to = -1;
      if (n >= 20 && (buf[0] >> 4) == 4 && queue_.size() < kMaxQueued) {
        uint32_t dst = 0;
        std::memcpy(&dst, buf.data() + 16, 4);
        for (size_t j = 0; j < addrs_.size(); ++j)
          if (addrs_[j] == dst && j != self_) to = static_cast<int>(j);
      }
      if (to < 0) {
        spare_.push_back(std::move(buf));
        continue;
      }
      const bool ack = is_pure_ack(buf.data(), static_cast<size_t>(n));
      queue_.push_back(Packet{now + delay_ns_, to, ack, static_cast<size_t>(n), std::move(buf)});
    }
  }

  void dump() {
    if (held_.empty()) return;
    std::sort(held_.begin(), held_.end());
    const size_t n = held_.size();
    std::fprintf(stderr,
                 "tessera_rig_wire: device %zu: %zu packets held (us): p10 %.1f median %.1f p90 %.1f max %.1f\n", self_,
                 n, static_cast<double>(held_[n / 10]) / 1e3, static_cast<double>(held_[n / 2]) / 1e3,
                 static_cast<double>(held_[n * 9 / 10]) / 1e3, static_cast<double>(held_.back()) / 1e3);
    held_.clear();
  }

  size_t self_;
  const std::vector<int>& fds_;
  const std::vector<uint32_t>& addrs_;
  int64_t delay_ns_;
  bool stats_;
  std::deque<Packet> queue_;
  std::vector<std::vector<unsigned char>> spare_;  // buffers of sent packets, reused
  int64_t over_avg_ = 0, early_ = kMargin;
  unsigned dumps_seen_ = 0;
  std::vector<int64_t> held_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: tessera_rig_wire DELAY_US READY_FILE NETNS_PATH=ADDR[@CPU] ...\n");
    return 2;
  }
  char* end = nullptr;
  const long delay_us = std::strtol(argv[1], &end, 10);
  if (*end != '\0' || delay_us < 0 || delay_us > 1000000) {
    std::fprintf(stderr, "tessera_rig_wire: DELAY_US must be an integer from 0 to 1000000, got '%s'\n", argv[1]);
    return 2;
  }
  const int64_t delay_ns = static_cast<int64_t>(delay_us) * 1000;
  std::vector<int> fds, cpus;
  std::vector<uint32_t> addrs;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    const auto eq = a.find('=');
    bool ok = eq != std::string::npos;
    std::string addr = ok ? a.substr(eq + 1) : "";
    int cpu = -1;
    if (const auto at = addr.find('@'); ok && at != std::string::npos) {
      const std::string c = addr.substr(at + 1);
      addr.resize(at);
      char* e = nullptr;
      const long v = std::strtol(c.c_str(), &e, 10);
      ok = !c.empty() && *e == '\0' && v >= 0 && v < CPU_SETSIZE;
      cpu = static_cast<int>(v);
    }
    in_addr ip{};
    if (!ok || inet_pton(AF_INET, addr.c_str(), &ip) != 1) {
      std::fprintf(stderr, "tessera_rig_wire: expected NETNS_PATH=IPV4_ADDR[@CPU], got '%s'\n", argv[i]);
      return 2;
    }
    fds.push_back(attach(a.substr(0, eq)));
    addrs.push_back(ip.s_addr);
    cpus.push_back(cpu);
  }
  const char* st = std::getenv("RIG_WIRE_STATS");
  const bool stats = st && std::strcmp(st, "1") == 0;
  if (stats) {
    struct sigaction sa {};
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, nullptr);
  }
  // Threads made below inherit both (glibc's default PTHREAD_INHERIT_SCHED).
  if (prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL) != 0) std::perror("tessera_rig_wire: timer slack");
  sched_param sp{};
  sp.sched_priority = 10;
  if (sched_setscheduler(0, SCHED_FIFO, &sp) != 0) std::perror("tessera_rig_wire: SCHED_FIFO (delay less exact)");
  std::vector<std::unique_ptr<Sender>> senders;
  for (size_t i = 0; i < fds.size(); ++i) senders.push_back(std::make_unique<Sender>(i, fds, addrs, delay_ns, stats));
  std::vector<std::thread> threads;
  // Runs device i's forwarding on this thread, on its CPU when it has one.
  auto serve = [&senders, &cpus](size_t i) {
    if (cpus[i] >= 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpus[i], &set);
      if (sched_setaffinity(0, sizeof set, &set) != 0) die("cannot run on CPU " + std::to_string(cpus[i]));
    }
    senders[i]->run();
  };
  for (size_t i = 1; i < senders.size(); ++i) threads.emplace_back(serve, i);
  {
    const int r = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (r < 0) die(std::string("cannot create ") + argv[2]);
    close(r);
  }
  serve(0);
}
