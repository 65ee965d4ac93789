#include "parallel/mesh.h"

#include <gtest/gtest.h>

#include <set>

#include "runtime/error.h"
#include "runtime/topology.h"

namespace tessera::parallel {
namespace {

std::vector<int> iota_vec(int begin, int end, int step = 1) {
  std::vector<int> v;
  for (int i = begin; i < end; i += step) v.push_back(i);
  return v;
}

// Megatron-LM parallel_state.py / NxD: 32 ranks, TP=8, PP=4 (DP=1).
TEST(Mesh, MegatronExampleGroups) {
  Mesh m({.tp = 8, .dp = 1, .pp = 4});
  auto tp = m.groups(MeshAxis::TP);
  ASSERT_EQ(tp.size(), 4u);
  for (int g = 0; g < 4; ++g) EXPECT_EQ(tp[static_cast<size_t>(g)], iota_vec(8 * g, 8 * g + 8));
  auto pp = m.groups(MeshAxis::PP);
  ASSERT_EQ(pp.size(), 8u);
  for (int g = 0; g < 8; ++g) EXPECT_EQ(pp[static_cast<size_t>(g)], (std::vector<int>{g, g + 8, g + 16, g + 24}));
  auto dp = m.groups(MeshAxis::DP);
  ASSERT_EQ(dp.size(), 32u);
  EXPECT_EQ(dp[5], std::vector<int>{5});
  EXPECT_EQ(m.tp_group(13), iota_vec(8, 16));
  EXPECT_EQ(m.pp_group(13), (std::vector<int>{5, 13, 21, 29}));
}

// Megatron's docstring example: 16 ranks, TP=2, PP=4, DP=2:
// TP [0,1],[2,3],...; DP [0,2],[1,3],[4,6],...; PP [0,4,8,12],[1,5,9,13],...
TEST(Mesh, MegatronTp2Pp4Dp2) {
  Mesh m({.tp = 2, .dp = 2, .pp = 4});
  EXPECT_EQ(m.tp_group(6), (std::vector<int>{6, 7}));
  EXPECT_EQ(m.dp_group(0), (std::vector<int>{0, 2}));
  EXPECT_EQ(m.dp_group(5), (std::vector<int>{5, 7}));
  EXPECT_EQ(m.pp_group(1), (std::vector<int>{1, 5, 9, 13}));
  MeshCoord c = m.coord(13);  // 13 = 1 + 0*2 + 3*4
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.dp, 0);
  EXPECT_EQ(c.pp, 3);
  for (int r = 0; r < 16; ++r) EXPECT_EQ(m.rank(m.coord(r)), r);
}

TEST(Mesh, OtherOrder) {
  Mesh m({.tp = 2, .dp = 2, .pp = 4}, parse_mesh_order("tp-pp-dp"));
  EXPECT_EQ(m.pp_group(0), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(m.dp_group(0), (std::vector<int>{0, 8}));
  EXPECT_EQ(mesh_order_name(m.order()), "tp-pp-dp");
  EXPECT_THROW(parse_mesh_order("tp-tp-dp"), InvalidArgument);
  EXPECT_THROW(parse_mesh_order("tp-dp"), InvalidArgument);
  EXPECT_THROW(parse_mesh_order("tp-dp-xx"), InvalidArgument);
}

void expect_bijection(const Topology& t, const Mesh& m) {
  Placement p(t, m);
  std::vector<char> seen(static_cast<size_t>(t.num_cores()), 0);
  for (int r = 0; r < m.world_size(); ++r) {
    int n = p.node(r);
    ASSERT_GE(n, 0);
    ASSERT_LT(n, t.num_cores());
    ASSERT_FALSE(seen[static_cast<size_t>(n)]) << "two ranks on core " << n;
    seen[static_cast<size_t>(n)] = 1;
  }
}

// Every TP group of every factorization of the trn1 4x4 torus (2 cores per chip)
// is a ring whose consecutive members, and last and first, are one link apart.
TEST(Placement, Trn1TpGroupsAreOneHopRings) {
  Topology t = Topology::preset("trn1.32xlarge");
  NetModel net = t.net_model();
  for (int tp : {2, 4, 8, 16, 32}) {
    for (int pp = 1; tp * pp <= 32; pp *= 2) {
      int dp = 32 / (tp * pp);
      Mesh m({.tp = tp, .dp = dp, .pp = pp});
      Placement p(t, m);
      expect_bijection(t, m);
      for (const auto& g : m.groups(MeshAxis::TP)) {
        for (size_t i = 0; i < g.size(); ++i) {
          int a = p.node(g[i]), b = p.node(g[(i + 1) % g.size()]);
          EXPECT_EQ(net.hops_between(a, b), 1)
              << "tp=" << tp << " pp=" << pp << " ranks " << g[i] << "," << g[(i + 1) % g.size()];
        }
      }
      HopStats h = p.hop_stats(MeshAxis::TP);
      EXPECT_EQ(h.max_hops, 1);
      EXPECT_DOUBLE_EQ(h.one_hop_fraction, 1.0);
    }
  }
}

TEST(Placement, PipelineNeighboursOneHopOnTrn1) {
  Topology t = Topology::preset("trn1.32xlarge");
  for (auto [tp, pp] : std::vector<std::pair<int, int>>{{2, 4}, {4, 4}, {8, 4}, {2, 16}, {4, 2}}) {
    Placement p(t, Mesh({.tp = tp, .dp = 32 / (tp * pp), .pp = pp}));
    HopStats h = p.hop_stats(MeshAxis::PP);
    EXPECT_EQ(h.max_hops, 1) << "tp=" << tp << " pp=" << pp;
    EXPECT_FALSE(h.ring);
  }
}

TEST(Placement, LargeTorusIsBijective) {
  Topology t = Topology::preset("torus4d:16x16x16x16");
  expect_bijection(t, Mesh({.tp = 16, .dp = 512, .pp = 8}));
  expect_bijection(t, Mesh({.tp = 32, .dp = 512, .pp = 4}, parse_mesh_order("tp-pp-dp")));
  Placement p(t, Mesh({.tp = 16, .dp = 512, .pp = 8}));
  EXPECT_EQ(p.hop_stats(MeshAxis::TP).max_hops, 1);  // a whole ring of 16
  EXPECT_EQ(p.hop_stats(MeshAxis::PP).max_hops, 1);
}

TEST(Placement, GroupModels) {
  Topology t = Topology::preset("trn1.32xlarge");
  // tp=8 takes both cores of a chip and a whole x ring: the group sees the
  // topology's first two dimensions unchanged.
  Placement p(t, Mesh({.tp = 8, .dp = 4, .pp = 1}));
  NetModel tp = p.group_model(MeshAxis::TP);
  ASSERT_EQ(tp.dims().size(), 2u);
  EXPECT_EQ(tp.dims()[0].size, 2);
  EXPECT_EQ(tp.dims()[0].kind, LinkKind::Switch);
  EXPECT_EQ(tp.dims()[1].size, 4);
  EXPECT_EQ(tp.dims()[1].kind, LinkKind::Ring);
  EXPECT_DOUBLE_EQ(tp.dims()[1].bandwidth, t.dims()[1].net.bandwidth);
  double n = 1 << 20;
  EXPECT_DOUBLE_EQ(tp.torus_allreduce_time(n), NetModel({t.dims()[0].net, t.dims()[1].net}).torus_allreduce_time(n));
  // dp=4 on y. The whole topology for tp=1 pp=1 dp=32.
  Placement all(t, Mesh({.tp = 1, .dp = 32, .pp = 1}));
  EXPECT_DOUBLE_EQ(all.group_model(MeshAxis::DP).torus_allreduce_time(n), t.net_model().torus_allreduce_time(n));
  // tp=4 (2 cores x 2 chips on x), dp=2 takes the rest of x at stride 2:
  // bandwidth halved (two groups share each link), latency doubled.
  Placement q(t, Mesh({.tp = 4, .dp = 2, .pp = 4}));
  NetModel dp = q.group_model(MeshAxis::DP);
  ASSERT_EQ(dp.dims().size(), 1u);
  EXPECT_EQ(dp.dims()[0].size, 2);
  EXPECT_DOUBLE_EQ(dp.dims()[0].bandwidth, t.dims()[1].net.bandwidth / 2);
  EXPECT_DOUBLE_EQ(dp.dims()[0].latency, t.dims()[1].net.latency * 2);
}

TEST(Placement, WorldMustMatchCores) {
  Topology t = Topology::preset("trn1.32xlarge");
  EXPECT_THROW(Placement(t, Mesh({.tp = 8, .dp = 1, .pp = 2})), InvalidArgument);
}

}  // namespace
}  // namespace tessera::parallel
