#include "parallel/mesh.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include "runtime/error.h"

namespace tessera::parallel {

const char* mesh_axis_name(MeshAxis a) {
  switch (a) {
    case MeshAxis::TP:
      return "tp";
    case MeshAxis::DP:
      return "dp";
    case MeshAxis::PP:
      return "pp";
  }
  return "?";
}

MeshOrder parse_mesh_order(const std::string& s) {
  MeshOrder o{};
  std::stringstream ss(s);
  std::string part;
  int n = 0, seen = 0;
  while (std::getline(ss, part, '-')) {
    MeshAxis a;
    if (part == "tp")
      a = MeshAxis::TP;
    else if (part == "dp")
      a = MeshAxis::DP;
    else if (part == "pp")
      a = MeshAxis::PP;
    else
      throw InvalidArgument("bad mesh order '" + s + "': expected a permutation of tp, dp, pp such as tp-dp-pp");
    int bit = 1 << static_cast<int>(a);
    if (n >= 3 || (seen & bit))
      throw InvalidArgument("bad mesh order '" + s + "': expected a permutation of tp, dp, pp such as tp-dp-pp");
    seen |= bit;
    o[n++] = a;
  }
  if (n != 3)
    throw InvalidArgument("bad mesh order '" + s + "': expected a permutation of tp, dp, pp such as tp-dp-pp");
  return o;
}

std::string mesh_order_name(const MeshOrder& o) {
  return std::string(mesh_axis_name(o[0])) + "-" + mesh_axis_name(o[1]) + "-" + mesh_axis_name(o[2]);
}

Mesh::Mesh(MeshShape shape, MeshOrder order) : size_{shape.tp, shape.dp, shape.pp}, order_(order) {
  TESSERA_ARG_CHECK(shape.tp >= 1 && shape.dp >= 1 && shape.pp >= 1, "mesh sizes must be positive (tp=", shape.tp,
                    ", dp=", shape.dp, ", pp=", shape.pp, ")");
  int seen = 0;
  for (MeshAxis a : order_) seen |= 1 << static_cast<int>(a);
  TESSERA_ARG_CHECK(seen == 7, "mesh order must name tp, dp and pp once each");
  int s = 1;
  for (MeshAxis a : order_) {
    stride_[static_cast<int>(a)] = s;
    s *= size(a);
  }
}

MeshCoord Mesh::coord(int rank) const {
  TESSERA_ARG_CHECK(rank >= 0 && rank < world_size(), "rank ", rank, " outside 0..", world_size() - 1);
  MeshCoord c;
  for (MeshAxis a : order_) {
    c.get(a) = rank % size(a);
    rank /= size(a);
  }
  return c;
}

int Mesh::rank(const MeshCoord& c) const {
  int r = 0;
  for (MeshAxis a : {MeshAxis::TP, MeshAxis::DP, MeshAxis::PP}) {
    TESSERA_ARG_CHECK(c.get(a) >= 0 && c.get(a) < size(a), mesh_axis_name(a), " coordinate ", c.get(a), " outside 0..",
                      size(a) - 1);
    r += c.get(a) * stride_[static_cast<int>(a)];
  }
  return r;
}

std::vector<int> Mesh::group(MeshAxis axis, int rank) const {
  MeshCoord c = coord(rank);
  std::vector<int> g(static_cast<size_t>(size(axis)));
  for (int i = 0; i < size(axis); ++i) {
    c.get(axis) = i;
    g[static_cast<size_t>(i)] = this->rank(c);
  }
  return g;
}

std::vector<std::vector<int>> Mesh::groups(MeshAxis axis) const {
  std::vector<std::vector<int>> out;
  for (int r = 0; r < world_size(); ++r)
    if (coord(r).get(axis) == 0) out.push_back(group(axis, r));
  return out;
}

// ---- placement ----------------------------------------------------------------------

namespace {

using Tuple = std::vector<int>;

// Reflected mixed-radix (boustrophedon) order: consecutive tuples differ by
// one in exactly one digit. Digit 0 varies fastest.
std::vector<Tuple> snake(const std::vector<int>& ext) {
  std::vector<Tuple> out = {Tuple{}};
  for (int e : ext) {
    std::vector<Tuple> next;
    next.reserve(out.size() * static_cast<size_t>(e));
    for (int j = 0; j < e; ++j) {
      auto emit = [&](const Tuple& t) {
        Tuple u = t;
        u.push_back(j);
        next.push_back(std::move(u));
      };
      if (j % 2 == 0)
        for (const auto& t : out) emit(t);
      else
        for (auto it = out.rbegin(); it != out.rend(); ++it) emit(*it);
    }
    out = std::move(next);
  }
  return out;
}

// An order of the sub-box `parts` in which consecutive tuples, and the last
// and the first, are neighbours whenever a one-hop cycle exists in the ways
// constructed here: one wrapping part (0..e-1), or a grid with an even side
// (row 0 left to right, rows 1..L-1 snaking over columns 1..E-1, then back up
// column 0). An open line of more than two is folded (0, 2, 4, ..., 3, 1:
// two hops per step, every link used once per direction) when `fold_lines`
// (rings of collectives); a pipeline keeps it straight. Otherwise a snake.
std::vector<Tuple> cycle_order(const std::vector<AxisPart>& parts, bool fold_lines) {
  const size_t np = parts.size();
  std::vector<int> active;
  for (size_t i = 0; i < np; ++i)
    if (parts[i].extent > 1) active.push_back(static_cast<int>(i));
  auto full = [&](const std::vector<std::pair<int, int>>& digits) {
    Tuple t(np, 0);
    for (auto [i, v] : digits) t[static_cast<size_t>(i)] = v;
    return t;
  };
  std::vector<Tuple> out;
  if (active.empty()) return {Tuple(np, 0)};
  if (active.size() == 1) {
    int i = active[0];
    int e = parts[static_cast<size_t>(i)].extent;
    if (parts[static_cast<size_t>(i)].wraps || e <= 2 || !fold_lines) {
      for (int v = 0; v < e; ++v) out.push_back(full({{i, v}}));
    } else {
      for (int v = 0; v < e; v += 2) out.push_back(full({{i, v}}));
      for (int v = (e % 2 == 0) ? e - 1 : e - 2; v >= 1; v -= 2) out.push_back(full({{i, v}}));
    }
    return out;
  }
  int row = -1;
  for (int i : active)
    if (parts[static_cast<size_t>(i)].extent % 2 == 0) {
      row = i;
      break;
    }
  std::vector<int> col_parts, col_ext;
  for (int i : active)
    if (i != row || row < 0) {
      col_parts.push_back(i);
      col_ext.push_back(parts[static_cast<size_t>(i)].extent);
    }
  std::vector<Tuple> cols = snake(col_ext);
  auto at = [&](int r, int c) {
    Tuple t(np, 0);
    for (size_t k = 0; k < col_parts.size(); ++k)
      t[static_cast<size_t>(col_parts[k])] = cols[static_cast<size_t>(c)][k];
    if (row >= 0) t[static_cast<size_t>(row)] = r;
    return t;
  };
  if (row < 0) {  // every side odd: no one-hop cycle on a grid; a snake path
    for (size_t c = 0; c < cols.size(); ++c) out.push_back(at(0, static_cast<int>(c)));
    return out;
  }
  const int L = parts[static_cast<size_t>(row)].extent;
  const int E = static_cast<int>(cols.size());
  for (int c = 0; c < E; ++c) out.push_back(at(0, c));
  for (int r = 1; r < L; ++r) {
    if (r % 2 == 1)
      for (int c = E - 1; c >= 1; --c) out.push_back(at(r, c));
    else
      for (int c = 1; c < E; ++c) out.push_back(at(r, c));
  }
  for (int r = L - 1; r >= 1; --r) out.push_back(at(r, 0));
  return out;
}

}  // namespace

Placement::Placement(const Topology& topo, const Mesh& mesh) : net_(topo.net_model()), mesh_(mesh) {
  const auto& dims = topo.dims();
  TESSERA_ARG_CHECK(mesh.world_size() == topo.num_cores(), "tp*pp*dp = ", mesh.tp(), "*", mesh.pp(), "*", mesh.dp(),
                    " = ", mesh.world_size(), " is not the ", topo.num_cores(), " cores of topology '", topo.name(),
                    "'");
  dim_stride_.resize(dims.size());
  int s = 1;
  for (size_t d = 0; d < dims.size(); ++d) {
    dim_stride_[d] = s;
    s *= dims[d].net.size;
  }
  std::vector<int> cap(dims.size()), used(dims.size(), 1);
  for (size_t d = 0; d < dims.size(); ++d) cap[d] = dims[d].net.size;
  for (MeshAxis a : {MeshAxis::TP, MeshAxis::PP, MeshAxis::DP}) {
    int need = mesh.size(a);
    auto& parts = parts_[static_cast<int>(a)];
    // PP first looks at dimensions nobody uses yet, so that consecutive stages
    // are one hop apart (stride 1); TP and DP fill dimensions in order.
    std::vector<size_t> visit;
    if (a == MeshAxis::PP)
      for (size_t d = 0; d < dims.size(); ++d)
        if (used[d] == 1) visit.push_back(d);
    for (size_t d = 0; d < dims.size(); ++d) visit.push_back(d);
    for (size_t d : visit) {
      if (need <= 1) break;
      int g = std::gcd(need, cap[d]);
      if (g <= 1) continue;
      AxisPart p;
      p.dim = static_cast<int>(d);
      p.extent = g;
      p.stride = used[d];
      p.wraps = dims[d].net.kind == LinkKind::Switch ||
                (dims[d].net.kind == LinkKind::Ring && g * used[d] == dims[d].net.size);
      parts.push_back(p);
      used[d] *= g;
      cap[d] /= g;
      need /= g;
    }
    // gcd allocation works prime by prime: each axis takes every factor of a
    // prime it needs from the dimensions that still have it, and the axes'
    // exponents sum to the dimensions' (world = cores), so it never runs short.
    TESSERA_CHECK_EQ(need, 1, "placement of ", mesh_axis_name(a), " ran out of torus factors");
  }
  for (MeshAxis a : {MeshAxis::TP, MeshAxis::PP, MeshAxis::DP}) {
    auto& parts = parts_[static_cast<int>(a)];
    // Keep each axis's parts in dimension order (fastest first), as the
    // NetModel closed forms expect.
    std::sort(parts.begin(), parts.end(), [](const AxisPart& x, const AxisPart& y) { return x.dim < y.dim; });
    std::vector<Tuple> order = cycle_order(parts, a != MeshAxis::PP);
    TESSERA_CHECK_EQ(static_cast<int>(order.size()), mesh.size(a));
    auto& off = offset_[static_cast<int>(a)];
    off.resize(order.size());
    for (size_t i = 0; i < order.size(); ++i) {
      int o = 0;
      for (size_t k = 0; k < parts.size(); ++k)
        o += order[i][k] * parts[k].stride * dim_stride_[static_cast<size_t>(parts[k].dim)];
      off[i] = o;
    }
  }
}

int Placement::node(int rank) const {
  MeshCoord c = mesh_.coord(rank);
  return offset_[0][static_cast<size_t>(c.tp)] + offset_[1][static_cast<size_t>(c.dp)] +
         offset_[2][static_cast<size_t>(c.pp)];
}

std::vector<int> Placement::coords(int rank) const { return net_.coords(node(rank)); }

NetModel Placement::group_model(MeshAxis a) const {
  const auto& dims = net_.dims();
  if (mesh_.size(a) <= 1) return NetModel();
  std::vector<NetDim> out;
  for (const auto& p : parts(a)) {
    if (p.extent <= 1) continue;
    const NetDim& d = dims[static_cast<size_t>(p.dim)];
    NetDim nd;
    nd.size = p.extent;
    if (d.kind == LinkKind::Switch) {
      nd.kind = LinkKind::Switch;
      nd.bandwidth = d.bandwidth;
      nd.latency = d.latency;
    } else {
      bool folded = !p.wraps && p.extent > 2;
      nd.kind = folded ? LinkKind::Line : LinkKind::Ring;
      nd.bandwidth = d.bandwidth / p.stride;
      nd.latency = d.latency * p.stride * (folded ? 2 : 1);
    }
    out.push_back(nd);
  }
  return NetModel(std::move(out));
}

HopStats Placement::hop_stats(MeshAxis a) const {
  HopStats h;
  h.ring = a != MeshAxis::PP;
  const int n = mesh_.size(a);
  if (n <= 1) {
    h.one_hop_fraction = 1;
    return h;
  }
  long pairs = 0, total = 0, one = 0;
  for (int r = 0; r < mesh_.world_size(); ++r) {
    MeshCoord c = mesh_.coord(r);
    int i = c.get(a);
    if (i == n - 1 && !h.ring) continue;
    MeshCoord nxt = c;
    nxt.get(a) = (i + 1) % n;
    int hops = net_.hops_between(node(r), node(mesh_.rank(nxt)));
    if (n == 2 && h.ring && i == 1) continue;  // a pair of two is one link, not two
    h.max_hops = std::max(h.max_hops, hops);
    total += hops;
    one += hops == 1;
    ++pairs;
  }
  h.mean_hops = pairs ? static_cast<double>(total) / static_cast<double>(pairs) : 0;
  h.one_hop_fraction = pairs ? static_cast<double>(one) / static_cast<double>(pairs) : 1;
  return h;
}

}  // namespace tessera::parallel
