// The TCP transport on its own: forked ranks on loopback, exact payloads,
// protocol errors, a dead peer and a timeout; the address a rank advertises
// across hosts, in a network namespace of its own.
#include "collectives/tcp/tcp_transport.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/store.h"
#include "runtime/dtype.h"
#include "runtime/error.h"
#include "tests/bench/rank_fork.h"
#include "tests/test_timeouts.h"
#include "tests/timing_gate.h"

namespace tessera::collectives {
namespace {

class TcpTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tessera-tcp-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::unique_ptr<Transport> make(int rank, int size, int timeout_ms = 20000, const std::string& prefix = "") {
    CommOptions o;
    o.transport = TransportKind::Tcp;
    o.timeout = std::chrono::milliseconds(timeout_ms);
    o.name = "tcp-test";
    return tcp::create_transport(std::make_shared<PrefixStore>(make_file_store(dir_), prefix), rank, size, o);
  }
  std::string dir_;
};

uint8_t byte_of(int src, size_t i) {
  return static_cast<uint8_t>((static_cast<size_t>(src) * 131 + i * 7 + (i >> 13)) & 0xff);
}

TEST_F(TcpTransportTest, RingSendrecvDeliversExactBytes) {
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE("ranks " + std::to_string(n));
    // Not a multiple of the transport's chunk size, and large enough to stream.
    const size_t bytes = (size_t{2} << 20) + 5;
    auto codes = test::run_ranks(n, [&](int r) {
      auto t = make(r, n, 20000, "n" + std::to_string(n) + "/");
      std::vector<uint8_t> s(bytes), rbuf(bytes, 0);
      for (size_t i = 0; i < bytes; ++i) s[i] = byte_of(r, i);
      int to = (r + 1) % n, from = (r + n - 1) % n;
      for (int round = 0; round < 2; ++round) {
        std::fill(rbuf.begin(), rbuf.end(), 0);
        t->sendrecv(to, s.data(), bytes, from, rbuf.data(), bytes, static_cast<uint32_t>(round));
        for (size_t i = 0; i < bytes; ++i)
          if (rbuf[i] != byte_of(from, i)) return false;
        // Every peer still has rounds to go, so none can have exited yet.
        if (round == 0 && !(t->peer_alive(to) && t->peer_alive(from))) return false;
      }
      // Zero-byte messages and blocking send/recv (even ranks send first).
      t->sendrecv(to, nullptr, 0, from, nullptr, 0, 99);
      if (r % 2 == 0) {
        t->send(to, 5, s.data(), 1000);
        t->recv(from, 5, rbuf.data(), 1000);
      } else {
        t->recv(from, 5, rbuf.data(), 1000);
        t->send(to, 5, s.data(), 1000);
      }
      for (size_t i = 0; i < 1000; ++i)
        if (rbuf[i] != byte_of(from, i)) return false;
      return true;
    });
    for (int r = 0; r < n; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
  }
}

// Collects fragments; checks they arrive in order and cover the message once.
class CopySink final : public RecvSink {
 public:
  explicit CopySink(std::vector<uint8_t>& out) : out_(out) {}
  void consume(size_t off, const void* data, size_t bytes) override {
    if (off != next_) ok_ = false;
    std::memcpy(out_.data() + off, data, bytes);
    next_ = off + bytes;
    ++fragments_;
  }
  bool ok(size_t total) const { return ok_ && next_ == total; }
  int fragments() const { return fragments_; }

