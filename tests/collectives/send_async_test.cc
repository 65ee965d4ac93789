// Communicator::send_async, the pipeline stages' sends: exact values, in
// order, with both sides sending messages larger than the transports'
// buffering before receiving (blocking sends would deadlock).
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

class SendAsync : public ::testing::TestWithParam<TransportKind> {};

// send_async on a communicator per direction: both ranks send several large
// messages before receiving any (blocking sends would wait for each other
// forever); they arrive in order with exact values.
TEST_P(SendAsync, OneCommunicatorPerDirection) {
  const TransportKind kind = GetParam();
  auto res = run_ranks(2, [kind](int rank, int size, std::shared_ptr<Store> store) {
    CommOptions o;
    o.transport = kind;
    auto world = Communicator::create(std::move(store), rank, size, o);
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

INSTANTIATE_TEST_SUITE_P(Transports, SendAsync, ::testing::Values(TransportKind::Shm, TransportKind::Tcp),
                         [](const auto& info) { return std::string(transport_name(info.param)); });

}  // namespace
}  // namespace tessera::collectives
