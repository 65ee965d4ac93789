// Collective algorithms written against the Transport interface.
//
// The communicator hands each call to the candidates for its kind in
// selection order; a candidate that cannot serve the call returns false
// (declines) before any communication, or after a round whose outcome every
// rank saw alike, so all ranks always pick the same algorithm. Algorithms see
// only kernel dtypes (f32, i32, i64) for reductions; bf16/f16 are widened to
// f32 by the communicator, and Avg arrives as Sum (divided afterwards).
//
// Every algorithm charges each step of its schedule to ctx.model (modeled
// NeuronLink seconds); docs/algorithms.md lists the steps and bytes.
// Single-threaded: one call at a time per communicator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/transport.h"

namespace tessera::collectives {

enum class CollKind { AllReduce, ReduceScatter, AllGather, Broadcast, Reduce, AllToAll, Barrier };
const char* coll_kind_name(CollKind k);

struct CollCall {
  CollKind kind;
  const void* send;
  void* recv;
  size_t count;  // as in the Communicator API
  DType dtype;
  ReduceOp op;  // never Avg here
  int root;
};

// Link costs between group ranks: `latency + bytes / bandwidth` of the
// route between their nodes on the NetModel (NetModel::p2p_time's rule),
// from each member's coordinates, computed per call without allocating.
class LinkCosts {
 public:
  LinkCosts() = default;
  LinkCosts(const NetModel& net, const std::vector<int>& nodes);
  // Links between group ranks on different hosts (host_of[r]) cost
  // `latency + bytes / bandwidth` instead (the instance network).
  void set_between_hosts(const std::vector<int>& host_of, double bandwidth, double latency);
  double time(int from, int to, double bytes) const;
  int size() const { return p_; }
  // The sum over every other rank j of time(j, to, bytes), as
  // `latency sum + bytes * inverse-bandwidth sum` kept per rank, so a
  // rank's pulls from all its peers cost O(1), not O(p) (oneshot, direct).
  double from_all_peers(int to, double bytes) const {
    const size_t i = static_cast<size_t>(to);
    return peer_lat_[i] + bytes * peer_inv_bw_[i];
  }

 private:
  // Fills peer_lat_ and peer_inv_bw_ in O(p log p) per dimension from the
  // members' coordinates (time()'s rule: hop latencies add per dimension,
  // the slowest dimension crossed sets the bandwidth).
  void sum_peers();