 private:
  std::vector<uint8_t>& out_;
  size_t next_ = 0;
  bool ok_ = true;
  int fragments_ = 0;
};

TEST_F(TcpTransportTest, SinkReceivesFragmentsInOrder) {
  for (int n : {2, 3}) {
    SCOPED_TRACE("ranks " + std::to_string(n));
    auto codes = test::run_ranks(n, [&](int r) {
      auto t = make(r, n, 20000, "sink" + std::to_string(n) + "/");
      int to = (r + 1) % n, from = (r + n - 1) % n;
      for (size_t bytes : {size_t{0}, size_t{8}, (size_t{5} << 20) + 24}) {
        std::vector<uint8_t> s(bytes), got(bytes, 0);
        for (size_t i = 0; i < bytes; ++i) s[i] = byte_of(r, i);
        CopySink sink(got);
        t->sendrecv_sink(to, s.data(), bytes, from, bytes, sink, 3);
        if (!sink.ok(bytes)) return false;
        if (bytes > (size_t{1} << 20) && sink.fragments() < 2) return false;  // really fragment-wise
        for (size_t i = 0; i < bytes; ++i)
          if (got[i] != byte_of(from, i)) return false;
      }
      // A plain sendrecv right after a sink one stays in step.
      std::vector<uint8_t> s(100), got(100);
      for (size_t i = 0; i < 100; ++i) s[i] = byte_of(r, i);
      t->sendrecv(to, s.data(), 100, from, got.data(), 100, 4);
      for (size_t i = 0; i < 100; ++i)
        if (got[i] != byte_of(from, i)) return false;
      return true;
    });
    for (int r = 0; r < n; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
  }
}

// A sink that throws: the reading thread calls it (large messages), so its
// exception crosses to the caller. sendrecv_sink rethrows the sink's own
// exception, later calls fail at once, and the peer fails fast (told why),
// not at the timeout.
class ThrowingSink final : public RecvSink {
 public:
  void consume(size_t off, const void*, size_t) override {
    if (off > 0) throw std::runtime_error("sink refuses offset " + std::to_string(off));
  }
};

TEST_F(TcpTransportTest, ThrowingSinkFailsTheReceiveWithItsOwnException) {
  auto codes = test::run_ranks(2, [&](int r) {
    auto t = make(r, 2, /*timeout_ms=*/60000, "throw/");
    const size_t bytes = size_t{3} << 20;  // several fragments
    std::vector<uint8_t> s(bytes, 1), got(bytes);
    const auto t0 = std::chrono::steady_clock::now();
    auto fast = [&] { return std::chrono::steady_clock::now() - t0 < test_time::scaled(std::chrono::seconds(10)); };
    if (r == 1) {
      ThrowingSink sink;
      try {
        t->sendrecv_sink(0, s.data(), bytes, 0, bytes, sink, 1);
        return false;
      } catch (const std::runtime_error& e) {
        if (dynamic_cast<const TransportError*>(&e) || std::string(e.what()).find("refuses") == std::string::npos)
          return false;
      }
      try {
        t->send(0, 2, s.data(), 8);
        return false;
      } catch (const TransportError&) {
      }
      return fast();
    }
    // Rank 0 receives into a sink that takes everything; its peer fails
    // mid-message, which fails this receive (or the send) well before the
    // timeout.
    CopySink sink(got);
    try {
      t->sendrecv_sink(1, s.data(), bytes, 1, bytes, sink, 1);
      std::vector<uint8_t> more(8);
      t->recv(1, 2, more.data(), more.size());
      return false;
    } catch (const TransportError& e) {
      return e.peer() == 1 && fast();
    }
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

// The ring's reduce-scatter over TCP reduces each fragment in the reading
// thread (ReduceSink): all-reduce of an odd count for every dtype and op,
// out of place and in place, against the exact serial result. With 2 ranks
// the 4- and 8-byte dtypes' blocks are a whole 1 MiB fragment (written with
// streaming stores out of place) and a partial one; 2-byte dtypes and 3
// ranks have only partial fragments.
double all_reduce_input(int rank, size_t i) {
  return static_cast<double>((static_cast<size_t>(rank) * 7 + i * 3 + (i >> 9)) % 5) - 1.0;
}

// Every value here is a small integer or half of one, exact in f32, so f32
// is the go-between for every dtype (runtime/dtype.h's convert rounds as a
// store into that dtype would).
std::vector<float> as_f32(DType dt, const void* buf, size_t n) {
  std::vector<float> out(n);
  convert(buf, dt, out.data(), DType::F32, n);
  return out;
}

TEST_F(TcpTransportTest, RingAllReduceReducingInTheReadingThreadIsExact) {
  const size_t n = 655365;
  for (int p : {2, 3}) {
    SCOPED_TRACE("ranks " + std::to_string(p));
    auto codes = test::run_ranks(p, [&](int r) {
      CommOptions o;
      o.transport = TransportKind::Tcp;
      o.timeout = std::chrono::milliseconds(60000);
      o.name = "tcp-ring";
      auto c =
          Communicator::create(std::make_shared<PrefixStore>(make_file_store(dir_), "ar" + std::to_string(p)), r, p, o);
      for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64}) {
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg}) {
          // Inputs are small integers, so every result but a float average
          // over 3 ranks is exact in every dtype.
          if (op == ReduceOp::Avg && p == 3 && is_floating(dt)) continue;
          for (bool inplace : {false, true}) {
            std::vector<unsigned char> send(n * dtype_size(dt)), recv(n * dtype_size(dt));
            std::vector<float> in(n), want(n);
            for (size_t i = 0; i < n; ++i) in[i] = static_cast<float>(all_reduce_input(r, i));
            convert(in.data(), DType::F32, send.data(), dt, n);
            if (inplace) recv = send;
            c->all_reduce(inplace ? recv.data() : send.data(), recv.data(), n, dt, op);
            if (c->last_algorithm() != "ring") {
              std::fprintf(stderr, "served by %s\n", c->last_algorithm().c_str());
              return false;
            }
            for (size_t i = 0; i < n; ++i) {
              double w = all_reduce_input(0, i);
              for (int j = 1; j < p; ++j) {
                const double v = all_reduce_input(j, i);
                w = op == ReduceOp::Prod  ? w * v
                    : op == ReduceOp::Min ? std::min(w, v)
                    : op == ReduceOp::Max ? std::max(w, v)
                                          : w + v;
              }
              if (op == ReduceOp::Avg) w = is_floating(dt) ? w / p : std::trunc(w / p);
              want[i] = static_cast<float>(w);
            }
            // The expected values as stored in dt, read back like the result.
            std::vector<unsigned char> stored(n * dtype_size(dt));
            convert(want.data(), DType::F32, stored.data(), dt, n);
            const std::vector<float> got = as_f32(dt, recv.data(), n), exact = as_f32(dt, stored.data(), n);
            for (size_t i = 0; i < n; ++i)
              if (got[i] != exact[i]) {
                std::fprintf(stderr, "%s %s%s element %zu: %g, expected %g\n", dtype_name(dt), reduce_op_name(op),
                             inplace ? " in place" : "", i, got[i], exact[i]);
                return false;
              }
          }
        }
      }
      return true;
    });
    for (int r = 0; r < p; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
  }
}

// Small messages (at most 64 KiB) are written by the caller and read ahead
// into the connection's eager buffer. Rank 0 sends a run of them (and one
// large one between) before rank 1 posts anything, then exits at once: rank
// 1 still receives every one, exactly and in order, by recv and by sink,
// after the peer is gone; the next recv names the dead peer; a recv whose
// size differs from a read-ahead message is a protocol error.
TEST_F(TcpTransportTest, SmallMessagesReadAheadSurviveTheSenderExiting) {
  TESSERA_TIMING_TEST();  // a 300 ms sleep stands for "the reader got there first"
  const std::vector<size_t> sizes = {1, 64, 4096, size_t{64} << 10, (size_t{3} << 20) + 1, 8, 0, 100};
  auto codes = test::run_ranks(2, [&](int r) {
    auto t = make(r, 2, 20000, "eager/");
    if (r == 0) {
      for (size_t k = 0; k < sizes.size(); ++k) {
        std::vector<uint8_t> s(sizes[k]);
        for (size_t i = 0; i < s.size(); ++i) s[i] = byte_of(static_cast<int>(k), i);
        t->send(1, static_cast<uint32_t>(k), s.data(), s.size());
      }
      return true;  // exits (closing its connections) right after the last send
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // everything sent, rank 0 gone
    for (size_t k = 0; k < sizes.size(); ++k) {
      std::vector<uint8_t> got(sizes[k], 0);
      if (k % 2 == 0) {
        t->recv(0, static_cast<uint32_t>(k), got.data(), got.size());
      } else {
        CopySink sink(got);
        t->recv_sink(0, got.size(), sink, static_cast<uint32_t>(k));
        if (!sink.ok(got.size())) return false;
      }
      for (size_t i = 0; i < got.size(); ++i)
        if (got[i] != byte_of(static_cast<int>(k), i)) return false;
    }
    try {
      std::vector<uint8_t> more(8);
      t->recv(0, 99, more.data(), more.size());
      return false;
    } catch (const TransportError& e) {
      return e.kind() == TransportError::Kind::PeerDead && e.peer() == 0;
    }
  });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
  codes = test::run_ranks(2, [&](int r) {
    auto t = make(r, 2, 20000, "eager-mismatch/");
    std::vector<uint8_t> buf(1000);
    if (r == 0) {
      try {
        t->send(1, 1, buf.data(), 1000);
        std::vector<uint8_t> ack(1);
        t->recv(1, 2, ack.data(), 1);  // fails: rank 1 rejects the message
      } catch (const TransportError&) {
      }
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // read ahead by now
    try {
      t->recv(0, 1, buf.data(), 999);
      return false;
    } catch (const TransportError& e) {
      return e.kind() == TransportError::Kind::Protocol && std::string(e.what()).find("999") != std::string::npos;
    }
  });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
}

TEST(TcpSocketBuffers, AutotuningByDefaultAndABadValueIsRefused) {
  ::unsetenv("TESSERA_TCP_SOCKBUF");
  EXPECT_EQ(tcp::socket_buffer_bytes(), 0);
  ::setenv("TESSERA_TCP_SOCKBUF", "1048576", 1);
  EXPECT_EQ(tcp::socket_buffer_bytes(), 1048576);
  for (const char* bad : {"4M", "-1", "abc", "99999999999"}) {
    ::setenv("TESSERA_TCP_SOCKBUF", bad, 1);
    EXPECT_THROW(tcp::socket_buffer_bytes(), InvalidArgument) << bad;
  }
  ::unsetenv("TESSERA_TCP_SOCKBUF");
}

TEST_F(TcpTransportTest, TagOrSizeMismatchIsAProtocolError) {
  auto codes = test::run_ranks(2, [&](int r) {
    auto t = make(r, 2);
    std::vector<char> buf(64);
    if (r == 0) {
      // The peer may reject the message and shut down before this send
      // returns; either outcome is right for the sender.
      try {
        t->send(1, 1, buf.data(), 64);
      } catch (const TransportError&) {
      }
      return true;
    }
    try {
      t->recv(0, 2, buf.data(), 64);
    } catch (const TransportError& e) {
      return e.kind() == TransportError::Kind::Protocol && e.peer() == 0;
    }
    return false;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST_F(TcpTransportTest, DeadPeerFailsFastNotAtTheTimeout) {
  auto codes = test::run_ranks(3, [&](int r) {
    auto t = make(r, 3, /*timeout_ms=*/60000);
    if (r == 2) _exit(0);  // exits without a word, mid-job
    std::vector<char> buf(1 << 20);
    auto t0 = std::chrono::steady_clock::now();
    try {
      t->recv(2, 0, buf.data(), buf.size());
    } catch (const TransportError& e) {
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      bool named = std::string(e.what()).find("rank 2") != std::string::npos;
      return e.peer() == 2 && named && s < test_time::seconds(5.0) && !t->peer_alive(2);
    }
    return false;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 0}));
}

// A peer that dies mid-message: rank 1 is a stand-in speaking the wire
// protocol on raw sockets (tcp_transport.cc: the higher rank connects twice,
// hello {kHello, rank, channel}; a message is {kind, tag, bytes} then the
// payload). It sends a header for 64 KiB and 1000 bytes of payload, waits
// until rank 0 is inside its recv, and is SIGKILLed. Rank 0's recv must
// fail at once (long before its 60 s timeout) with PeerDead naming rank 1;
// with the caller reading the socket itself and with the reading thread forced.
TEST_F(TcpTransportTest, PeerKilledMidMessageFailsTheWaitingCallerPromptly) {
  for (const char* thread : {"0", "1"}) {
    SCOPED_TRACE(std::string("TESSERA_TCP_READER_THREAD=") + thread);
    const std::string prefix = std::string("mid") + thread + "/";
    auto codes = test::run_ranks(2, [&](int r) {
      if (r == 0) {
        ::setenv("TESSERA_TCP_READER_THREAD", thread, 1);
        auto t = make(0, 2, 60000, prefix);
        std::vector<uint8_t> buf(size_t{64} << 10);
        const auto t0 = std::chrono::steady_clock::now();
        try {
          t->recv(1, 5, buf.data(), buf.size());
        } catch (const TransportError& e) {
          const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          const std::string what = e.what();
          std::fprintf(stderr, "rank 0 after %.3f s: %s\n", s, what.c_str());
          return e.kind() == TransportError::Kind::PeerDead && e.peer() == 1 &&
                 what.find("rank 1") != std::string::npos && s < test_time::seconds(5.0) && !t->peer_alive(1);
        }
        return false;
      }
      PrefixStore store(make_file_store(dir_), prefix);
      const std::string ep = store.get("tcp/ep/0", std::chrono::seconds(20));
      const int port = std::stoi(ep.substr(ep.find(' ') + 1));
      int fds[2];
      for (uint32_t channel : {0u, 1u}) {
        fds[channel] = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(static_cast<uint16_t>(port));
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (::connect(fds[channel], reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return false;
        const uint32_t hello[3] = {0x7e55e110, 1, channel};
        if (::write(fds[channel], hello, sizeof hello) != sizeof hello) return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rank 0 is in its recv by now
      struct {
        uint32_t kind, tag;
        uint64_t bytes;
      } h{0x7e55d47a, 5, size_t{64} << 10};
      std::vector<uint8_t> part(1000, 7);
      if (::write(fds[0], &h, sizeof h) != sizeof h || ::write(fds[0], part.data(), part.size()) != 1000) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // rank 0 read the start
      ::raise(SIGKILL);
      return false;
    });
    EXPECT_EQ(codes[0], 0);
    EXPECT_EQ(codes[1], 128 + SIGKILL);
  }
}

TEST_F(TcpTransportTest, StuckPeerTimesOutAndLaterCallsFailAtOnce) {
  auto codes = test::run_ranks(2, [&](int r) {
    auto t = make(r, 2, /*timeout_ms=*/800);
    std::vector<char> buf(128);
    if (r == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // never sends
      return true;
    }
    try {
      t->recv(1, 0, buf.data(), buf.size());
    } catch (const TransportError& e) {
      if (e.kind() != TransportError::Kind::Timeout || e.peer() != 1) return false;
    }
    auto t0 = std::chrono::steady_clock::now();
    try {
      t->send(1, 0, buf.data(), buf.size());
    } catch (const TransportError&) {
      return std::chrono::steady_clock::now() - t0 < test_time::scaled(std::chrono::milliseconds(200));
    }
    return false;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST_F(TcpTransportTest, AbortWakesAWaiter) {
  auto codes = test::run_ranks(2, [&](int r) {
    auto t = make(r, 2, 30000);
    std::vector<char> buf(128);
    if (r == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      return true;
    }
    std::thread killer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      t->abort("test");
    });
    bool ok = false;
    try {
      t->recv(1, 0, buf.data(), buf.size());
    } catch (const TransportError& e) {
      ok = e.kind() == TransportError::Kind::Aborted && t->aborted();
    }
    killer.join();
    return ok;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

// The address a rank spanning hosts advertises, without DNS: a child in a
// network and UTS namespace of its own (root only; skipped elsewhere) whose
// interfaces are lo and a0 (10.9.0.1/24), with a host name that resolves
// nowhere. Each check prints what it got when it fails.
TEST(TcpAddress, ChosenWithoutDns) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(60);
    if (unshare(CLONE_NEWNET | CLONE_NEWUTS) != 0) _exit(77);
    const char name[] = "tessera-nodns-probe";
    if (sethostname(name, sizeof name - 1) != 0) _exit(77);
    if (std::system("ip link set lo up && ip link add a0 type veth peer name b0 && ip addr add 10.9.0.1/24 dev a0 && "
                    "ip link set a0 up && ip link set b0 up") != 0)
      _exit(77);
    for (const char* v : {"TESSERA_TCP_ADDR", "TESSERA_SOCKET_IFNAME", "OMPI_MCA_orte_hnp_uri"}) unsetenv(v);
    int bad = 0;
    auto check = [&bad](bool ok, const std::string& what, const std::string& got) {
      if (!ok) std::fprintf(stderr, "FAILED: %s; got '%s'\n", what.c_str(), got.c_str()), ++bad;
    };
    auto choose = [](const std::vector<std::string>& toward) {
      try {
        return tcp::advertised_address(true, toward);
      } catch (const InvalidArgument& e) {
        return std::string("error: ") + e.what();
      }
    };
    auto has = [](const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; };
    check(tcp::advertised_address(false) == "127.0.0.1", "one host: loopback", tcp::advertised_address(false));
    std::string a = choose({"10.9.0.7"});
    check(a == "10.9.0.1", "the interface toward the coordinator", a);
    a = choose({"no-such-host.invalid", "10.9.0.7"});
    check(a == "10.9.0.1", "the first coordinator address with a route", a);
    a = choose({"10.200.0.1"});
    check(has(a, "error: ") && has(a, "(1) the interface toward the job's coordinator 10.200.0.1: no route") &&
              has(a, "(2) the host name 'tessera-nodns-probe'") && has(a, "TESSERA_SOCKET_IFNAME"),
          "nothing works: the error lists what was tried", a);
    a = choose({});
    check(has(a, "no coordinator address was given and this is not an mpirun job"), "no hint: said so", a);
    setenv("OMPI_MCA_orte_hnp_uri", "1192886272.0;tcp://10.200.0.1,10.9.0.254:55293;tcp6://[fd00::2]:45121", 1);
    const auto oob = tcp::mpirun_oob_addresses();
    check(oob == std::vector<std::string>{"10.200.0.1", "10.9.0.254"}, "mpirun's out-of-band addresses",
          oob.empty() ? "" : oob.front() + " ... (" + std::to_string(oob.size()) + ")");
    a = choose({});
    check(a == "10.9.0.1", "under mpirun: the interface toward mpirun", a);
    unsetenv("OMPI_MCA_orte_hnp_uri");
    for (auto [spec, want] : std::vector<std::pair<std::string, std::string>>{{"a0", "10.9.0.1"},
                                                                              {"a", "10.9.0.1"},
                                                                              {"=a0", "10.9.0.1"},
                                                                              {"lo", "127.0.0.1"},
                                                                              {"^lo", "10.9.0.1"},
                                                                              {"eth,a0", "10.9.0.1"}}) {
      setenv("TESSERA_SOCKET_IFNAME", spec.c_str(), 1);
      a = choose({"10.200.0.1"});
      // NOLINTNEXTLINE(performance-inefficient-string-concatenation): a test message
      check(a == want, "TESSERA_SOCKET_IFNAME=" + spec + " -> " + want, a);
    }
    for (const char* spec : {"=a", "^lo,a", "eth"}) {
      setenv("TESSERA_SOCKET_IFNAME", spec, 1);
      a = choose({"10.9.0.7"});
      check(has(a, std::string("no interface matches TESSERA_SOCKET_IFNAME='") + spec + "'") && has(a, "a0 10.9.0.1"),
            std::string("TESSERA_SOCKET_IFNAME=") + spec + ": refused, listing the interfaces", a);
    }
    setenv("TESSERA_TCP_ADDR", "10.1.2.3", 1);
    a = choose({"10.9.0.7"});
    check(a == "10.1.2.3", "TESSERA_TCP_ADDR wins", a);
    std::fflush(nullptr);
    _exit(bad == 0 ? 0 : 1);
  }
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st)) << "signal " << WTERMSIG(st);
  if (WEXITSTATUS(st) == 77) GTEST_SKIP() << "needs root with network namespaces and `ip` (unshare failed)";
  EXPECT_EQ(WEXITSTATUS(st), 0) << "see the FAILED lines above";
}

}  // namespace
}  // namespace tessera::collectives
