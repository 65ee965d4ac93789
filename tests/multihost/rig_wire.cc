// The rig's delayed wire (tests/multihost/rig.sh, RIG_DELAY_US): a fixed
// one-way delay on every link between the test hosts.
//
// This kernel has no time-based qdisc (sch_netem, sch_fq, sch_etf are not
// built and cannot be loaded; "Specified qdisc kind is unknown"), so no
// tc/BPF setup can hold a packet for a while. Instead each host's eth0 is a
// TUN device and this process is the wire between them: it reads every IPv4
// packet a host sends, and writes it to the host that owns the destination
// address DELAY microseconds after it read it. One FIFO suffices: every
// packet is held for the same time, so the deadlines come in arrival order.
//
//   tessera_rig_wire DELAY_US READY_FILE NETNS_PATH=ADDR ...
//
// Each NETNS_PATH (/run/netns/NAME) must hold a persistent TUN device named
// eth0 (`ip tuntap add dev eth0 mode tun`) with address ADDR. READY_FILE is
// created once every device is attached. It runs until killed. To keep the
// delay fixed on a loaded machine it asks for SCHED_FIFO and a 1 ns timer
// slack (both best effort: it says so on stderr when it cannot).
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <string>
#include <vector>

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
  std::vector<unsigned char> bytes;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: tessera_rig_wire DELAY_US READY_FILE NETNS_PATH=ADDR ...\n");
    return 2;
  }
  char* end = nullptr;
  const long delay_us = std::strtol(argv[1], &end, 10);
  if (*end != '\0' || delay_us < 0 || delay_us > 1000000) {
    std::fprintf(stderr, "tessera_rig_wire: DELAY_US must be an integer from 0 to 1000000, got '%s'\n", argv[1]);
    return 2;
  }
  const int64_t delay_ns = static_cast<int64_t>(delay_us) * 1000;
  std::vector<int> fds;
  std::vector<uint32_t> addrs;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    const auto eq = a.find('=');
    in_addr ip{};
    if (eq == std::string::npos || inet_pton(AF_INET, a.substr(eq + 1).c_str(), &ip) != 1) {
      std::fprintf(stderr, "tessera_rig_wire: expected NETNS_PATH=IPV4_ADDR, got '%s'\n", argv[i]);
      return 2;
    }
    fds.push_back(attach(a.substr(0, eq)));
    addrs.push_back(ip.s_addr);
  }
  if (prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL) != 0) std::perror("tessera_rig_wire: timer slack");
  sched_param sp{};
  sp.sched_priority = 10;
  if (sched_setscheduler(0, SCHED_FIFO, &sp) != 0) std::perror("tessera_rig_wire: SCHED_FIFO (delay less exact)");
  {
    const int r = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (r < 0) die(std::string("cannot create ") + argv[2]);
    close(r);
  }

  std::vector<pollfd> pfds(fds.size());
  for (size_t i = 0; i < fds.size(); ++i) pfds[i] = pollfd{fds[i], POLLIN, 0};
  std::deque<Packet> queue;
  std::vector<std::vector<unsigned char>> spare;  // buffers of sent packets, reused
  constexpr size_t kMaxQueued = 8192;             // beyond this the wire drops, as a full queue does
  constexpr size_t kMaxPacket = 65536;
  for (;;) {
    int64_t now = now_ns();
    while (!queue.empty() && queue.front().due <= now) {
      Packet& p = queue.front();
      // A full device queue on the receiving side drops the packet (TCP resends).
      [[maybe_unused]] const ssize_t w = write(fds[static_cast<size_t>(p.to)], p.bytes.data(), p.bytes.size());
      spare.push_back(std::move(p.bytes));
      queue.pop_front();
    }
    timespec ts{};
    timespec* tsp = nullptr;
    if (!queue.empty()) {
      const int64_t left = queue.front().due - now;
      ts.tv_sec = static_cast<time_t>(left / 1000000000);
      ts.tv_nsec = static_cast<long>(left % 1000000000);
      tsp = &ts;
    }
    if (ppoll(pfds.data(), pfds.size(), tsp, nullptr) < 0 && errno != EINTR) die("poll");
    now = now_ns();
    for (auto& pf : pfds) {
      if ((pf.revents & POLLIN) == 0) continue;
      for (;;) {
        std::vector<unsigned char> buf;
        if (!spare.empty()) {
          buf = std::move(spare.back());
          spare.pop_back();
        }
        buf.resize(kMaxPacket);
        const ssize_t n = read(pf.fd, buf.data(), buf.size());
        if (n <= 0) {
          spare.push_back(std::move(buf));
          break;
        }
        buf.resize(static_cast<size_t>(n));
        // IPv4 only: the destination address is at bytes 16..19.
        if (n < 20 || (buf[0] >> 4) != 4 || queue.size() >= kMaxQueued) {
          spare.push_back(std::move(buf));
          continue;
        }
        uint32_t dst = 0;
        std::memcpy(&dst, buf.data() + 16, 4);
        int to = -1;
        for (size_t j = 0; j < addrs.size(); ++j)
          if (addrs[j] == dst) to = static_cast<int>(j);
        if (to < 0) {
          spare.push_back(std::move(buf));
          continue;
        }
        queue.push_back(Packet{now + delay_ns, to, std::move(buf)});
      }
    }
  }
}
