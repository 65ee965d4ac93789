#include "collectives/coll_cost.h"

#include <algorithm>

#include "collectives/reduce.h"
#include "collectives/transport.h"

namespace tessera::collectives {

namespace {

// The element count of block i of n split into `parts` (the algorithms' split).
size_t part_len(size_t n, int parts, int i) {
  const size_t b = n / static_cast<size_t>(parts), r = n % static_cast<size_t>(parts);
  return b + (static_cast<size_t>(i) < r ? 1 : 0);
}
size_t part_off(size_t n, int parts, int i) {
  const size_t b = n / static_cast<size_t>(parts), r = n % static_cast<size_t>(parts);
  const size_t ui = static_cast<size_t>(i);
  return ui * b + std::min(ui, r);
}

std::vector<int> identity(int p) {
  std::vector<int> v(static_cast<size_t>(p));
  for (int i = 0; i < p; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

// Group ranks along torus dim i through group rank 0, ordered by coordinate.
std::vector<int> torus_line(const TorusShape& ts, int i) {
  int stride = 1;
  for (int j = 0; j < i; ++j) stride *= ts.extent[static_cast<size_t>(j)];
  const int k = ts.extent[static_cast<size_t>(i)], me = ts.linear[0], my = ts.coord[0][static_cast<size_t>(i)];
  std::vector<int> m(static_cast<size_t>(k));
  for (int t = 0; t < k; ++t) {
    const int lin = me + (t - my) * stride;
    m[static_cast<size_t>(t)] = ts.rank_of_linear[static_cast<size_t>(lin)];
  }
  return m;
}

// The torus algorithm's schedule (TorusAlgorithm in algorithms.cc) as seen
// from group rank 0: reduce-scatter from the slowest dim to the fastest,
// all-gather back; `block` bytes per linear block.
double torus_reduce_scatter(const GroupCostModel& g, double block) {
  const TorusShape& ts = g.torus;
  double t = 0;
  int glo = 0, ghi = g.size;
  for (int i = static_cast<int>(ts.extent.size()) - 1; i >= 0; --i) {
    const int k = ts.extent[static_cast<size_t>(i)], sz = (ghi - glo) / k;
    const std::vector<int> m = torus_line(ts, i);
    t += ring_phase_seconds(g.links, m.data(), k, sz * block);
    glo += ts.coord[0][static_cast<size_t>(i)] * sz;
    ghi = glo + sz;
  }
  return t;
}
double torus_all_gather(const GroupCostModel& g, double block) {
  const TorusShape& ts = g.torus;
  double t = 0;
  int span = 1;
  for (size_t i = 0; i < ts.extent.size(); ++i) {
    const int k = ts.extent[i];
    const std::vector<int> m = torus_line(ts, static_cast<int>(i));
    t += ring_phase_seconds(g.links, m.data(), k, span * block);
    span *= k;
  }
  return t;
}

}  // namespace

double ring_phase_seconds(const LinkCosts& links, const int* members, int m, double block_bytes) {
  if (m <= 1) return 0;
  double step = 0;
  for (int i = 0; i < m; ++i) step = std::max(step, links.time(members[i], members[(i + 1) % m], block_bytes));
  return (m - 1) * step;
}

double gather_from_peers_seconds(const LinkCosts& links, int p, double per_peer_bytes) {
  double worst = 0;
  for (int a = 0; a < p; ++a) {
    double t = 0;
    for (int j = 0; j < p; ++j)
      if (j != a) t += links.time(j, a, per_peer_bytes);
    worst = std::max(worst, t);
  }
  return worst;
}

double rhd_all_reduce_seconds(const LinkCosts& links, int p, size_t n, size_t es) {
  if (p <= 1) return 0;
  int pp = 1;
  while (pp * 2 <= p) pp *= 2;
  const int rem = p - pp;
  auto real = [&](int nr) { return nr < rem ? 2 * nr + 1 : nr + rem; };
  double fold = 0;
  for (int e = 0; e < 2 * rem; e += 2) fold = std::max(fold, links.time(e, e + 1, static_cast<double>(n * es)));
  double t = 2 * fold;
  // Every level's exchanges run concurrently; halving level l moves the
  // first pp >> (l + 1) blocks' worth per pair, doubling the same in reverse.
  for (int lvl = 0, mask = pp / 2; mask >= 1; mask /= 2, ++lvl) {
    const int hi = std::max(1, pp >> (lvl + 1));
    const size_t len = part_off(n, pp, hi - 1) + part_len(n, pp, hi - 1);
    double worst = 0;
    for (int a = 0; a < pp; ++a)
      worst = std::max(worst, links.time(real(a), real(a ^ mask), static_cast<double>(len * es)));
    t += 2 * worst;
  }
  return t;
}

double tree_seconds(const LinkCosts& links, int p, int root, double bytes) {
  double t = 0;
  for (int m = 1; m < p; m <<= 1) {
    double r = 0;
    for (int v = 0; v < m && v + m < p; ++v) r = std::max(r, links.time((v + root) % p, (v + m + root) % p, bytes));
    t += r;
  }
  return t;
}

GroupCostModel group_cost_model(const NetModel& net, const std::vector<int>& nodes, bool shared_memory) {
  GroupCostModel g;
  g.size = static_cast<int>(nodes.size());
  TESSERA_ARG_CHECK(g.size >= 1, "a group needs at least one member");
  if (net.dims().empty()) {
    g.net = NetModel::default_ring(g.size);
    g.nodes = identity(g.size);
  } else {
    g.net = net;
    g.nodes = nodes;
  }
  g.links = LinkCosts(g.net, g.nodes);
  g.torus = torus_shape(g.net, g.nodes);
  g.shared_memory = shared_memory;
  return g;
}

double p2p_seconds(const GroupCostModel& g, int a, int b, double bytes) { return g.links.time(a, b, bytes); }

CollPrediction predict(CollKind kind, size_t count, DType dtype, const GroupCostModel& g) {
  const int p = g.size;
  const bool reducing = kind == CollKind::AllReduce || kind == CollKind::ReduceScatter || kind == CollKind::Reduce;
  const size_t es = (reducing && !kernel_dtype(dtype)) ? 4 : dtype_size(dtype);
  const size_t bytes = count * es;
  const double b = static_cast<double>(bytes);
  const bool multi_dim = g.torus.valid && g.torus.extent.size() >= 2;
  Algorithm* cands[kMaxCandidates];
  const int n = algorithm_candidates(kind, bytes, multi_dim, /*multi_host=*/false, "", cands);
  for (int i = 0; i < n; ++i) {
    const std::string name = cands[i]->name();
    if (name == "flat") {
      if (!g.shared_memory || kind != CollKind::Broadcast) continue;
      double t = 0;  // the root writes to each peer in turn
      for (int a = 1; a < p; ++a) t += g.links.time(0, a, b);
      return {name, t};
    }
    if (name == "oneshot") {
      const size_t published = kind == CollKind::ReduceScatter ? bytes * static_cast<size_t>(p) : bytes;
      if (!g.shared_memory || published > SharedMemoryPeers::kInlineBytes) continue;
      if (kind != CollKind::Broadcast && bytes > oneshot_max_bytes(p)) continue;
      if (kind == CollKind::AllReduce || kind == CollKind::AllGather || kind == CollKind::ReduceScatter)
        return {name, p == 1 ? 0.0 : gather_from_peers_seconds(g.links, p, b)};
      if (kind == CollKind::Broadcast) {
        double worst = 0;
        for (int a = 1; a < p; ++a) worst = std::max(worst, g.links.time(0, a, b));
        return {name, worst};
      }
    } else if (name == "direct") {
      if (!g.shared_memory) continue;
      if (kind == CollKind::Barrier) return {name, 0.0};
      if (p == 1 || p > 64) continue;
      if (kind == CollKind::AllReduce)
        return {name, 2 * gather_from_peers_seconds(g.links, p, static_cast<double>(part_len(count, p, 0) * es))};
      if (kind == CollKind::AllGather || kind == CollKind::ReduceScatter)
        return {name, gather_from_peers_seconds(g.links, p, b)};
      if (kind == CollKind::Broadcast) {
        if (bytes <= direct_broadcast_min_bytes(p)) continue;
        double worst = 0;
        for (int a = 0; a < p; ++a) worst = std::max(worst, g.links.time(0, a, b));
        return {name, worst};
      }
    } else if (name == "torus") {
      const TorusShape& ts = g.torus;
      if (!ts.valid || std::any_of(ts.extent.begin(), ts.extent.end(), [](int e) { return e > 64; })) continue;
      if (p == 1) return {name, 0.0};
      if (kind == CollKind::AllReduce) {
        // The larger half, on rings in one direction (the other runs at once).
        const double blk = static_cast<double>(part_len((count + 1) / 2, p, 0) * es);
        return {name, torus_reduce_scatter(g, blk) + torus_all_gather(g, blk)};
      }
      if (!ts.identity) continue;
      if (kind == CollKind::ReduceScatter) return {name, torus_reduce_scatter(g, b)};
      if (kind == CollKind::AllGather) return {name, torus_all_gather(g, b)};
    } else if (name == "rhd") {
      if (kind == CollKind::AllReduce) return {name, rhd_all_reduce_seconds(g.links, p, count, es)};
    } else if (name == "ring") {
      const std::vector<int> all = identity(p);
      if (kind == CollKind::AllReduce)
        return {name, 2 * ring_phase_seconds(g.links, all.data(), p, static_cast<double>(part_len(count, p, 0) * es))};
      if (kind == CollKind::ReduceScatter || kind == CollKind::AllGather)
        return {name, ring_phase_seconds(g.links, all.data(), p, b)};
    } else if (name == "tree") {
      if (kind == CollKind::Broadcast || kind == CollKind::Reduce) return {name, tree_seconds(g.links, p, 0, b)};
    } else if (name == "pairwise") {
      double t = 0;
      for (int s = 1; s < p; ++s) {
        double w = 0;
        for (int a = 0; a < p; ++a) w = std::max(w, g.links.time(a, (a + s) % p, b));
        t += w;
      }
      return {name, t};
    } else if (name == "dissemination") {
      double t = 0;
      for (int d = 1; d < p; d <<= 1) {
        double w = 0;
        for (int a = 0; a < p; ++a) w = std::max(w, g.links.time(a, (a + d) % p, 0));
        t += w;
      }
      return {name, t};
    }
    // hier, hier_rd: groups spanning hosts only; the next candidate serves.
  }
  throw InvalidArgument(detail::concat("no algorithm predicted for ", coll_kind_name(kind), " over ", p, " ranks"));
}

}  // namespace tessera::collectives
