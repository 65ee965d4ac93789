// Device mesh: world ranks <-> (tp, dp, pp) coordinates, the process groups
// of each parallel dimension, and the placement of ranks onto a topology.
//
// Rank numbering follows NxD and Megatron-LM (parallel_state.py): with the
// default order TP fastest, then DP, then PP,
//   rank = tp + dp * TP + pp * TP * DP,
// so with TP=8, PP=4 on 32 ranks the TP groups are [0..7], [8..15], ... and
// the PP groups [0, 8, 16, 24], [1, 9, 17, 25], ... Other orders can be
// given ("tp-pp-dp", ...). Groups list world ranks in group-rank order.
//
// Placement is separate from numbering: it assigns each mesh axis a sub-box
// of the torus (TP first on the fastest dimensions, then PP, then DP on what
// is left) and orders each axis so that consecutive group members are one
// link apart: TP groups are Hamiltonian cycles of their sub-box (one-hop rings
// whenever the sub-box has an even side or is a whole ring), PP stages follow
// a path of neighbours, DP groups take the rest.
//
// Mesh and Placement are immutable values; they are safe to share across
// threads. Training uses Mesh to build its communicators (tp_group(rank)...).
#pragma once

#include <array>
#include <string>
#include <vector>

#include "runtime/netmodel.h"
#include "runtime/topology.h"

namespace tessera::parallel {

enum class MeshAxis { TP = 0, DP = 1, PP = 2 };
const char* mesh_axis_name(MeshAxis a);

struct MeshCoord {
  int tp = 0, dp = 0, pp = 0;
  int get(MeshAxis a) const { return a == MeshAxis::TP ? tp : (a == MeshAxis::DP ? dp : pp); }
  int& get(MeshAxis a) { return a == MeshAxis::TP ? tp : (a == MeshAxis::DP ? dp : pp); }
};

// Fastest-varying axis first.
using MeshOrder = std::array<MeshAxis, 3>;
constexpr MeshOrder kDefaultMeshOrder = {MeshAxis::TP, MeshAxis::DP, MeshAxis::PP};
// "tp-dp-pp" (default), "tp-pp-dp", ...; throws InvalidArgument otherwise.
MeshOrder parse_mesh_order(const std::string& s);
std::string mesh_order_name(const MeshOrder& o);

// The degree of each axis, in MeshAxis order (tp, dp, pp) like MeshCoord and
// the accessors. Call sites name the fields: Mesh({.tp = 2, .dp = 4}).
struct MeshShape {
  int tp = 1, dp = 1, pp = 1;
};

class Mesh {
 public:
  explicit Mesh(MeshShape shape, MeshOrder order = kDefaultMeshOrder);

  int tp() const { return size_[0]; }
  int dp() const { return size_[1]; }
  int pp() const { return size_[2]; }
  int size(MeshAxis a) const { return size_[static_cast<int>(a)]; }
  int world_size() const { return size_[0] * size_[1] * size_[2]; }
  const MeshOrder& order() const { return order_; }

  MeshCoord coord(int rank) const;
  int rank(const MeshCoord& c) const;

  // World ranks of the group along `axis` that contains `rank`, in group-rank order.
  std::vector<int> group(MeshAxis axis, int rank) const;
  std::vector<int> tp_group(int rank) const { return group(MeshAxis::TP, rank); }
  std::vector<int> dp_group(int rank) const { return group(MeshAxis::DP, rank); }
  std::vector<int> pp_group(int rank) const { return group(MeshAxis::PP, rank); }
  // Every group along `axis`, ordered by its lowest rank.
  std::vector<std::vector<int>> groups(MeshAxis axis) const;

 private:
  std::array<int, 3> size_;
  MeshOrder order_;
  std::array<int, 3> stride_;  // rank stride of each axis (indexed by MeshAxis)
};

// Links crossed between consecutive members of the groups of one axis.
struct HopStats {
  int max_hops = 0;
  double mean_hops = 0;
  double one_hop_fraction = 0;  // fraction of consecutive pairs one link apart
  bool ring = true;             // whether the pair (last, first) was counted
};

// One topology dimension's share given to a mesh axis: the axis index digit
// moves the coordinate along `dim` by `stride`.
struct AxisPart {
  int dim = 0;
  int extent = 1;
  int stride = 1;
  bool wraps = false;  // index extent-1 and 0 are neighbours (switch, or a whole ring)
};

class Placement {
 public:
  // Places `mesh` on `topo` (world size must equal the core count).
  Placement(const Topology& topo, const Mesh& mesh);

  const Mesh& mesh() const { return mesh_; }
  const std::vector<AxisPart>& parts(MeshAxis a) const { return parts_[static_cast<int>(a)]; }

  // Topology core (NetModel node) of a rank, and its coordinates.
  int node(int rank) const;
  std::vector<int> coords(int rank) const;

  // The network one group of `axis` sees, for the NetModel closed forms: one
  // dimension per part, bandwidth divided by the stride (that many
  // interleaved groups share each link), latency times the stride, and twice
  // that on an open line (folded ring).
  NetModel group_model(MeshAxis a) const;

  // Over every group of `axis`; PP counts neighbours only (no wrap).
  HopStats hop_stats(MeshAxis a) const;

 private:
  int axis_offset(MeshAxis a, int idx) const;  // node offset contributed by an axis index

  NetModel net_;  // the whole topology
  Mesh mesh_;
  std::array<std::vector<AxisPart>, 3> parts_;
  std::array<std::vector<int>, 3> offset_;  // per axis: axis index -> node offset
  std::vector<int> dim_stride_;             // node id stride of each topology dim
};

}  // namespace tessera::parallel
