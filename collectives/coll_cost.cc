#include "collectives/coll_cost.h"

#include <algorithm>
#include <cstdlib>

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
}  // namespace

double ring_phase_seconds(const LinkCosts& links, const int* members, int m, double block_bytes) {
  if (m <= 1) return 0;
  double step = 0;
  for (int i = 0; i < m; ++i) step = std::max(step, links.time(members[i], members[(i + 1) % m], block_bytes));
  return (m - 1) * step;
}

double gather_from_peers_seconds(const LinkCosts& links, int p, double per_peer_bytes) {
  TESSERA_CHECK_EQ(p, links.size());
  double worst = 0;
  for (int a = 0; a < p; ++a) worst = std::max(worst, links.from_all_peers(a, per_peer_bytes));
  return worst;
}

double PowerOfTwoFold::seconds(const LinkCosts& links, double bytes) const {
  double fold = 0;
  for (int e = 0; e < 2 * rem; e += 2) fold = std::max(fold, links.time(e, e + 1, bytes));
  return 2 * fold;
}

double rhd_all_reduce_seconds(const LinkCosts& links, int p, size_t n, size_t es) {
  if (p <= 1) return 0;
  const PowerOfTwoFold f(p);
  const int pp = f.pp;
  double t = f.seconds(links, static_cast<double>(n * es));
  // Every level's exchanges run concurrently; halving level l moves the
  // first pp >> (l + 1) blocks' worth per pair, doubling the same in reverse.
  for (int lvl = 0, mask = pp / 2; mask >= 1; mask /= 2, ++lvl) {
    const int hi = std::max(1, pp >> (lvl + 1));
    const size_t len = part_off(n, pp, hi - 1) + part_len(n, pp, hi - 1);
    double worst = 0;
    for (int a = 0; a < pp; ++a)
      worst = std::max(worst, links.time(f.real(a), f.real(a ^ mask), static_cast<double>(len * es)));
    t += 2 * worst;
  }
  return t;
}

