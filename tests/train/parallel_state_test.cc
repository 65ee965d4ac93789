// ParallelState's TP, DP and PP groups (parallel/layers/parallel_state.h)
// for tp2 pp2 dp2 on 8 forked ranks, against the Megatron-LM / NxD layout
// (rank = tp + dp * TP + pp * TP * DP): TP groups [0,1] [2,3] [4,5] [6,7],
// DP groups [0,2] [1,3] [4,6] [5,7], PP groups [0,4] [1,5] [2,6] [3,7].
#include "parallel/layers/parallel_state.h"

#include <gtest/gtest.h>

#include <vector>

#include "runtime/device.h"
#include "tests/collectives/fork_harness.h"

namespace tessera {
namespace {

using Groups = std::vector<std::vector<int>>;

const std::vector<int>& group_of(const Groups& gs, int rank) {
  for (const auto& g : gs)
    for (int r : g)
      if (r == rank) return g;
  throw std::runtime_error("rank not in any group");
}

TEST(ParallelState, Tp2Pp2Dp2GroupsAreMegatrons) {
  const Groups tp_groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}};
  const Groups dp_groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}};
  const Groups pp_groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}};
  auto res = collectives::test::run_ranks(8, [&](int rank, int size, std::shared_ptr<collectives::Store> store) {
    Device dev(DeviceSpec::preset("test-core"), rank);
    collectives::CommOptions co;
    co.device = &dev;
    auto world = collectives::Communicator::create(std::move(store), rank, size, co);
    parallel::layers::ParallelState ps =
        parallel::layers::make_parallel_state(world, /*tp=*/2, /*dp=*/2, &dev, /*sequence_parallel=*/false, /*pp=*/2);
    COLL_REQUIRE(ps.tp_size == 2 && ps.dp_size == 2 && ps.pp_size == 2);
    COLL_REQUIRE(ps.tp_rank == rank % 2 && ps.dp_rank == rank / 2 % 2 && ps.pp_rank == rank / 4, "rank ", rank);
    COLL_REQUIRE(ps.global_rank() == rank, "global_rank ", ps.global_rank(), " of rank ", rank);
    COLL_REQUIRE(ps.first_stage() == (rank < 4) && ps.last_stage() == (rank >= 4));
    struct Axis {
      const char* name;
      std::shared_ptr<collectives::Communicator> comm;
      int group_rank;
      const Groups& groups;
    };
    for (const Axis& a : {Axis{"tp", ps.tp, ps.tp_rank, tp_groups}, Axis{"dp", ps.dp, ps.dp_rank, dp_groups},
                          Axis{"pp", ps.pp, ps.pp_rank, pp_groups}}) {
      const std::vector<int>& want = group_of(a.groups, rank);
      COLL_REQUIRE(a.comm != nullptr, a.name);
      COLL_REQUIRE(a.comm->size() == 2 && a.comm->rank() == a.group_rank, a.name, " rank ", rank);
      COLL_REQUIRE(want[static_cast<size_t>(a.group_rank)] == rank, a.name, " group order, rank ", rank);
      // The members really are these world ranks: all-gather each one's world rank.
      float mine = static_cast<float>(rank), got[2] = {-1, -1};
      a.comm->all_gather(&mine, got, 1, DType::F32);
      COLL_REQUIRE(got[0] == want[0] && got[1] == want[1], a.name, " of rank ", rank, " holds ", got[0], ",", got[1]);
    }
    world->barrier();
  });
  std::string f = collectives::test::failures(res);
  EXPECT_TRUE(f.empty()) << f;
}

// Megatron's embedding group: the first and last stage of each PP group.
// tp2 pp4 on 8 ranks: PP groups [0,2,4,6] and [1,3,5,7]; embedding groups
// [0,6] and [1,7]; the middle stages have none.
TEST(ParallelState, EmbeddingGroupIsFirstAndLastStage) {
  auto res = collectives::test::run_ranks(8, [&](int rank, int size, std::shared_ptr<collectives::Store> store) {
    auto world = collectives::Communicator::create(std::move(store), rank, size, {});
    parallel::layers::ParallelState ps = parallel::layers::make_parallel_state(world, 2, 1, nullptr, false, 4);
    const bool ends = rank / 2 == 0 || rank / 2 == 3;
    COLL_REQUIRE((ps.embed != nullptr) == ends, "rank ", rank, " embedding group ", ps.embed != nullptr);
    if (ps.embed) {
      COLL_REQUIRE(ps.embed->size() == 2 && ps.embed->rank() == (rank / 2 == 3 ? 1 : 0), "rank ", rank);
      float mine = static_cast<float>(rank), got[2] = {-1, -1};
      ps.embed->all_gather(&mine, got, 1, DType::F32);
      COLL_REQUIRE(got[0] == static_cast<float>(rank % 2) && got[1] == static_cast<float>(6 + rank % 2), "rank ", rank,
                   " embedding group holds ", got[0], ",", got[1]);
    }
    world->barrier();
  });
  std::string f = collectives::test::failures(res);
  EXPECT_TRUE(f.empty()) << f;
}

TEST(ParallelState, WorldSizeMustBeTpDpPp) {
  auto res = collectives::test::run_ranks(2, [&](int rank, int size, std::shared_ptr<collectives::Store> store) {
    auto world = collectives::Communicator::create(std::move(store), rank, size, {});
    bool threw = false;
    try {
      parallel::layers::make_parallel_state(world, 1, 1, nullptr, false, /*pp=*/4);
    } catch (const InvalidArgument&) {
      threw = true;
    }
    COLL_REQUIRE(threw, "world of 2 accepted for pp 4");
    parallel::layers::ParallelState ps = parallel::layers::make_parallel_state(world, 1, 1, nullptr, false, 2);
    COLL_REQUIRE(ps.pp_rank == rank && ps.pp != nullptr && ps.tp == nullptr && ps.dp == nullptr);
    world->barrier();
  });
  std::string f = collectives::test::failures(res);
  EXPECT_TRUE(f.empty()) << f;
}

}  // namespace
}  // namespace tessera
