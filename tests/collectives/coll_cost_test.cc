// Collective costs (collectives/coll_cost.h): predict() against hand-computed
// alpha-beta figures, and against what real communicators charge for the
// same calls (algorithm and modeled seconds), the way train_gpt's groups run
// them: default ring models, buffers in a shared arena or on the stack.
#include "collectives/coll_cost.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "runtime/device.h"
#include "runtime/shm_memory.h"
#include "runtime/topology.h"
#include "tests/collectives/fork_harness.h"

namespace tessera::collectives {
namespace {

using test::failures;
using test::run_ranks;

constexpr double kA = NetModel::kDefaultLinkLatency;    // 2 us per hop
constexpr double kB = NetModel::kDefaultLinkBandwidth;  // 48 GiB/s per link

GroupCostModel ring_group(int p, bool shm) {
  std::vector<int> nodes(static_cast<size_t>(p));
  for (int i = 0; i < p; ++i) nodes[static_cast<size_t>(i)] = i;
  return group_cost_model(NetModel(), nodes, shm);
}

// The one link model (group_cost_model, which the communicator builds its
// own from too): the default ring takes TESSERA_NET_INTRA_HOST's figures,
// and a group spanning hosts pays the instance network between them,
// TESSERA_NET_INTER_HOST's or EFA's 800 Gbps shared by the host's ranks at
// an assumed 10 us.
TEST(CollCost, OneLinkModelWithTheCommunicatorsOverrides) {
  const std::vector<int> nodes = {0, 1, 2, 3}, host_of = {0, 0, 1, 1};
  const double bytes = 1e6;
  {
    const GroupCostModel g = group_cost_model(NetModel(), nodes, false, &host_of, 0);
    EXPECT_NEAR(g.links.time(0, 1, bytes), kA + bytes / kB, 1e-18);
    EXPECT_NEAR(g.links.time(1, 2, bytes), 10e-6 + bytes / (800e9 / 8 / 2), 1e-18);
  }
  ::setenv("TESSERA_NET_INTRA_HOST", "20,10", 1);
  ::setenv("TESSERA_NET_INTER_HOST", "150,1.5", 1);
  const GroupCostModel g = group_cost_model(NetModel(), nodes, false, &host_of, 0);
  const GroupCostModel one_host = group_cost_model(NetModel(), nodes, false);
  ::unsetenv("TESSERA_NET_INTRA_HOST");
  ::unsetenv("TESSERA_NET_INTER_HOST");
  EXPECT_NEAR(g.links.time(0, 1, bytes), 20e-6 + bytes / 10e9, 1e-18);
  EXPECT_NEAR(g.links.time(3, 0, bytes), 150e-6 + bytes / 1.5e9, 1e-18);
  // Ring of 4: ranks 0 and 2 are two hops apart inside one host.
  EXPECT_NEAR(one_host.links.time(0, 2, bytes), 2 * 20e-6 + bytes / 10e9, 1e-18);
  // A given interconnect is taken as it is, host map or not.
  const NetModel net = NetModel::ring(4, 5e9, 1e-6);
  EXPECT_NEAR(group_cost_model(net, nodes, false, &host_of, 0).links.time(1, 2, bytes), 1e-6 + bytes / 5e9, 1e-18);
}

// A rank's pulls from all its peers (oneshot, direct) are summed per rank
// once, from the members' coordinates; they equal the pairwise sum of
// time(), on a ring, a line and a switch with different bandwidths (the
// slowest dim crossed counts), a scattered subset of nodes and a host map.
TEST(CollCost, PullsFromAllPeersEqualThePairwiseSum) {
  const NetModel net({NetDim{4, LinkKind::Ring, 20e9, 1e-6}, NetDim{3, LinkKind::Line, 10e9, 3e-6},
                      NetDim{2, LinkKind::Switch, 40e9, 5e-6}});
  const std::vector<int> nodes = {0, 1, 3, 5, 6, 11, 12, 14, 17, 23}, host_of = {0, 0, 0, 1, 1, 1, 0, 1, 0, 1};
  for (const GroupCostModel& g : {group_cost_model(net, nodes, false), ring_group(5, false)}) {
    LinkCosts hosts = g.links;
    if (g.size == static_cast<int>(host_of.size())) hosts.set_between_hosts(host_of, 3e9, 7e-6);
    for (const LinkCosts* l : {&g.links, static_cast<const LinkCosts*>(&hosts)})
      for (int a = 0; a < g.size; ++a) {
        double want = 0;
        for (int j = 0; j < g.size; ++j) want += l->time(j, a, 1e5);
        EXPECT_NEAR(l->from_all_peers(a, 1e5), want, 1e-12 * want) << "rank " << a << " of " << g.size;
      }
  }
  // By hand, rank 0 (node 0) of the 4 x 3 x 2 net: node 1 is 1 ring hop
  // (1 us + B/20e9), node 12 one switch hop (5 us + B/40e9), node 23 = (3, 2, 1):
  // 1 + 2 x 3 + 5 us, bandwidth of the mesh dim, 10e9.
  const GroupCostModel three = group_cost_model(net, {0, 1, 12, 23}, false);
  EXPECT_NEAR(three.links.from_all_peers(0, 1e6), (1e-6 + 1e6 / 20e9) + (5e-6 + 1e6 / 40e9) + (12e-6 + 1e6 / 10e9),
              1e-15);
}

TEST(CollCost, RingAllReduceByHand) {
  // 1 Mi floats (4 MiB) over 4 ranks without shared memory: too large for
  // rhd, so the ring: 2(p-1)/p N/B + 2(p-1) alpha = 1.5 N/B + 6 alpha.
  const size_t count = size_t{1} << 20;
  const double n = 4.0 * static_cast<double>(count);
  CollPrediction r = predict(CollKind::AllReduce, count, DType::F32, ring_group(4, false));
  EXPECT_EQ(r.algorithm, "ring");
  EXPECT_NEAR(r.seconds, 1.5 * 4194304.0 / 51539607552.0 + 6 * 2e-6, 1e-15);
  EXPECT_NEAR(r.seconds, NetModel::ring_allreduce_time(4, n, kA, kB), 1e-15);
  // Reduce-scatter and all-gather: (p-1) steps of one block over one hop.
  EXPECT_NEAR(predict(CollKind::ReduceScatter, count / 4, DType::F32, ring_group(4, false)).seconds,
              3 * (2e-6 + 1048576.0 / 51539607552.0), 1e-15);
  EXPECT_NEAR(predict(CollKind::AllGather, count / 4, DType::F32, ring_group(4, false)).seconds,
              3 * (2e-6 + 1048576.0 / 51539607552.0), 1e-15);
}

TEST(CollCost, SharedMemoryAlgorithmsByHand) {
  // direct (shared memory): each rank pulls p-1 blocks of N/p and pushes its
  // block to p-1 peers; on a ring of 4 its peers are 1, 2 and 1 hops away:
  // 2 (4 alpha + 3 N/(4B)) = 8 alpha + 1.5 N/B.
  const size_t count = size_t{1} << 20;
  CollPrediction d = predict(CollKind::AllReduce, count, DType::F32, ring_group(4, true));
  EXPECT_EQ(d.algorithm, "direct");
  EXPECT_NEAR(d.seconds, 8 * 2e-6 + 1.5 * 4194304.0 / 51539607552.0, 1e-15);
  // oneshot (at most 4 KiB): every rank reads each peer's vector once.
  CollPrediction o = predict(CollKind::AllReduce, 2, DType::F32, ring_group(4, true));
  EXPECT_EQ(o.algorithm, "oneshot");
  EXPECT_NEAR(o.seconds, 4 * 2e-6 + 3 * 8.0 / 51539607552.0, 1e-15);
  // bf16 reductions are widened to f32 first: the same bytes as f32.
  EXPECT_DOUBLE_EQ(predict(CollKind::AllReduce, count, DType::BF16, ring_group(4, true)).seconds, d.seconds);
  // One rank: nothing to do.
  EXPECT_EQ(predict(CollKind::AllReduce, count, DType::F32, ring_group(1, true)).seconds, 0.0);
  // A point-to-point transfer on a two-rank link: alpha + bytes / B.
  EXPECT_NEAR(p2p_seconds(ring_group(2, true), 0, 1, 1e6), 2e-6 + 1e6 / 51539607552.0, 1e-15);
}

// A switch level (Trn3's NeuronSwitch: one hop to every chip) against the
// one-row ring of inf2.48xlarge, for four chips (one core each, no shared
// memory). 4 MiB: the ring algorithm, 2 (p-1) steps of N/p over its slowest
// link. On the switch every link is one hop: 6 (2 us + 1 MiB / 2.56 TB/s).
// On the ring of 12 chips, the ring order 0-1-2-3 closes from chip 3 back to
// chip 0 over 3 hops: 6 (3 x 2 us + 1 MiB / 96 GiB/s). 4 KiB: recursive
// doubling, partners 1 hop apart and then (on the ring) 2.
TEST(CollCost, SwitchLevelAgainstTheOneRowRingByHand) {
  auto four_chips = [](const char* preset, int cores_per_chip) {
    std::vector<int> nodes(4);
    for (int chip = 0; chip < 4; ++chip) nodes[static_cast<size_t>(chip)] = chip * cores_per_chip;
    return group_cost_model(Topology::preset(preset).net_model(), nodes, false);
  };
  const GroupCostModel sw = four_chips("trn3-ultraserver", 8), row = four_chips("inf2.48xlarge", 2);
  const double mib = 1048576.0, inf2_link = 96.0 * 1024 * 1024 * 1024;
  CollPrediction a = predict(CollKind::AllReduce, size_t{1} << 20, DType::F32, sw);
  EXPECT_EQ(a.algorithm, "ring");
  EXPECT_NEAR(a.seconds, 6 * (2e-6 + mib / 2.56e12), 1e-15);
  CollPrediction b = predict(CollKind::AllReduce, size_t{1} << 20, DType::F32, row);
  EXPECT_EQ(b.algorithm, "ring");
  EXPECT_NEAR(b.seconds, 6 * (3 * 2e-6 + mib / inf2_link), 1e-15);
  CollPrediction c = predict(CollKind::AllReduce, 1024, DType::F32, sw);
  EXPECT_EQ(c.algorithm, "rd");
  EXPECT_NEAR(c.seconds, 2 * (2e-6 + 4096 / 2.56e12), 1e-15);
  CollPrediction d = predict(CollKind::AllReduce, 1024, DType::F32, row);
  EXPECT_EQ(d.algorithm, "rd");
  EXPECT_NEAR(d.seconds, (2e-6 + 4096 / inf2_link) + (2 * 2e-6 + 4096 / inf2_link), 1e-15);
}

TEST(CollCost, RecursiveDoublingWithoutSharedMemoryByHand) {
  // rd (no shared memory: TCP links): log2 p exchanges of the whole vector.
  // 1000 floats = 4000 bytes.
  const double n = 4000.0, t1 = 2e-6 + n / 51539607552.0;  // one hop
  CollPrediction two = predict(CollKind::AllReduce, 1000, DType::F32, ring_group(2, false));
  EXPECT_EQ(two.algorithm, "rd");
  EXPECT_NEAR(two.seconds, t1, 1e-15);
  // Ring of 4: partners 1 hop away, then 2 (2 alpha + N/B).
  CollPrediction four = predict(CollKind::AllReduce, 1000, DType::F32, ring_group(4, false));
  EXPECT_EQ(four.algorithm, "rd");
  EXPECT_NEAR(four.seconds, t1 + 2 * 2e-6 + n / 51539607552.0, 1e-15);
  // 3 ranks: rank 0 folds into 1 and gets the result back (2 steps of one
  // hop), 1 and 2 exchange (one hop).
  CollPrediction three = predict(CollKind::AllReduce, 1000, DType::F32, ring_group(3, false));
  EXPECT_EQ(three.algorithm, "rd");
  EXPECT_NEAR(three.seconds, 3 * t1, 1e-15);
  // Its limits: 2 ranks up to 256 KiB (exclusive, where ring takes over),
  // more ranks up to 64 KiB (rhd above); with shared memory, never.
  EXPECT_EQ(predict(CollKind::AllReduce, 32768, DType::F32, ring_group(2, false)).algorithm, "rd");
  EXPECT_EQ(predict(CollKind::AllReduce, 65536, DType::F32, ring_group(2, false)).algorithm, "ring");
  EXPECT_EQ(predict(CollKind::AllReduce, 16384, DType::F32, ring_group(4, false)).algorithm, "rd");
  EXPECT_EQ(predict(CollKind::AllReduce, 16385, DType::F32, ring_group(4, false)).algorithm, "rhd");
  EXPECT_EQ(predict(CollKind::AllReduce, 1000, DType::F32, ring_group(4, true)).algorithm, "oneshot");
}

// A TCP group serves small all-reduces with rd, exactly, and charges what
// predict() says for a group without shared memory.
TEST(CollCost, TcpGroupsTakeRecursiveDoubling) {
  for (int p : {2, 3, 4}) {
    auto res = run_ranks(p, [](int rank, int size, const std::shared_ptr<Store>& store) {
      CommOptions o;
      o.transport = TransportKind::Tcp;
      auto c = Communicator::create(store, rank, size, o);
      const GroupCostModel g = ring_group(size, false);
      for (size_t count : {size_t{1}, size_t{1000}, size_t{20000}}) {
        std::vector<float> in(count), out(count, -1.0f);
        for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>((rank + 1) * 1000 + static_cast<int>(i % 1000));
        c->all_reduce(in.data(), out.data(), count, DType::F32, ReduceOp::Sum);
        const int ranks_sum = size * (size + 1) / 2;  // of rank + 1 over the ranks
        for (size_t i = 0; i < count; ++i) {
          // Small integers: every order of the sum is exact.
          const float want = static_cast<float>(ranks_sum * 1000 + size * static_cast<int>(i % 1000));
          COLL_REQUIRE(out[i] == want, "p ", size, " count ", count, " element ", i, ": ", out[i], " != ", want);
        }
        const CollPrediction want = predict(CollKind::AllReduce, count, DType::F32, g);
        COLL_REQUIRE(c->last_algorithm() == want.algorithm, "p ", size, " count ", count, ": ", c->last_algorithm(),
                     " served, predicted ", want.algorithm);
        COLL_REQUIRE(std::fabs(c->last_modeled_seconds() - want.seconds) <= 1e-12 * want.seconds, "p ", size, " count ",
                     count, ": charged ", c->last_modeled_seconds(), ", predicted ", want.seconds);
        const bool rd = count * 4 <= (size == 2 ? (size_t{256} << 10) - 1 : size_t{64} << 10);
        COLL_REQUIRE((c->last_algorithm() == std::string("rd")) == rd, "p ", size, " count ", count, ": ",
                     c->last_algorithm());
      }
    });
    EXPECT_EQ(failures(res), "") << "p " << p;
  }
}

// The communicator charges what predict() says, for the calls and buffers
// train_gpt makes: arena (device) buffers of several sizes, a stack scalar,
// the whole world and a split group of 2 (a TP pair).
TEST(CollCost, PredictionEqualsCharge) {
  auto res = run_ranks(4, [](int rank, int size, const std::shared_ptr<Store>& store) {
    Device dev(DeviceSpec::preset("test-core"), rank, make_shm_memory(64u << 20));
    auto world = Communicator::create(store, rank, size);
    auto pair = world->split(rank / 2, rank, "pair");
    auto near = [](double x, double y) { return std::fabs(x - y) <= 1e-12 * std::max(1e-6, std::fabs(y)); };
    for (const auto& c : {world, pair}) {
      const GroupCostModel g = ring_group(c->size(), true);
      for (size_t count : {size_t{1}, size_t{1000}, size_t{70000}, size_t{300000}}) {
        auto* buf = static_cast<float*>(dev.allocate(count * 4 * static_cast<size_t>(size)));
        auto* out = static_cast<float*>(dev.allocate(count * 4 * static_cast<size_t>(size)));
        c->all_reduce(buf, buf, count, DType::F32, ReduceOp::Sum);
        CollPrediction e = predict(CollKind::AllReduce, count, DType::F32, g);
        COLL_REQUIRE(c->last_algorithm() == e.algorithm && near(c->last_modeled_seconds(), e.seconds), "all_reduce ",
                     count, ": ran ", c->last_algorithm(), " ", c->last_modeled_seconds(), ", predicted ", e.algorithm,
                     " ", e.seconds);
        c->reduce_scatter(buf, out, count, DType::F32, ReduceOp::Sum);
        e = predict(CollKind::ReduceScatter, count, DType::F32, g);
        COLL_REQUIRE(c->last_algorithm() == e.algorithm && near(c->last_modeled_seconds(), e.seconds),
                     "reduce_scatter ", count, ": ran ", c->last_algorithm(), " ", c->last_modeled_seconds(),
                     ", predicted ", e.algorithm, " ", e.seconds);
        c->all_gather(buf, out, count, DType::F32);
        e = predict(CollKind::AllGather, count, DType::F32, g);
        COLL_REQUIRE(c->last_algorithm() == e.algorithm && near(c->last_modeled_seconds(), e.seconds), "all_gather ",
                     count, ": ran ", c->last_algorithm(), " ", c->last_modeled_seconds(), ", predicted ", e.algorithm,
                     " ", e.seconds);
        dev.free(out, count * 4 * static_cast<size_t>(size));
        dev.free(buf, count * 4 * static_cast<size_t>(size));
      }
      float scalar = 1;  // the optimizer's norm: a stack float
      c->all_reduce(&scalar, &scalar, 1, DType::F32, ReduceOp::Sum);
      const CollPrediction e = predict(CollKind::AllReduce, 1, DType::F32, g);
      COLL_REQUIRE(c->last_algorithm() == e.algorithm && near(c->last_modeled_seconds(), e.seconds), "scalar");
    }
  });
  EXPECT_EQ(failures(res), "");
}

// ---- one cost function per algorithm: what a run charges is what cost() says ----

constexpr CollKind kKinds[] = {CollKind::AllReduce, CollKind::ReduceScatter, CollKind::AllGather, CollKind::Broadcast,
                               CollKind::Reduce,    CollKind::AllToAll,      CollKind::Barrier};

// One call of `kind` on float buffers holding p * count elements each.
void call(Communicator& c, CollKind kind, float* send, float* recv, size_t count, int root) {
  switch (kind) {
    case CollKind::AllReduce:
      return c.all_reduce(send, recv, count, DType::F32, ReduceOp::Sum);
    case CollKind::ReduceScatter:
      return c.reduce_scatter(send, recv, count, DType::F32, ReduceOp::Sum);
    case CollKind::AllGather:
      return c.all_gather(send, recv, count, DType::F32);
    case CollKind::Broadcast:
      return c.broadcast(recv, count, DType::F32, root);
    case CollKind::Reduce:
      return c.reduce(send, recv, count, DType::F32, ReduceOp::Sum, root);
    case CollKind::AllToAll:
      return c.all_to_all(send, recv, count, DType::F32);
    case CollKind::Barrier:
      return c.barrier();
  }
}

bool near(double x, double y) { return std::fabs(x - y) <= 1e-12 * std::max(1e-9, std::fabs(y)); }

// Every registered algorithm forced on communicator `make(name)` of group
// model g, every kind, several sizes and roots: an algorithm whose cost()
// serves the call serves it and charges exactly cost(); one whose cost()
// declines does not serve it (a fallback does). Then, unforced, the
// communicator picks and charges what predict() says. `shared`: the
// buffers sit in the device's shared arena (else on the heap, where a
// shared-memory path that needs them declines or takes its other path).
template <typename MakeFn>
void charges_equal_costs(int rank, const GroupCostModel& g, MakeFn make, bool shared,
                         const std::vector<size_t>& counts) {
  const int p = g.size;
  const size_t most = counts.back() * static_cast<size_t>(p);
  Device dev(DeviceSpec::preset("test-core"), rank, make_shm_memory(64u << 20));
  std::vector<float> heap(2 * most + 2, 1.0f);
  float* send = shared ? static_cast<float*>(dev.allocate(4 * most)) : heap.data();
  float* recv = shared ? static_cast<float*>(dev.allocate(4 * most)) : heap.data() + most + 1;
  int served = 0;
  for (const std::string& name : algorithm_names()) {
    auto c = make(name);
    for (CollKind kind : kKinds)
      for (size_t count : counts)
        for (int root : {0, p - 1}) {
          if (kind == CollKind::Barrier && count != counts[0]) continue;
          const CostQuery q{kind, kind == CollKind::Barrier ? 0 : count, 4, root, shared};
          const double want = algorithm_cost(name, g, q);
          call(*c, kind, send, recv, q.count, root);
          const std::string what = detail::concat(name, " ", coll_kind_name(kind), " of ", count, " root ", root, ": ");
          if (want < 0) {
            COLL_REQUIRE(c->last_algorithm() != name, what, "served although its cost declines");
            continue;
          }
          COLL_REQUIRE(c->last_algorithm() == name, what, c->last_algorithm(), " served instead");
          COLL_REQUIRE(near(c->last_modeled_seconds(), want), what, "charged ", c->last_modeled_seconds(),
                       ", cost() says ", want);
          ++served;
        }
  }
  COLL_REQUIRE(served > 0, "no forced algorithm served");
  if (!shared) return;
  auto c = make("");
  for (CollKind kind : kKinds)
    for (size_t count : counts) {
      if (kind == CollKind::Barrier || kind == CollKind::Broadcast || kind == CollKind::Reduce) continue;
      call(*c, kind, send, recv, count, 0);
      const CollPrediction e = predict(kind, count, DType::F32, g);
      COLL_REQUIRE(c->last_algorithm() == e.algorithm && near(c->last_modeled_seconds(), e.seconds),
                   coll_kind_name(kind), " ", count, ": ran ", c->last_algorithm(), " ", c->last_modeled_seconds(),
                   ", predicted ", e.algorithm, " ", e.seconds);
    }
}

TEST(CollCost, EveryAlgorithmChargesItsCostOverSharedMemory) {
  for (int p : {3, 4}) {
    auto res = run_ranks(p, [](int rank, int size, const std::shared_ptr<Store>& store) {
      int seq = 0;
      auto make = [&](const std::string& algo) {
        CommOptions o;
        o.algo = algo;
        return Communicator::create(std::make_shared<PrefixStore>(store, std::to_string(seq++) + "/"), rank, size, o);
      };
      charges_equal_costs(rank, ring_group(size, true), make, true, {1, 700, 70000});
      charges_equal_costs(rank, ring_group(size, true), make, false, {1, 700, 70000});
    });
    EXPECT_EQ(failures(res), "") << "p " << p;
  }
}

TEST(CollCost, EveryAlgorithmChargesItsCostOverTcp) {
  auto res = run_ranks(4, [](int rank, int size, const std::shared_ptr<Store>& store) {
    int seq = 0;
    // On a 2 x 2 torus (the torus algorithm serves) and on the default ring.
    const NetModel torus({NetDim{2, LinkKind::Ring, 20e9, 1e-6}, NetDim{2, LinkKind::Ring, 10e9, 3e-6}});
    for (const NetModel& net : {torus, NetModel()}) {
      auto make = [&](const std::string& algo) {
        CommOptions o;
        o.transport = TransportKind::Tcp;
        o.algo = algo;
        o.net = net;
        return Communicator::create(std::make_shared<PrefixStore>(store, std::to_string(seq++) + "/"), rank, size, o);
      };
      const GroupCostModel g = group_cost_model(net, {0, 1, 2, 3}, false);
      charges_equal_costs(rank, g, make, true, {1, 1000, 40000});
    }
  });
  EXPECT_EQ(failures(res), "");
}

// Groups spanning two "hosts" (TESSERA_HOST_KEY_SUFFIX: shared memory inside
// each, TCP between): hier, hier_rd and hier_leader (and the rest) charge
// their cost functions, in place in the arena and through the rings from
// the heap, and unforced the communicator picks and charges what predict()
// says for the group's model with its host map.
TEST(CollCost, EveryAlgorithmChargesItsCostAcrossHosts) {
  for (const std::vector<int>& host_of : {std::vector<int>{0, 0, 1, 1}, std::vector<int>{0, 1, 0, 1}}) {
    auto res = run_ranks(4, [&](int rank, int size, const std::shared_ptr<Store>& store) {
      ::setenv("TESSERA_HOST_KEY_SUFFIX", ("cost-host-" + std::to_string(host_of[rank])).c_str(), 1);
      ::setenv("TESSERA_TCP_ADDR", "127.0.0.1", 1);
      int seq = 0;
      auto make = [&](const std::string& algo) {
        CommOptions o;
        o.algo = algo;
        auto c = Communicator::create(std::make_shared<PrefixStore>(store, std::to_string(seq++) + "/"), rank, size, o);
        COLL_REQUIRE(c->transport() == "shm+tcp", "transport ", c->transport());
        return c;
      };
      // The host map as the communicator sees it, with each host's CPUs (crowded or not).
      cpu_set_t set;
      CPU_ZERO(&set);
      const int cpus = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
      HostMap hosts;
      hosts.host_of = host_of;
      hosts.names = {"h0", "h1"};
      hosts.cpus = {cpus, cpus};
      const GroupCostModel g = group_cost_model(NetModel(), {0, 1, 2, 3}, false, &hosts, rank, true);
      COLL_REQUIRE(g.hosts.valid, "two levels expected");
      charges_equal_costs(rank, g, make, true, {1, 1000, 70000});
      charges_equal_costs(rank, g, make, false, {1, 1000, 70000});
    });
    EXPECT_EQ(failures(res), "");
  }
}

// The hierarchical algorithms' costs by hand: 2 hosts x 2 ranks, links
// inside a host 2 us + bytes / 48 GiB/s, between hosts 10 us + bytes /
// (100 GB/s shared by the host's 2 ranks).
TEST(CollCost, HierarchicalCostsByHand) {
  const std::vector<int> host_of = {0, 0, 1, 1};
  const GroupCostModel g = group_cost_model(NetModel(), {0, 1, 2, 3}, false, &host_of, 0, true);
  ASSERT_TRUE(g.hosts.valid);
  auto tl = [](double b) { return 2e-6 + b / kB; };
  auto tx = [](double b) { return 10e-6 + b / 50e9; };
  const double n = 4e6;  // 1e6 floats
  // hier, in place: pull and push one half inside the host (one peer each),
  // ring all-reduce of that half over the 2 hosts (two steps of a quarter).
  EXPECT_NEAR(algorithm_cost("hier", g, {CollKind::AllReduce, 1000000, 4, 0, true}), 2 * tl(n / 2) + 2 * tx(n / 4),
              1e-15);
  // From the heap: the host's reduce-scatter and all-gather rings instead (the same here: one peer).
  EXPECT_NEAR(algorithm_cost("hier", g, {CollKind::AllReduce, 1000000, 4, 0, false}), 2 * tl(n / 2) + 2 * tx(n / 4),
              1e-15);
  // hier_rd: one doubling inside the host, one across: the whole vector each.
  EXPECT_NEAR(algorithm_cost("hier_rd", g, {CollKind::AllReduce, 1000000, 4, 0, true}), tl(n) + tx(n), 1e-15);
  // hier_leader: reduce to the leader, its exchange across, broadcast back.
  EXPECT_NEAR(algorithm_cost("hier_leader", g, {CollKind::AllReduce, 1000000, 4, 0, true}), 2 * tl(n) + tx(n), 1e-15);
  // All-gather of 1000 floats per rank: a ring across hosts of one block,
  // then one inside the host of two blocks.
  EXPECT_NEAR(algorithm_cost("hier", g, {CollKind::AllGather, 1000, 4, 0, true}), tx(4000) + tl(8000), 1e-15);
  // Three hosts do not have powers of two: hier_rd and hier_leader decline.
  const std::vector<int> three = {0, 0, 1, 1, 2, 2};
  const GroupCostModel g3 = group_cost_model(NetModel(), {0, 1, 2, 3, 4, 5}, false, &three, 0, true);
  EXPECT_LT(algorithm_cost("hier_rd", g3, {CollKind::AllReduce, 10, 4, 0, true}), 0);
  EXPECT_LT(algorithm_cost("hier_leader", g3, {CollKind::AllReduce, 10, 4, 0, true}), 0);
  EXPECT_GE(algorithm_cost("hier", g3, {CollKind::AllReduce, 10, 4, 0, true}), 0);
  // predict() costs the group as the communicator does: the small all-reduce takes hier_rd.
  EXPECT_EQ(predict(CollKind::AllReduce, 7, DType::F32, g).algorithm, "hier_rd");
  EXPECT_NEAR(predict(CollKind::AllReduce, 7, DType::F32, g).seconds, tl(28) + tx(28), 1e-15);
  EXPECT_THROW(algorithm_cost("nope", g, {}), InvalidArgument);
}

}  // namespace
}  // namespace tessera::collectives
