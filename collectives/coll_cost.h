// Collective costs: the modeled seconds of the algorithms' schedules, in one
// place. Each algorithm has one cost function, Algorithm::cost (next to its
// schedule in algorithms.cc, built from the step helpers below), which is
// also its one decline rule: run() charges exactly what it says to the
// communicator's clock, and predict() gives, without running anything, the
// algorithm the communicator would pick for a call and the seconds it would
// charge, by asking the same candidates in the same order. So the planner
// (parallel/cost_model.h), the bench's modeled column and the MPI
// communicator's model cost a collective exactly as an emulated run charges
// it. docs/algorithms.md lists the schedules and their closed forms on a
// uniform ring.
//
// The group's link model is built here only (group_cost_model), for the
// communicator and the planner alike, with the same overrides
// (TESSERA_NET_INTRA_HOST, TESSERA_NET_INTER_HOST). Groups spanning hosts
// (a host map with equal ranks per host) are costed with the two-level
// algorithms (hier, hier_rd, hier_leader) as the communicator runs them.
// Pure functions.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/host.h"

namespace tessera::collectives {

// One ring phase (reduce-scatter or all-gather) among `members` (group ranks
// in ring order): m - 1 steps, each as slow as the slowest link of the ring
// carrying `block_bytes`.
double ring_phase_seconds(const LinkCosts& links, const int* members, int m, double block_bytes);
// Every one of the p ranks reads `per_peer_bytes` from each other rank, one
// transfer each: the slowest rank's sum (oneshot; each phase of direct).
double gather_from_peers_seconds(const LinkCosts& links, int p, double per_peer_bytes);
// The largest power of two pp <= p, into which the first 2 (p - pp) ranks
// fold pairwise (rhd, rd): rank 2i hands its vector to 2i+1 and sits out;
// renumbered rank nr is group rank real(nr).
struct PowerOfTwoFold {
  explicit PowerOfTwoFold(int p) {
    while (pp * 2 <= p) pp *= 2;
    rem = p - pp;
  }
  int real(int nr) const { return nr < rem ? 2 * nr + 1 : nr + rem; }
  // Group rank r's renumbered rank, or -1 if it folds in and sits out.
  int renumbered(int r) const { return r >= 2 * rem ? r - rem : (r % 2 == 1 ? r / 2 : -1); }
  // Folding in and out: the slowest pair's transfer of `bytes`, twice.
  double seconds(const LinkCosts& links, double bytes) const;
  int pp = 1, rem = 0;
};
// Recursive doubling among m ranks (member(i): the group rank at position
// i, m a power of two), `bytes` per exchange: each level's exchanges run at
// once, so a level costs its slowest pair (rd, hier_rd, hier_leader).
template <typename MemberFn>
double doubling_seconds(const LinkCosts& links, int m, MemberFn member, double bytes) {
  double t = 0;
  for (int mask = 1; mask < m; mask <<= 1) {
    double worst = 0;
    for (int a = 0; a < m; ++a) worst = std::max(worst, links.time(member(a), member(a ^ mask), bytes));
    t += worst;
  }
  return t;
}
// Rabenseifner all-reduce of `count` elements of `elem` bytes over p ranks
// (fold to the largest power of two, halving and doubling, unfold).
double rhd_all_reduce_seconds(const LinkCosts& links, int p, size_t count, size_t elem);
// Recursive doubling all-reduce of `count` elements of `elem` bytes over p
// ranks (fold to the largest power of two, log2 exchanges of the whole
// vector, unfold).
double rd_all_reduce_seconds(const LinkCosts& links, int p, size_t count, size_t elem);
// Binomial tree (broadcast or reduce) of `bytes` from/to `root`.
double tree_seconds(const LinkCosts& links, int p, int root, double bytes);

// What a group's communicator knows when it picks an algorithm.
struct GroupCostModel {
  int size = 1;
  NetModel net;
  std::vector<int> nodes;  // net node of each group rank
  LinkCosts links;
  TorusShape torus;
  bool shared_memory = false;  // every member on one host, buffers in the shared arena
  // Spanning hosts: the levels as group rank 0 sees them (valid when every
  // host holds the same number >= 2 of the group's ranks), and whether the
  // ranks of a host share memory (hier's in-place host phases).
  HostLevels hosts;
  bool host_shared_memory = false;
};
// The model of a group of nodes on `net`, built here for the communicator
// (comm_impl.cc) and the planner alike. Empty net dims: the communicator's
// default, a ring over the group (nodes: only their number counts) with
// NetModel::kDefaultLink* figures or TESSERA_NET_INTRA_HOST's, and when
// `hosts` (the group's host map) says it spans hosts, links between hosts
// cost the instance network instead: TESSERA_NET_INTER_HOST's figures, or
// EFA's 800 Gbps shared by the ranks of `rank`'s host and an assumed 10 us
// (docs/algorithms.md). A non-empty net is taken as it is. The host levels
// are set from `hosts` either way (host_shared_memory: host_shared_memory).
GroupCostModel group_cost_model(const NetModel& net, const std::vector<int>& nodes, bool shared_memory,
                                const HostMap* hosts, int rank = 0, bool host_shared_memory = false);
// The same with a bare host map (group rank -> host index; no host crowded).
GroupCostModel group_cost_model(const NetModel& net, const std::vector<int>& nodes, bool shared_memory,
                                const std::vector<int>* host_of = nullptr, int rank = 0,
                                bool host_shared_memory = false);

struct CollPrediction {
  std::string algorithm;  // as Communicator::last_algorithm() would say
  double seconds = 0;     // as last_modeled_seconds() would say
};
// `count` elements as in the Communicator API (all-gather: per rank;
// reduce-scatter: of the result per rank); reductions of bf16/f16 are
// widened to f32 as the communicator does.
CollPrediction predict(CollKind kind, size_t count, DType dtype, const GroupCostModel& g);
// The algorithm `name` serves (or declines: negative) `q` over `g` at this
// cost (Algorithm::cost); unknown names throw InvalidArgument.
double algorithm_cost(const std::string& name, const GroupCostModel& g, const CostQuery& q);
// A point-to-point transfer of `bytes` from group rank a to b.
double p2p_seconds(const GroupCostModel& g, int a, int b, double bytes);

}  // namespace tessera::collectives