  int p_ = 0;
  std::vector<NetDim> dims_;
  std::vector<int> coord_;  // [r * dims + i]
  std::vector<int> host_of_;
  double host_bw_ = 0, host_lat_ = 0;
  std::vector<double> peer_lat_, peer_inv_bw_;  // [r]: from_all_peers' two sums
};

// Grid structure of the group on the torus, when it has one: the dims along
// which members differ, each with the sorted coordinates in use.
struct TorusShape {
  bool valid = false;
  std::vector<int> dim_index;           // NetModel dims used, fastest first
  std::vector<int> extent;              // members along each
  std::vector<std::vector<int>> coord;  // coord[r][i]: group rank r's index along dim i
  std::vector<int> linear;              // linear[r]: r's index, dim 0 fastest
  std::vector<int> rank_of_linear;      // inverse of linear
  bool identity = false;                // linear[r] == r for all r
};
TorusShape torus_shape(const NetModel& net, const std::vector<int>& nodes);

struct Workspace {
  // Returns at least `bytes` of 64-byte aligned memory, grown (and touched)
  // only when a call needs more than any before.
  void* get(size_t bytes);
  ~Workspace();
  Workspace() = default;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// The two levels of a group that spans hosts: this rank's host-mates and
// its peers of the same local index on the other hosts. valid only when
// every host holds the same number (>= 2) of the group's ranks and there
// are >= 2 hosts.
struct HostLevels {
  bool valid = false;
  std::vector<int> local;     // group ranks on this rank's host, ascending
  int local_pos = 0;          // this rank's index in local
  std::vector<int> cross;     // the rank of local index local_pos on each host, by host
  int cross_pos = 0;          // this rank's index in cross (its host's)
  std::vector<int> host;      // group rank -> host index
  std::vector<int> index;     // group rank -> local index on its host
  std::vector<int> by_local;  // [i * H + k]: the rank of local index i on host k
  bool crowded = false;       // HostMap::crowded(): some host's ranks share its cores
};
HostLevels host_levels(const HostMap* hosts, int rank);

struct GroupCostModel;  // coll_cost.h: the group as its costs see it

struct AlgoContext {
  Transport* transport = nullptr;
  int rank = 0, size = 1;
  uint32_t tag = 0;  // this call's tag
  const TorusShape* torus = nullptr;
  Workspace* ws = nullptr;                // algorithm scratch
  const HostLevels* hosts = nullptr;      // this rank's levels
  const GroupCostModel* group = nullptr;  // what Algorithm::cost sees (links, torus, host levels)
  // Set false by an algorithm whose shared-memory path found some rank's
  // buffers outside every shared arena (alike on every rank) and took
  // another path; run() then charges CostQuery::buffers_shared = false.
  bool buffers_shared = true;
  double model = 0;  // modeled seconds charged by the schedule
};

// A call as its cost sees it: `count` elements of `elem` bytes each as
// run() gets them (as in the Communicator API; bf16/f16 reductions widened
// to f32), the root, and whether the buffers sit in a shared arena (the
// planner assumes they do: device memory under `tessera run`).
struct CostQuery {
  CollKind kind = CollKind::AllReduce;
  size_t count = 0;
  size_t elem = 4;
  int root = 0;
  bool buffers_shared = true;
};

class Algorithm {
 public:
  virtual ~Algorithm() = default;
  virtual const char* name() const = 0;
  // The one cost function and the one decline rule: the modeled seconds of
  // serving `q` over the group `g` (its schedule's steps on g's links, as
  // seen from group rank 0, so every rank charges the same), or a negative
  // value where the algorithm does not serve the call. run() charges
  // exactly this; the planner and the bench's modeled column read it too
  // (coll_cost.h predict()).
  virtual double cost(const GroupCostModel& g, const CostQuery& q) const = 0;
  // Serves the call, charging cost() to ctx.model, or returns false
  // (declined) without side effects: where cost() is negative, or where
  // execute() finds, in a first round every rank sees alike, buffers
  // outside the shared arena that its only path needs.
  bool run(AlgoContext& ctx, const CollCall& call);

 protected:
  // Moves the data (cost() >= 0 for the call); false: declined as above.
  virtual bool execute(AlgoContext& ctx, const CollCall& call) = 0;
};

// The registry. Fills `out` (room for kMaxCandidates) with the algorithms
// to try for `kind`, in selection order by size and group shape; a forced
// name (TESSERA_ALGO / CommOptions::algo) goes first and the defaults follow
// as fallbacks. Unknown names throw InvalidArgument. Allocates nothing.
constexpr int kMaxCandidates = 10;
// multi_host: the group spans hosts with equal ranks per host (HostLevels::valid).
// g (optional): the group's size and shared memory refine the size rules,
// and for an all-reduce over a group spanning hosts (g->hosts valid) the
// two-level algorithms are ordered by their cost() on g (rank 0's view,
// the same on every rank) instead of by size. `elem`: bytes per element.
int algorithm_candidates(CollKind kind, size_t bytes, bool multi_dim_torus, bool multi_host, const std::string& forced,
                         Algorithm** out, const GroupCostModel* g = nullptr, size_t elem = 4);
std::vector<std::string> algorithm_names();
// The registered algorithm of that name, or nullptr.
Algorithm* find_algorithm(const std::string& name);
// The largest message oneshot serves for a group of `group_size` ranks
// (0: unknown): 1 KiB for 2 ranks, else the 4 KiB a publish slot holds
// (the crossovers measured in docs/algorithms.md).
size_t oneshot_max_bytes(int group_size);
// The largest broadcast `flat` serves by default for a group of
// `group_size` ranks (0: unknown, the largest): 4 KiB for 2 ranks, 32 KiB
// above (the crossovers in docs/algorithms.md).
size_t flat_broadcast_max_bytes(int group_size);
// Broadcasts above this many bytes go to `direct` (peers copy the root's
// buffer in place) for a group of `group_size` ranks (0: unknown, the
// smallest): 4 KiB for 2 ranks, 32 KiB above, where `flat` stops.
size_t direct_broadcast_min_bytes(int group_size);

}  // namespace tessera::collectives
