// Communicator::sendrecv and send_async, the pipeline stages' exchanges. sendrecv: exact values, both
// halves at once with messages larger than the transports' buffering (so a
// send-then-recv order on both sides would deadlock), one-sided halves, and a
// sendrecv matched by a plain recv and send on the peer.
#include <gtest/gtest.h>

#include <vector>

#include "collectives/communicator.h"
#include "tests/collectives/fork_harness.h"

namespace tessera::collectives {
namespace {

using test::failures;
using test::run_ranks;

// Larger than the shared-memory slots (about 4 MiB split among the peers) and
// a socket buffer: neither side's send can complete before the peer receives.
constexpr size_t kBig = (size_t{1} << 20) + 5;

std::vector<float> pattern(int rank, size_t n, int salt) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(rank * 1000 + salt) + static_cast<float>(i % 997);
  return v;
}

void expect_pattern(const std::vector<float>& got, int rank, int salt, const char* what) {
  const std::vector<float> want = pattern(rank, got.size(), salt);
  for (size_t i = 0; i < got.size(); ++i)
    COLL_REQUIRE(got[i] == want[i], what, " element ", i, " got ", got[i], " want ", want[i]);
}

class SendRecv : public ::testing::TestWithParam<TransportKind> {};

TEST_P(SendRecv, ExchangesExactValues) {
  const TransportKind kind = GetParam();
  auto res = run_ranks(4, [kind](int rank, int size, std::shared_ptr<Store> store) {
    CommOptions o;
    o.transport = kind;
    auto c = Communicator::create(store, rank, size, o);
    // Pairs (0,1), (2,3) exchange with each other at once.
    const int mate = rank ^ 1;
    std::vector<float> out = pattern(rank, kBig, 1), in(kBig);
    c->sendrecv(out.data(), out.size(), mate, in.data(), in.size(), mate, DType::F32, 5);
    expect_pattern(in, mate, 1, "pairwise");
    // A ring: send to next, receive from prev, different sizes per direction.
    const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    std::vector<float> o2 = pattern(rank, kBig + static_cast<size_t>(rank), 2);
    std::vector<float> i2(kBig + static_cast<size_t>(prev));
    c->sendrecv(o2.data(), o2.size(), next, i2.data(), i2.size(), prev, DType::F32, 6);
    expect_pattern(i2, prev, 2, "ring");
    // One-sided halves against plain send/recv: 0 -> 1 (send half only), 1 <- 0 (recv half only).
    std::vector<float> o3 = pattern(rank, 7, 3), i3(7);
    if (rank == 0) c->sendrecv(o3.data(), o3.size(), 1, nullptr, 0, -1, DType::F32, 7);
    if (rank == 1) c->sendrecv(nullptr, 0, -1, i3.data(), i3.size(), 0, DType::F32, 7);
    if (rank == 1) expect_pattern(i3, 0, 3, "one-sided");
    // GPipe's turn: rank 2 sends forward and waits for the gradient in one
    // sendrecv while rank 3 receives, computes, then sends back.
    std::vector<float> o4 = pattern(rank, kBig, 4), i4(kBig);
    if (rank == 2) {
      c->sendrecv(o4.data(), o4.size(), 3, i4.data(), i4.size(), 3, DType::F32, 8);
      expect_pattern(i4, 3, 4, "sendrecv vs recv+send");
    } else if (rank == 3) {
      c->recv(i4.data(), i4.size(), DType::F32, 2, 8);
      expect_pattern(i4, 2, 4, "recv of sendrecv");
      c->send(o4.data(), o4.size(), DType::F32, 2, 8);
    }
    // Bad peers are refused.
    bool threw = false;
    try {
      c->sendrecv(o3.data(), 1, rank, i3.data(), 1, mate, DType::F32, 9);
    } catch (const InvalidArgument&) {
      threw = true;
    }
    COLL_REQUIRE(threw, "sendrecv to itself accepted");
    c->barrier();
  });
  EXPECT_EQ(failures(res), "");
}

// send_async on a communicator per direction: both ranks send several large
// messages before receiving any (blocking sends would wait for each other
// forever); they arrive in order with exact values.
TEST_P(SendRecv, SendAsyncOnOneCommunicatorPerDirection) {
  const TransportKind kind = GetParam();
  auto res = run_ranks(2, [kind](int rank, int size, std::shared_ptr<Store> store) {
    CommOptions o;
    o.transport = kind;
    auto world = Communicator::create(store, rank, size, o);
    // "up": 0 sends to 1; "down": 1 sends to 0 (sender first in each).
    auto up = world->split(0, rank, "up");
    auto down = world->split(0, 1 - rank, "down");
    Communicator& out = rank == 0 ? *up : *down;
    Communicator& in = rank == 0 ? *down : *up;
    const int peer_in_out = out.rank() == 0 ? 1 : 0, peer_in_in = in.rank() == 0 ? 1 : 0;
    std::vector<std::vector<float>> sent;
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < 3; ++k) {
      sent.push_back(pattern(rank, kBig, 10 + k));
      works.push_back(out.send_async(sent.back().data(), kBig, DType::F32, peer_in_out, 4));
    }
    std::vector<float> got(kBig);
    for (int k = 0; k < 3; ++k) {
      in.recv(got.data(), kBig, DType::F32, peer_in_in, 4);
      expect_pattern(got, 1 - rank, 10 + k, "send_async message");
    }
    for (auto& w : works) {
      w->wait();
      COLL_REQUIRE(w->done(), "wait() returned but not done");
    }
    bool threw = false;
    try {
      out.send_async(got.data(), 1, DType::F32, out.rank(), 4);
    } catch (const InvalidArgument&) {
      threw = true;
    }
    COLL_REQUIRE(threw, "send_async to itself accepted");
    world->barrier();
  });
  EXPECT_EQ(failures(res), "");
}

INSTANTIATE_TEST_SUITE_P(Transports, SendRecv, ::testing::Values(TransportKind::Shm, TransportKind::Tcp),
                         [](const auto& info) { return std::string(transport_name(info.param)); });

}  // namespace
}  // namespace tessera::collectives