double rd_all_reduce_seconds(const LinkCosts& links, int p, size_t n, size_t es) {
  if (p <= 1) return 0;
  const PowerOfTwoFold f(p);
  const double bytes = static_cast<double>(n * es);
  // Every exchange is of the whole vector.
  return f.seconds(links, bytes) + doubling_seconds(
                                       links, f.pp, [&](int i) { return f.real(i); }, bytes);
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

namespace {
// Between hosts (instances) of the default model: EFA, 800 Gbps per trn1
// instance (shared/REFERENCES.md), shared by the host's ranks that cross at
// once; its latency is an assumption (REFERENCES.md gives none).
constexpr double kDefaultInstanceBandwidth = 800e9 / 8;
constexpr double kDefaultInstanceLatency = 10e-6;

// Measured link figures for the default model in place of the assumed ones
// (e.g. from a ping-pong on the machine at hand, docs/algorithms.md):
// TESSERA_NET_INTRA_HOST (links inside a host) and TESSERA_NET_INTER_HOST (a
// link between two ranks on different hosts), each "ALPHA_US" or
// "ALPHA_US,GB_PER_S" (one-way latency; bandwidth per direction). 0: unset.
struct LinkFigures {
  double latency = 0, bandwidth = 0;
};
LinkFigures env_link_figures(const char* var) {
  LinkFigures f;
  const char* v = std::getenv(var);
  if (!v || !*v) return f;
  char* end = nullptr;
  const double us = std::strtod(v, &end);
  double gbps = 0;
  bool ok = end != v && us > 0 && us < 1e6;
  if (ok && *end == ',') {
    const char* b = end + 1;
    gbps = std::strtod(b, &end);
    ok = end != b && gbps > 0;
  }
  TESSERA_ARG_CHECK(ok && *end == '\0', var, "='", v,
                    "': expected ALPHA_US or ALPHA_US,GB_PER_S (one-way latency in microseconds below 1e6, "
                    "bandwidth in GB/s), both positive");
  f.latency = us * 1e-6;
  f.bandwidth = gbps * 1e9;
  return f;
}
}  // namespace

GroupCostModel group_cost_model(const NetModel& net, const std::vector<int>& nodes, bool shared_memory,
                                const HostMap* hosts, int rank, bool host_shared_memory) {
  GroupCostModel g;
  g.size = static_cast<int>(nodes.size());
  TESSERA_ARG_CHECK(g.size >= 1, "a group needs at least one member");
  const bool default_model = net.dims().empty();
  if (default_model) {
    const LinkFigures in = env_link_figures("TESSERA_NET_INTRA_HOST");
    g.net = NetModel::ring(g.size, in.bandwidth > 0 ? in.bandwidth : NetModel::kDefaultLinkBandwidth,
                           in.latency > 0 ? in.latency : NetModel::kDefaultLinkLatency);
    g.nodes = identity(g.size);
  } else {
    g.net = net;
    g.nodes = nodes;
  }
  g.links = LinkCosts(g.net, g.nodes);
  const std::vector<int>* host_of = hosts && !hosts->host_of.empty() ? &hosts->host_of : nullptr;
  if (host_of)
    TESSERA_ARG_CHECK(static_cast<int>(host_of->size()) == g.size && rank >= 0 && rank < g.size, "host map of ",
                      host_of->size(), " ranks for a group of ", g.size);
  // The default model has two levels when the group spans hosts: NeuronLink
  // inside a host, the instance network between hosts.
  if (default_model && host_of) {
    const LinkFigures x = env_link_figures("TESSERA_NET_INTER_HOST");
    int local = 0;
    for (int h : *host_of) local += h == (*host_of)[static_cast<size_t>(rank)] ? 1 : 0;
    // A measured bandwidth is of one link (rank pair) already.
    g.links.set_between_hosts(*host_of, x.bandwidth > 0 ? x.bandwidth : kDefaultInstanceBandwidth / std::max(1, local),
                              x.latency > 0 ? x.latency : kDefaultInstanceLatency);
  }
  g.torus = torus_shape(g.net, g.nodes);
  g.shared_memory = shared_memory;
  g.hosts = host_levels(hosts, 0);  // rank 0's view: every rank costs alike
  g.host_shared_memory = host_shared_memory;
  return g;
}

GroupCostModel group_cost_model(const NetModel& net, const std::vector<int>& nodes, bool shared_memory,
                                const std::vector<int>* host_of, int rank, bool host_shared_memory) {
  if (!host_of || host_of->empty())
    return group_cost_model(net, nodes, shared_memory, static_cast<const HostMap*>(nullptr), rank, host_shared_memory);
  HostMap hosts;
  hosts.host_of = *host_of;
  const int nh = 1 + *std::max_element(host_of->begin(), host_of->end());
  hosts.names.assign(static_cast<size_t>(nh), "");
  return group_cost_model(net, nodes, shared_memory, &hosts, rank, host_shared_memory);
}

double p2p_seconds(const GroupCostModel& g, int a, int b, double bytes) { return g.links.time(a, b, bytes); }

double algorithm_cost(const std::string& name, const GroupCostModel& g, const CostQuery& q) {
  const Algorithm* a = find_algorithm(name);
  TESSERA_ARG_CHECK(a != nullptr, "unknown collective algorithm '", name, "'");
  return a->cost(g, q);
}

CollPrediction predict(CollKind kind, size_t count, DType dtype, const GroupCostModel& g) {
  const bool reducing = kind == CollKind::AllReduce || kind == CollKind::ReduceScatter || kind == CollKind::Reduce;
  const size_t es = (reducing && !kernel_dtype(dtype)) ? 4 : dtype_size(dtype);
  const bool multi_dim = g.torus.valid && g.torus.extent.size() >= 2;
  Algorithm* cands[kMaxCandidates];
  const int n = algorithm_candidates(kind, count * es, multi_dim, g.hosts.valid, "", cands, &g, es);
  // The first candidate that would serve, as in the communicator.
  const CostQuery q{kind, count, es, 0, true};
  for (int i = 0; i < n; ++i) {
    const double t = cands[i]->cost(g, q);
    if (t >= 0) return {cands[i]->name(), t};
  }
  throw InvalidArgument(
      detail::concat("no algorithm predicted for ", coll_kind_name(kind), " over ", g.size, " ranks"));
}

}  // namespace tessera::collectives
