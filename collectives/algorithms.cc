#include "collectives/algorithms.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <new>
#include <numeric>
#include <set>
#include <unordered_map>
#include <utility>

#include "collectives/coll_cost.h"
#include "collectives/host.h"
#include "collectives/reduce.h"

namespace tessera::collectives {

const char* coll_kind_name(CollKind k) {
  switch (k) {
    case CollKind::AllReduce:
      return "all_reduce";
    case CollKind::ReduceScatter:
      return "reduce_scatter";
    case CollKind::AllGather:
      return "all_gather";
    case CollKind::Broadcast:
      return "broadcast";
    case CollKind::Reduce:
      return "reduce";
    case CollKind::AllToAll:
      return "all_to_all";
    case CollKind::Barrier:
      return "barrier";
  }
  return "?";
}

bool Algorithm::run(AlgoContext& ctx, const CollCall& call) {
  CostQuery q{call.kind, call.count, dtype_size(call.dtype), call.root, true};
  if (cost(*ctx.group, q) < 0) return false;
  ctx.buffers_shared = true;
  if (!execute(ctx, call)) return false;
  q.buffers_shared = ctx.buffers_shared;
  const double t = cost(*ctx.group, q);
  TESSERA_CHECK(t >= 0, name(), " served a call its cost function declines");
  ctx.model += t;
  return true;
}

LinkCosts::LinkCosts(const NetModel& net, const std::vector<int>& nodes)
    : p_(static_cast<int>(nodes.size())), dims_(net.dims()) {
  const size_t nd = dims_.size();
  coord_.assign(nodes.size() * nd, 0);
  for (size_t r = 0; r < nodes.size(); ++r) {
    int node = nodes[r];
    for (size_t i = 0; i < nd; ++i) {
      coord_[r * nd + i] = node % dims_[i].size;
      node /= dims_[i].size;
    }
  }
  sum_peers();
}

void LinkCosts::sum_peers() {
  const size_t p = static_cast<size_t>(p_), nd = dims_.size();
  peer_lat_.assign(p, 0.0);
  peer_inv_bw_.assign(p, 0.0);
  // Ranks on one host see each other through the network dims, the others
  // through the instance network (no host map: one host).
  std::map<int, std::vector<int>> by_host;
  for (int r = 0; r < p_; ++r) by_host[host_of_.empty() ? 0 : host_of_[static_cast<size_t>(r)]].push_back(r);
  // Dims by bandwidth, slowest first: the first dim along which two ranks
  // differ in this order sets their pair's bandwidth (a zero one: no bytes term).
  std::vector<size_t> order(nd);
  for (size_t i = 0; i < nd; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return dims_[x].bandwidth < dims_[y].bandwidth; });
  std::vector<int> count;
  std::vector<double> hops;
  std::unordered_map<int64_t, int> prefix;  // members by their coordinates on order[0..k]
  for (const auto& [host, members] : by_host) {
    const double others = static_cast<double>(p - members.size());
    for (int r : members) {
      peer_lat_[static_cast<size_t>(r)] = others * host_lat_;
      peer_inv_bw_[static_cast<size_t>(r)] = host_bw_ > 0 ? others / host_bw_ : 0.0;
    }
    // Latency: per dim, the hops from each coordinate to every member's.
    for (size_t i = 0; i < nd; ++i) {
      const NetDim& d = dims_[i];
      count.assign(static_cast<size_t>(d.size), 0);
      for (int r : members) ++count[static_cast<size_t>(coord_[static_cast<size_t>(r) * nd + i])];
      hops.assign(static_cast<size_t>(d.size), 0.0);
      for (int y = 0; y < d.size; ++y) {
        double h = 0;
        for (int x = 0; x < d.size; ++x) {
          if (count[static_cast<size_t>(x)] == 0 || x == y) continue;
          const int diff = std::abs(x - y);
          const int n = d.kind == LinkKind::Switch ? 1
                        : d.kind == LinkKind::Ring ? std::min(diff, d.size - diff)
                                                   : diff;
          h += static_cast<double>(n) * count[static_cast<size_t>(x)];
        }
        hops[static_cast<size_t>(y)] = h * d.latency;
      }
      for (int r : members)
        peer_lat_[static_cast<size_t>(r)] += hops[static_cast<size_t>(coord_[static_cast<size_t>(r) * nd + i])];
    }
    // Bandwidth: agree[r] members (r itself included) share r's
    // coordinates on the dims before order[k]; those that also share
    // order[k]'s leave, and the rest first differ from r there.
    // key[m]: member m's coordinates on order[0..k], mixed radix (< the node count).
    std::vector<int> agree(members.size(), static_cast<int>(members.size()));
    std::vector<int64_t> key(members.size(), 0);
    for (size_t k = 0; k < nd; ++k) {
      const size_t dim = order[k];
      prefix.clear();
      for (size_t m = 0; m < members.size(); ++m) {
        key[m] = key[m] * dims_[dim].size + coord_[static_cast<size_t>(members[m]) * nd + dim];
        ++prefix[key[m]];
      }
      const double bw = dims_[dim].bandwidth;
      for (size_t m = 0; m < members.size(); ++m) {
        const int still = prefix[key[m]];
        if (bw > 0) peer_inv_bw_[static_cast<size_t>(members[m])] += (agree[m] - still) / bw;
        agree[m] = still;
      }
    }
  }
}

double LinkCosts::time(int from, int to, double bytes) const {
  if (from == to) return 0.0;
  if (!host_of_.empty() && host_of_[static_cast<size_t>(from)] != host_of_[static_cast<size_t>(to)])
    return host_lat_ + (host_bw_ > 0 ? bytes / host_bw_ : 0.0);
  // NetModel::p2p_time: the hops' latencies, the slowest dimension crossed.
  const size_t nd = dims_.size();
  const int* a = coord_.data() + static_cast<size_t>(from) * nd;
  const int* b = coord_.data() + static_cast<size_t>(to) * nd;
  double lat = 0, bw = 0;
  for (size_t i = 0; i < nd; ++i) {
    if (a[i] == b[i]) continue;
    const NetDim& d = dims_[i];
    const int diff = std::abs(a[i] - b[i]);
    const int h = d.kind == LinkKind::Switch ? 1 : d.kind == LinkKind::Ring ? std::min(diff, d.size - diff) : diff;
    lat += h * d.latency;
    bw = bw == 0 ? d.bandwidth : std::min(bw, d.bandwidth);
  }
  return lat + (bw > 0 ? bytes / bw : 0.0);
}

void LinkCosts::set_between_hosts(const std::vector<int>& host_of, double bandwidth, double latency) {
  TESSERA_CHECK_EQ(static_cast<int>(host_of.size()), p_);
  host_of_ = host_of;
  host_bw_ = bandwidth;
  host_lat_ = latency;
  sum_peers();
}

TorusShape torus_shape(const NetModel& net, const std::vector<int>& nodes) {
  TorusShape s;
  const int p = static_cast<int>(nodes.size());
  const auto& dims = net.dims();
  if (dims.empty() || p == 0) return s;
  for (int n : nodes)
    if (n < 0 || n >= net.num_nodes()) return s;
  std::vector<std::vector<int>> c(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) c[r] = net.coords(nodes[r]);
  std::vector<std::vector<int>> values;
  for (size_t i = 0; i < dims.size(); ++i) {
    std::set<int> v;
    for (int r = 0; r < p; ++r) v.insert(c[r][i]);
    if (v.size() > 1) {
      s.dim_index.push_back(static_cast<int>(i));
      values.emplace_back(v.begin(), v.end());
      s.extent.push_back(static_cast<int>(v.size()));
    }
  }
  int prod = 1;
  for (int e : s.extent) prod *= e;
  if (prod != p) return s;
  s.coord.assign(static_cast<size_t>(p), std::vector<int>(s.dim_index.size()));
  s.linear.assign(static_cast<size_t>(p), 0);
  s.rank_of_linear.assign(static_cast<size_t>(p), -1);
  for (int r = 0; r < p; ++r) {
    int lin = 0, stride = 1;
    for (size_t i = 0; i < s.dim_index.size(); ++i) {
      const auto& v = values[i];
      const int idx = static_cast<int>(std::lower_bound(v.begin(), v.end(), c[r][s.dim_index[i]]) - v.begin());
      s.coord[r][i] = idx;
      lin += idx * stride;
      stride *= s.extent[i];
    }
    if (s.rank_of_linear[lin] != -1) return TorusShape{};  // two members on one node
    s.linear[r] = lin;
    s.rank_of_linear[lin] = r;
  }
  s.identity = true;
  for (int r = 0; r < p; ++r) s.identity = s.identity && s.linear[r] == r;
  s.valid = true;
  return s;
}

void* Workspace::get(size_t bytes) {
  if (bytes <= bytes_) return p_;
  std::free(p_);
  // Grow by at least half again, so slowly growing sizes (variable buckets)
  // do not free, reallocate and re-fault the pages on every call.
  const size_t want = std::max({bytes, size_t{4096}, bytes_ + bytes_ / 2});
  const size_t b = (want + 4095) / 4096 * 4096;
  p_ = std::aligned_alloc(64, b);
  if (!p_) {
    bytes_ = 0;
    throw std::bad_alloc();
  }
  std::memset(p_, 0, b);  // fault the pages in now, once
  bytes_ = b;
  return p_;
}

Workspace::~Workspace() { std::free(p_); }

HostLevels host_levels(const HostMap* hosts, int rank) {
  HostLevels h;
  if (!hosts || hosts->host_of.empty()) return h;
  const std::vector<int>& of = hosts->host_of;
  const int p = static_cast<int>(of.size());
  const int nh = 1 + *std::max_element(of.begin(), of.end());
  std::vector<std::vector<int>> on(static_cast<size_t>(nh));
  for (int r = 0; r < p; ++r) on[static_cast<size_t>(of[r])].push_back(r);
  for (const auto& v : on)
    if (v.size() != on[0].size()) return h;
  if (nh < 2 || on[0].size() < 2) return h;
  h.local = on[static_cast<size_t>(of[rank])];
  h.local_pos = static_cast<int>(std::find(h.local.begin(), h.local.end(), rank) - h.local.begin());
  for (int k = 0; k < nh; ++k) h.cross.push_back(on[static_cast<size_t>(k)][static_cast<size_t>(h.local_pos)]);
  h.cross_pos = of[rank];
  const int L = static_cast<int>(on[0].size());
  h.host = of;
  h.index.assign(static_cast<size_t>(p), 0);
  h.by_local.assign(static_cast<size_t>(p), 0);
  for (int k = 0; k < nh; ++k)
    for (int i = 0; i < L; ++i) {
      const int r = on[static_cast<size_t>(k)][static_cast<size_t>(i)];
      h.index[static_cast<size_t>(r)] = i;
      h.by_local[static_cast<size_t>(i) * nh + k] = r;
    }
  h.crowded = hosts->crowded();
  h.valid = true;
  return h;
}

namespace {

struct Range {
  size_t off, len;  // elements
};

inline Range part(size_t n, int parts, int i) {
  const size_t b = n / static_cast<size_t>(parts), r = n % static_cast<size_t>(parts);
  const size_t ui = static_cast<size_t>(i);
  return {ui * b + std::min(ui, r), b + (ui < r ? 1 : 0)};
}

inline int mod(int a, int m) { return ((a % m) + m) % m; }

// Reduces each arriving fragment into dst = src op fragment.
class ReduceSink final : public RecvSink {
 public:
  ReduceSink(char* dst, const char* src, DType dt, ReduceOp op) : dst_(dst), src_(src), dt_(dt), op_(op) {}
  void consume(size_t off, const void* data, size_t bytes) override {
    const size_t es = dtype_size(dt_);
    TESSERA_CHECK_EQ(off % es, 0u);
    reduce2(dst_ + off, src_ + off, data, bytes / es, dt_, op_);
  }

 private:
  char* dst_;
  const char* src_;
  DType dt_;
  ReduceOp op_;
};

// Ring reduce-scatter among `members` (group ranks; this rank at position q):
// block(i) is the element range member i owns at the end. Local
// contributions are read from src, partial sums kept in dst (src may equal
// dst). Step s sends block q-s-1 and reduces the incoming block q-s-2 as its
// fragments arrive.
template <typename BlockFn>
void ring_reduce_scatter(AlgoContext& c, const int* members, int m, int q, BlockFn block, const char* src, char* dst,
                         DType dt, ReduceOp op, char* final_dst = nullptr) {
  const size_t es = dtype_size(dt);
  const int next = members[mod(q + 1, m)], prev = members[mod(q - 1, m)];
  for (int s = 0; s < m - 1; ++s) {
    const Range S = block(mod(q - s - 1, m)), R = block(mod(q - s - 2, m));
    const char* sp = (s == 0 ? src : dst) + S.off * es;
    char* rp = (s == m - 2 && final_dst) ? final_dst : dst + R.off * es;
    ReduceSink sink(rp, src + R.off * es, dt, op);
    c.transport->sendrecv_sink(next, sp, S.len * es, prev, R.len * es, sink, c.tag);
  }
}

// Ring all-gather: member i starts with block(i) of buf; step s sends block
// q-s and receives block q-s-1 in place.
template <typename BlockFn>
void ring_all_gather(AlgoContext& c, const int* members, int m, int q, BlockFn block, char* buf, size_t es) {
  const int next = members[mod(q + 1, m)], prev = members[mod(q - 1, m)];
  for (int s = 0; s < m - 1; ++s) {
    const Range S = block(mod(q - s, m)), R = block(mod(q - s - 1, m));
    c.transport->sendrecv(next, buf + S.off * es, S.len * es, prev, buf + R.off * es, R.len * es, c.tag);
  }
}

// The cost of either ring phase above: m - 1 steps, each of the largest
// block over the ring's slowest link.
template <typename BlockFn>
double ring_phase_cost(const LinkCosts& links, const int* members, int m, BlockFn block, size_t es) {
  size_t maxb = 0;
  for (int i = 0; i < m; ++i) maxb = std::max(maxb, block(i).len);
  return ring_phase_seconds(links, members, m, static_cast<double>(maxb * es));
}

void copy_if_needed(void* dst, const void* src, size_t bytes) {
  if (dst != src && bytes) std::memmove(dst, src, bytes);
}

bool pow2(int x) { return x > 0 && (x & (x - 1)) == 0; }
int log2i(int x) {
  int l = 0;
  while ((1 << (l + 1)) <= x) ++l;
  return l;
}

// Recursive doubling of the whole vector among m ranks, this one at `pos`
// (group_rank(i): the rank at position i): at distance 1, 2, ... m/2 each
// exchange sends `cur` and reduces the partner's vector with it, on arrival,
// into `next`; then the two swap, so `cur` holds the result (no copy per
// exchange). hier_rd's levels and rd.
template <typename RankFn>
void doubling_exchanges(AlgoContext& c, const CollCall& k, int m, int pos, RankFn group_rank, size_t bytes, char*& cur,
                        char*& next) {
  for (int mask = 1; mask < m; mask <<= 1) {
    const int partner = group_rank(pos ^ mask);
    ReduceSink sink(next, cur, k.dtype, k.op);
    c.transport->sendrecv_sink(partner, cur, bytes, partner, bytes, sink, c.tag);
    std::swap(cur, next);
  }
}

// The two buffers of `steps` combining steps that each reduce the current
// vector and the partner's into the other one (doubling_exchanges): the
// input is copied into whichever makes the last step land in `out`, so
// nothing is copied back. hier_rd and rd.
void alternate_from(const void* input, char* out, char* ws, size_t bytes, int steps, char*& cur, char*& next) {
  cur = steps % 2 == 1 ? ws : out;
  next = steps % 2 == 1 ? out : ws;
  copy_if_needed(cur, input, bytes);
}

// Binomial reduce of `bytes` to position 0 of m ranks, this one at `v`
// (rank_of(i): the rank at position i): at distance 1, 2, ... a rank with
// that bit set sends its partial sum, at first `input` itself (uncopied),
// and is done; the first receive combines straight from `input` into `acc`.
// Position 0 ends with the result in `acc`. hier_leader's reduce inside a
// host and tree's reduce.
template <typename RankFn>
void binomial_reduce(AlgoContext& c, const CollCall& k, int m, int v, RankFn rank_of, const char* input, char* acc,
                     size_t bytes) {
  const char* mine = input;
  for (int mask = 1; mask < m; mask <<= 1) {
    if (v & mask) {
      c.transport->send(rank_of(v - mask), c.tag, mine, bytes);
      return;
    }
    if (v + mask < m) {
      ReduceSink sink(acc, mine, k.dtype, k.op);
      c.transport->recv_sink(rank_of(v + mask), bytes, sink, c.tag);
      mine = acc;
    }
  }
  copy_if_needed(acc, mine, bytes);  // position 0 without children
}

// Binomial broadcast of `buf` from position 0 of m ranks (binomial_reduce's
// tree backwards): a rank receives from the position below its lowest set
// bit, then sends on at the distances below that. hier_leader and tree.
template <typename RankFn>
void binomial_broadcast(AlgoContext& c, int m, int v, RankFn rank_of, void* buf, size_t bytes) {
  int mask = 1;
  while (mask < m && !(v & mask)) mask <<= 1;
  if (v != 0) c.transport->recv(rank_of(v - mask), c.tag, buf, bytes);
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (v + mask < m) c.transport->send(rank_of(v + mask), c.tag, buf, bytes);
}

// Members 0..p-1 without allocating (p <= kMaxRanks).
constexpr int kMaxRanks = 4096;
const int* identity_members() {
  static const auto* ids = [] {
    auto* a = new int[kMaxRanks];
    for (int i = 0; i < kMaxRanks; ++i) a[i] = i;
    return a;
  }();
  return ids;
}

// ---------------------------------------------------------------- ring
class RingAlgorithm final : public Algorithm {
 public:
  const char* name() const override { return "ring"; }
  double cost(const GroupCostModel& g, const CostQuery& q) const override {
    // Groups beyond kMaxRanks are only ever costed (the planner's data-parallel
    // groups of a 65,536-core torus), never run: their member list is built here.
    std::vector<int> large;
    if (g.size > kMaxRanks) {
      large.resize(static_cast<size_t>(g.size));
      std::iota(large.begin(), large.end(), 0);
    }
    const int* all = large.empty() ? identity_members() : large.data();
    if (q.kind == CollKind::AllReduce)
      return 2 * ring_phase_cost(
                     g.links, all, g.size, [&](int i) { return part(q.count, g.size, i); }, q.elem);
    if (q.kind == CollKind::ReduceScatter || q.kind == CollKind::AllGather)
      return ring_phase_seconds(g.links, all, g.size, static_cast<double>(q.count * q.elem));
    return -1;
  }

 protected:
  bool execute(AlgoContext& c, const CollCall& k) override {
    const int p = c.size, r = c.rank;
    const size_t es = dtype_size(k.dtype);
    const int* all = identity_members();
    switch (k.kind) {
      case CollKind::AllReduce: {
        if (p == 1) return copy_if_needed(k.recv, k.send, k.count * es), true;
        auto blk = [&](int i) { return part(k.count, p, i); };
        ring_reduce_scatter(c, all, p, r, blk, static_cast<const char*>(k.send), static_cast<char*>(k.recv), k.dtype,
                            k.op);
        ring_all_gather(c, all, p, r, blk, static_cast<char*>(k.recv), es);
        return true;
      }
      case CollKind::ReduceScatter: {
        if (p == 1) return copy_if_needed(k.recv, k.send, k.count * es), true;
        auto blk = [&](int i) { return Range{static_cast<size_t>(i) * k.count, k.count}; };
        char* ws = static_cast<char*>(c.ws->get(static_cast<size_t>(p) * k.count * es));
        ring_reduce_scatter(c, all, p, r, blk, static_cast<const char*>(k.send), ws, k.dtype, k.op,
                            static_cast<char*>(k.recv));
        return true;
      }
      default: {  // all-gather (cost() declines the rest)
        char* buf = static_cast<char*>(k.recv);
        copy_if_needed(buf + static_cast<size_t>(r) * k.count * es, k.send, k.count * es);
        if (p == 1) return true;
        auto blk = [&](int i) { return Range{static_cast<size_t>(i) * k.count, k.count}; };
        ring_all_gather(c, all, p, r, blk, buf, es);
        return true;
      }
    }
  }
};

// Hierarchical all-gather, reduce-scatter and broadcast (same levels as
// hier all-reduce). The workspace holds the p blocks ordered [local index
// i][host k], so the H blocks of the ranks with local index i are one
// contiguous range for the ring inside the host.
class HierGather {
 public:
  // The cost of hier's all-gather, reduce-scatter and broadcast (rank 0's view).
  static double cost(const GroupCostModel& g, const CostQuery& q) {
    const HostLevels& h = g.hosts;
    const int L = static_cast<int>(h.local.size()), H = static_cast<int>(h.cross.size());
    const size_t es = q.elem, cnt = q.count;
    if (q.kind == CollKind::Broadcast) return broadcast_cost(g, q);
    if (q.kind != CollKind::AllGather && q.kind != CollKind::ReduceScatter) return -1;
    if (cnt == 0) return 0;  // nothing moves
    // A ring across hosts of one block each, and one inside the host of H blocks each.
    return ring_phase_seconds(g.links, h.cross.data(), H, static_cast<double>(cnt * es)) +
           ring_phase_seconds(g.links, h.local.data(), L, static_cast<double>(static_cast<size_t>(H) * cnt * es));
  }
  static bool execute(AlgoContext& c, const CollCall& k) {
    const HostLevels& h = *c.hosts;
    const int L = static_cast<int>(h.local.size()), H = static_cast<int>(h.cross.size());
    const int l = h.local_pos, me = h.cross_pos;
    const size_t es = dtype_size(k.dtype), cnt = k.count;
    if (k.kind == CollKind::Broadcast) return broadcast(c, k, h);
    // Nothing to move (the count is the same on every rank); the workspace of
    // 0 bytes is null, which memcpy must not see.
    if (cnt == 0) return true;
    // ws[i][j] = the block of group rank on(j, i).
    char* ws = static_cast<char*>(c.ws->get(static_cast<size_t>(L) * H * cnt * es));
    auto at = [&](int i, int j) { return ws + (static_cast<size_t>(i) * H + j) * cnt * es; };
    const std::vector<int>& rank_at = h.by_local;
    auto local_blk = [&](int i) { return Range{static_cast<size_t>(i) * H * cnt, static_cast<size_t>(H) * cnt}; };
    auto cross_blk = [&](int j) { return Range{(static_cast<size_t>(l) * H + j) * cnt, cnt}; };
    if (k.kind == CollKind::AllGather) {
      // 1. Across hosts among the ranks of local index l: H blocks.
      copy_if_needed(at(l, me), k.send, cnt * es);
      ring_all_gather(c, h.cross.data(), H, me, cross_blk, ws, es);
      // 2. Inside the host: the L groups of H blocks.
      ring_all_gather(c, h.local.data(), L, l, local_blk, ws, es);
      char* out = static_cast<char*>(k.recv);
      for (size_t b = 0; b < rank_at.size(); ++b)
        copy_if_needed(out + static_cast<size_t>(rank_at[b]) * cnt * es, ws + b * cnt * es, cnt * es);
      return true;
    }
    // Reduce-scatter. Pack the input in [i][j] order.
    const char* in = static_cast<const char*>(k.send);
    for (size_t b = 0; b < rank_at.size(); ++b)
      std::memcpy(ws + b * cnt * es, in + static_cast<size_t>(rank_at[b]) * cnt * es, cnt * es);
    // 1. Inside the host: rank l ends with the host's sum of group l's H blocks.
    ring_reduce_scatter(c, h.local.data(), L, l, local_blk, ws, ws, k.dtype, k.op);
    // 2. Across hosts: reduce-scatter of those H blocks; the last step lands in recv.
    ring_reduce_scatter(c, h.cross.data(), H, me, cross_blk, ws, ws, k.dtype, k.op, static_cast<char*>(k.recv));
    return true;
  }

 private:
  // The broadcast's three phases: the root's scatter of L blocks to its
  // host-mates (one transfer after another), a binomial tree across hosts
  // per block, an all-gather inside every host.
  static double broadcast_cost(const GroupCostModel& g, const CostQuery& q) {
    const HostLevels& h = g.hosts;
    const int L = static_cast<int>(h.local.size()), H = static_cast<int>(h.cross.size());
    const int root_host = h.host[static_cast<size_t>(q.root)], root_l = h.index[static_cast<size_t>(q.root)];
    auto on = [&](int i, int host) { return h.by_local[static_cast<size_t>(i) * H + host]; };
    auto blk = [&](int i) { return part(q.count, L, i); };
    size_t maxb = 0;
    for (int i = 0; i < L; ++i) maxb = std::max(maxb, blk(i).len * q.elem);
    double t = 0;
    for (int i = 0; i < L; ++i)
      if (i != root_l) t += g.links.time(on(root_l, root_host), on(i, root_host), static_cast<double>(maxb));
    auto real = [&](int v) { return on(0, (v + root_host) % H); };
    for (int m = 1; m < H; m <<= 1) {
      double w = 0;
      for (int v = 0; v < m && v + m < H; ++v)
        w = std::max(w, g.links.time(real(v), real(v + m), static_cast<double>(maxb)));
      t += w;
    }
    return t + ring_phase_cost(g.links, h.local.data(), L, blk, q.elem);
  }
  // Root scatters L blocks to its host-mates; each block is broadcast
  // across hosts (binomial tree among the ranks of one local index); every
  // host all-gathers its L blocks.
  static bool broadcast(AlgoContext& c, const CollCall& k, const HostLevels& h) {
    const int L = static_cast<int>(h.local.size()), H = static_cast<int>(h.cross.size());
    const int l = h.local_pos, me = h.cross_pos;
    const size_t es = dtype_size(k.dtype);
    const int root_host = h.host[static_cast<size_t>(k.root)], root_l = h.index[static_cast<size_t>(k.root)];
    char* buf = static_cast<char*>(k.recv);
    auto blk = [&](int i) { return part(k.count, L, i); };
    // 1. Scatter inside the root's host.
    if (me == root_host) {
      if (l == root_l) {
        for (int i = 0; i < L; ++i)
          if (i != root_l) c.transport->send(h.local[i], c.tag, buf + blk(i).off * es, blk(i).len * es);
      } else {
        c.transport->recv(h.local[root_l], c.tag, buf + blk(l).off * es, blk(l).len * es);
      }
    }
    // 2. Across hosts: binomial tree rooted at the root's host.
    const Range mine = blk(l);
    const int vr = mod(me - root_host, H);
    auto real = [&](int v) { return h.cross[(v + root_host) % H]; };
    int mask = 1;
    while (mask < H) {
      if (vr & mask) {
        c.transport->recv(real(vr - mask), c.tag, buf + mine.off * es, mine.len * es);
        break;
      }
      mask <<= 1;
    }
    for (mask >>= 1; mask > 0; mask >>= 1)
      if (vr + mask < H) c.transport->send(real(vr + mask), c.tag, buf + mine.off * es, mine.len * es);
    // 3. All-gather inside every host.
    ring_all_gather(c, h.local.data(), L, l, blk, buf, es);
    return true;
  }
};

// ---------------------------------------------------------------- hier
// Two levels for a group spanning hosts (ctx.hosts valid): reduce-scatter
// inside each host (ring over the L host-mates), all-reduce of this rank's
// 1/L block across hosts among the H ranks of the same local index (ring),
// all-gather inside the host. Every cross-host link carries 1/L of the data
// and the L cross-host rings run at once.
class HierAlgorithm final : public Algorithm {
 public:
  const char* name() const override { return "hier"; }
  double cost(const GroupCostModel& g, const CostQuery& q) const override {
    if (!g.hosts.valid) return -1;
    if (q.kind != CollKind::AllReduce) return HierGather::cost(g, q);
    const HostLevels& h = g.hosts;
    const int L = static_cast<int>(h.local.size()), H = static_cast<int>(h.cross.size());
    auto local_blk = [&](int i) { return part(q.count, L, i); };
    const Range mine = local_blk(0);  // rank 0's block (the largest)
    const double cross = 2 * ring_phase_cost(
                                 g.links, h.cross.data(), H, [&](int j) { return part(mine.len, H, j); }, q.elem);
    if (in_place_possible(g, L) && q.buffers_shared) {
      // Each rank pulls L-1 blocks from its host-mates, then pushes its
      // block to L-1 of them (the link traffic of the ring phases it replaces).
      size_t maxb = 0;
      for (int i = 0; i < L; ++i) maxb = std::max(maxb, local_blk(i).len * q.elem);
      double worst = 0;
      for (int a = 0; a < L; ++a) {
        double t = 0;
        for (int j = 0; j < L; ++j)
          if (j != a) t += g.links.time(h.local[j], h.local[a], static_cast<double>(maxb));
        worst = std::max(worst, t);
      }
      return cross + 2 * worst;
    }
    return cross + 2 * ring_phase_cost(g.links, h.local.data(), L, local_blk, q.elem);
  }

 protected:
  bool execute(AlgoContext& c, const CollCall& k) override {
    if (k.kind != CollKind::AllReduce) return HierGather::execute(c, k);
    const HostLevels& h = *c.hosts;
    const int L = static_cast<int>(h.local.size()), H = static_cast<int>(h.cross.size());
    const size_t es = dtype_size(k.dtype);
    char* buf = static_cast<char*>(k.recv);
    auto local_blk = [&](int i) { return part(k.count, L, i); };
    if (in_place_possible(*c.group, L)) {
      if (in_place_inside_host(c, k)) return true;
      c.buffers_shared = false;  // some host-mate's buffers are outside the arena
    }
    // 1. Inside the host: this rank ends with the host's sum of its block.
    ring_reduce_scatter(c, h.local.data(), L, h.local_pos, local_blk, static_cast<const char*>(k.send), buf, k.dtype,
                        k.op);
    // 2. Across hosts: all-reduce of that block (in place).
    const Range mine = local_blk(h.local_pos);
    auto cross_blk = [&](int j) {
      Range b = part(mine.len, H, j);
      b.off += mine.off;
      return b;
    };
    ring_reduce_scatter(c, h.cross.data(), H, h.cross_pos, cross_blk, buf, buf, k.dtype, k.op);
    ring_all_gather(c, h.cross.data(), H, h.cross_pos, cross_blk, buf, es);
    // 3. Inside the host: everyone gets every block.
    ring_all_gather(c, h.local.data(), L, h.local_pos, local_blk, buf, es);
    return true;
  }

 private:
  // The host's phases in place need the host's shared memory, for at most 64 host-mates.
  static bool in_place_possible(const GroupCostModel& g, int L) { return g.host_shared_memory && L <= 64; }
  // The same three phases with the host's phases done in place in shared
  // memory (host_shared_memory(), buffers in a shared arena): no fragment
  // hand-offs through slots, which on a loaded machine cost a scheduler
  // wake-up each. Round 1 publishes (send, recv); rank l sums block l of
  // every host-mate's send into its recv; the cross-host all-reduce of block
  // l runs over TCP as above; rank l then writes its final block into every
  // host-mate's recv; round 2 says all blocks are delivered. Only rank l
  // touches block l of any buffer, so in place is safe. Returns false
  // (before any data moved, alike on every rank: the flags are published)
  // when some host-mate's buffers are outside the arena.
  static bool in_place_inside_host(AlgoContext& c, const CollCall& k) {
    SharedMemoryPeers* shm = c.transport->host_shared_memory();
    const HostLevels& h = *c.hosts;
    const int L = static_cast<int>(h.local.size()), H = static_cast<int>(h.cross.size()), l = h.local_pos;
    TESSERA_CHECK(shm != nullptr, "hier: the group's model says its hosts share memory, the transport does not");
    const size_t es = dtype_size(k.dtype), bytes = k.count * es;
    const uint8_t ok = shm->is_shared(k.send, bytes) && shm->is_shared(k.recv, bytes);
    const void* bufs[2] = {k.send, k.recv};
    const size_t sizes[2] = {bytes, bytes};
    shm->publish(bufs, sizes, ok ? 2 : 0, &ok, 1);
    for (int j = 0; j < L; ++j)
      if (*static_cast<const uint8_t*>(shm->peer_inline(j)) != 1) return false;
    auto local_blk = [&](int i) { return part(k.count, L, i); };
    const Range mine = local_blk(l);
    char* out = static_cast<char*>(k.recv) + mine.off * es;
    auto send_of = [&](int j) { return static_cast<const char*>(shm->peer_buffer(j, 0)) + mine.off * es; };
    // 1. Own contribution first (in place, `out` is this rank's send block).
    if (L >= 2) reduce2(out, send_of(l), send_of((l + 1) % L), mine.len, k.dtype, k.op);
    for (int j = 2; j < L; ++j) reduce2(out, out, send_of((l + j) % L), mine.len, k.dtype, k.op);
    // 2. Across hosts, on block l of recv.
    auto cross_blk = [&](int j) {
      Range b = part(mine.len, H, j);
      b.off += mine.off;
      return b;
    };
    char* buf = static_cast<char*>(k.recv);
    ring_reduce_scatter(c, h.cross.data(), H, h.cross_pos, cross_blk, buf, buf, k.dtype, k.op);
    ring_all_gather(c, h.cross.data(), H, h.cross_pos, cross_blk, buf, es);
    // 3. Push block l into every host-mate's recv.
    // A block can be empty (fewer elements than ranks); its peer pointer may
    // then be null, which memcpy must not see even for 0 bytes.
    if (mine.len > 0)
      for (int j = 1; j < L; ++j)
        std::memcpy(static_cast<char*>(shm->peer_buffer((l + j) % L, 1)) + mine.off * es, out, mine.len * es);
    shm->publish(nullptr, nullptr, 0, nullptr, 0);
    return true;
  }
};

// ---------------------------------------------------------------- hier_rd
// Small all-reduce for a group spanning hosts: recursive doubling among the
// L host-mates (shared memory), then recursive doubling among the H ranks of
// the same local index (one per host, TCP): log2(L) + log2(H) exchanges of
// the whole vector, the fewest steps (and cross-host steps) of any
// algorithm here. Each exchange sends the current vector and reduces the
// partner's with it, on arrival, into a second buffer; every combine is of two values
// and commutative, so all ranks end bitwise equal. Declines unless L and H
// are powers of two.
class HierRdAlgorithm final : public Algorithm {
 public:
  const char* name() const override { return "hier_rd"; }
  double cost(const GroupCostModel& g, const CostQuery& q) const override {
    const HostLevels& h = g.hosts;
    if (q.kind != CollKind::AllReduce || !h.valid) return -1;
    const int L = static_cast<int>(h.local.size()), H = static_cast<int>(h.cross.size());
    if (!pow2(L) || !pow2(H)) return -1;
    const double bytes = static_cast<double>(q.count * q.elem);
    return doubling_seconds(
               g.links, L, [&](int i) { return h.local[static_cast<size_t>(i)]; }, bytes) +
           doubling_seconds(
               g.links, H, [&](int i) { return h.cross[static_cast<size_t>(i)]; }, bytes);
  }

 protected:
  bool execute(AlgoContext& c, const CollCall& k) override {
    const HostLevels& h = *c.hosts;
    const int L = static_cast<int>(h.local.size()), H = static_cast<int>(h.cross.size());
    const size_t bytes = k.count * dtype_size(k.dtype);
    char *cur, *next;
    alternate_from(k.send, static_cast<char*>(k.recv), static_cast<char*>(c.ws->get(std::max<size_t>(bytes, 1))), bytes,
                   log2i(L) + log2i(H), cur, next);
    auto level = [&](const std::vector<int>& members, int pos, int m) {
      doubling_exchanges(
          c, k, m, pos, [&](int i) { return members[static_cast<size_t>(i)]; }, bytes, cur, next);
    };
    level(h.local, h.local_pos, L);
    level(h.cross, h.cross_pos, H);
    return true;
  }
};

// ---------------------------------------------------------------- hier_leader
// Small all-reduce for a group spanning hosts whose ranks share their cores:
// a binomial reduce to local index 0 (shared memory), recursive doubling
// among those leaders, one per host (TCP), and a binomial broadcast from the
// leader: ceil(log2 L) + log2(H) + ceil(log2 L) steps, of which log2(H) cross
// hosts with one message per host instead of hier_rd's L. Declines unless H
// is a power of two.
class HierLeaderAlgorithm final : public Algorithm {
 public:
  const char* name() const override { return "hier_leader"; }
  double cost(const GroupCostModel& g, const CostQuery& q) const override {
    const HostLevels& h = g.hosts;
    if (q.kind != CollKind::AllReduce || !h.valid) return -1;
    const int L = static_cast<int>(h.local.size()), H = static_cast<int>(h.cross.size());
    if (!pow2(H)) return -1;
    const double bytes = static_cast<double>(q.count * q.elem);
    auto local = [&](int i) { return h.local[static_cast<size_t>(i)]; };
    double tree = 0;  // the reduce's steps (the broadcast's are the same pairs)
    for (int mask = 1; mask < L; mask <<= 1) {
      double t = 0;
      for (int a = 0; a + mask < L; a += 2 * mask) t = std::max(t, g.links.time(local(a), local(a + mask), bytes));
      tree += t;
    }
    // The leaders are by_local[k], k < H.
    return 2 * tree + doubling_seconds(
                          g.links, H, [&](int i) { return h.by_local[static_cast<size_t>(i)]; }, bytes);
  }

 protected:
  bool execute(AlgoContext& c, const CollCall& k) override {
    const HostLevels& h = *c.hosts;
    const int L = static_cast<int>(h.local.size()), H = static_cast<int>(h.cross.size());
    const size_t bytes = k.count * dtype_size(k.dtype);
    const char* const send = static_cast<const char*>(k.send);
    char* const out = static_cast<char*>(k.recv);
    const int v = h.local_pos;
    auto local = [&](int i) { return h.local[static_cast<size_t>(i)]; };
    // The leader's doubling alternates two buffers; it starts in the one
    // that makes it end in `out` (no copy back).
    char* acc = out;
    if (v == 0 && log2i(H) % 2 == 1) acc = static_cast<char*>(c.ws->get(std::max<size_t>(bytes, 1)));
    binomial_reduce(c, k, L, v, local, send, acc, bytes);
    if (v == 0) {
      char* cur = acc;
      char* next = acc == out ? static_cast<char*>(c.ws->get(std::max<size_t>(bytes, 1))) : out;
      doubling_exchanges(
          c, k, H, h.cross_pos, [&](int i) { return h.cross[static_cast<size_t>(i)]; }, bytes, cur, next);
    }
    binomial_broadcast(c, L, v, local, out, bytes);
    return true;
  }
};

// ---------------------------------------------------------------- rhd
// Rabenseifner: recursive-halving reduce-scatter then recursive-doubling
// all-gather among the largest power of two p' <= p; the first 2(p-p')
// ranks fold pairwise before (even into odd) and unfold after.
class RhdAlgorithm final : public Algorithm {
 public:
  const char* name() const override { return "rhd"; }
  double cost(const GroupCostModel& g, const CostQuery& q) const override {
    return q.kind == CollKind::AllReduce ? rhd_all_reduce_seconds(g.links, g.size, q.count, q.elem) : -1;
  }

 protected:
  bool execute(AlgoContext& c, const CollCall& k) override {
    const int p = c.size, r = c.rank;
    const size_t es = dtype_size(k.dtype), n = k.count;
    char* buf = static_cast<char*>(k.recv);
    copy_if_needed(buf, k.send, n * es);
    if (p == 1) return true;
    const PowerOfTwoFold fold(p);
    const int pp = fold.pp, rem = fold.rem;
    const int nr = fold.renumbered(r);
    if (nr < 0) {
      c.transport->send(r + 1, c.tag, buf, n * es);
    } else if (r < 2 * rem) {
      ReduceSink sink(buf, buf, k.dtype, k.op);
      c.transport->recv_sink(r - 1, n * es, sink, c.tag);
    }

    auto bytes_of = [&](int lo, int hi) -> Range {  // block range -> element range
      const Range a = part(n, pp, lo), b = part(n, pp, hi - 1);
      return {a.off, b.off + b.len - a.off};
    };
    int levels = 0;
    for (int m = pp / 2; m >= 1; m /= 2) ++levels;
    // Per level: the block range before the split (same for all pairs' cost).
    int lo_at[32], hi_at[32];
    if (nr >= 0) {
      int lo = 0, hi = pp, lvl = 0;
      for (int mask = pp / 2; mask >= 1; mask /= 2, ++lvl) {
        const int partner = nr ^ mask, mid = lo + (hi - lo) / 2;
        lo_at[lvl] = lo;
        hi_at[lvl] = hi;
        const bool lower = (nr & mask) == 0;
        const Range keep = lower ? bytes_of(lo, mid) : bytes_of(mid, hi);
        const Range give = lower ? bytes_of(mid, hi) : bytes_of(lo, mid);
        ReduceSink sink(buf + keep.off * es, buf + keep.off * es, k.dtype, k.op);
        c.transport->sendrecv_sink(fold.real(partner), buf + give.off * es, give.len * es, fold.real(partner),
                                   keep.len * es, sink, c.tag);
        if (lower)
          hi = mid;
        else
          lo = mid;
      }
      for (int lvl2 = levels - 1; lvl2 >= 0; --lvl2) {
        const int mask = pp >> (lvl2 + 1);
        const int partner = nr ^ mask;
        const int L = lo_at[lvl2], H = hi_at[lvl2], mid = L + (H - L) / 2;
        const bool lower = (nr & mask) == 0;
        const Range mine = lower ? bytes_of(L, mid) : bytes_of(mid, H);
        const Range theirs = lower ? bytes_of(mid, H) : bytes_of(L, mid);
        c.transport->sendrecv(fold.real(partner), buf + mine.off * es, mine.len * es, fold.real(partner),
                              buf + theirs.off * es, theirs.len * es, c.tag);
      }
    }
    if (r < 2 * rem) {
      if (r % 2 == 1)
        c.transport->send(r - 1, c.tag, buf, n * es);
      else
        c.transport->recv(r + 1, c.tag, buf, n * es);
    }
    return true;
  }
};

// ---------------------------------------------------------------- rd
// Recursive doubling for groups without shared memory (TCP links), where
// each exchange costs a network latency: log2(p') exchanges of the whole
// vector, each reduced on arrival into the other buffer (as hier_rd), among
// the largest power of two p' <= p; the first 2(p-p') ranks fold pairwise
// before and unfold after (as rhd). Against rhd's 2 log2(p') exchanges of
// halving sizes it saves half the latencies and costs log2(p') n instead of
// 2n (p'-1)/p' bytes: the same at 2 ranks, so there it is chosen up to
// where ring takes over; above, up to 64 KiB. It is not chosen with shared
// memory (where oneshot and direct serve small messages); forced, it serves
// every all-reduce.
size_t rd_max_bytes(int p) { return p == 2 ? (size_t{256} << 10) - 1 : size_t{64} << 10; }

class RdAlgorithm final : public Algorithm {
 public:
  const char* name() const override { return "rd"; }
  // Its size and shared-memory limits are selection rules (algorithm_candidates): forced, it serves any all-reduce.
  double cost(const GroupCostModel& g, const CostQuery& q) const override {
    return q.kind == CollKind::AllReduce ? rd_all_reduce_seconds(g.links, g.size, q.count, q.elem) : -1;
  }

 protected:
  bool execute(AlgoContext& c, const CollCall& k) override {
    const size_t es = dtype_size(k.dtype), bytes = k.count * es;
    const int p = c.size, r = c.rank;
    char* const out = static_cast<char*>(k.recv);
    if (p == 1) return copy_if_needed(out, k.send, bytes), true;
    const PowerOfTwoFold fold(p);
    const int nr = fold.renumbered(r);
    if (nr < 0) {  // folded in: hand over, get the result back
      c.transport->send(r + 1, c.tag, k.send, bytes);
      c.transport->recv(r + 1, c.tag, out, bytes);
    } else {
      const bool folds = r < 2 * fold.rem;
      char *cur, *next;
      alternate_from(k.send, out, static_cast<char*>(c.ws->get(std::max<size_t>(bytes, 1))), bytes,
                     (folds ? 1 : 0) + log2i(fold.pp), cur, next);
      if (folds) {
        ReduceSink sink(next, cur, k.dtype, k.op);
        c.transport->recv_sink(r - 1, bytes, sink, c.tag);
        std::swap(cur, next);
      }
      doubling_exchanges(
          c, k, fold.pp, nr, [&](int i) { return fold.real(i); }, bytes, cur, next);
      if (folds) c.transport->send(r - 1, c.tag, out, bytes);
    }
    return true;
  }
};

// ---------------------------------------------------------------- torus
// Dimension by dimension over the group's grid on the torus. Reduce-scatter
// goes through the dims from the slowest-varying to the fastest, so every
// rank's share stays one contiguous range; all-gather comes back in reverse.
// All-reduce splits the vector in halves and runs one half on rings in the
// forward direction and the other on rings in the backward direction.
class TorusAlgorithm final : public Algorithm {
 public:
  const char* name() const override { return "torus"; }
  double cost(const GroupCostModel& g, const CostQuery& q) const override {
    const TorusShape& ts = g.torus;
    if (!ts.valid || g.size > kMaxRanks) return -1;
    for (int e : ts.extent)
      if (e > 64) return -1;
    const int p = g.size;
    const size_t es = q.elem;
    switch (q.kind) {
      case CollKind::AllReduce: {
        if (p == 1) return 0;
        // The two halves run at once on rings in opposite directions (separate links).
        double t[2] = {0, 0};
        for (int half = 0; half < 2; ++half) {
          auto blk = [&](int lin) { return half_block(q.count, p, half, lin); };
          t[half] = reduce_scatter(ts, 0, p, nullptr, &g.links, blk, es, nullptr, nullptr, DType::F32, ReduceOp::Sum,
                                   half == 1, nullptr) +
                    all_gather(ts, 0, nullptr, &g.links, blk, es, nullptr, half == 1);
        }
        return std::max(t[0], t[1]);
      }
      case CollKind::ReduceScatter:
      case CollKind::AllGather: {
        if (!ts.identity) return -1;
        if (p == 1) return 0;
        auto blk = [&](int lin) { return Range{static_cast<size_t>(lin) * q.count, q.count}; };
        if (q.kind == CollKind::AllGather) return all_gather(ts, 0, nullptr, &g.links, blk, es, nullptr, false);
        return reduce_scatter(ts, 0, p, nullptr, &g.links, blk, es, nullptr, nullptr, DType::F32, ReduceOp::Sum, false,
                              nullptr);
      }
      default:
        return -1;
    }
  }

 protected:
  bool execute(AlgoContext& c, const CollCall& k) override {
    const TorusShape& ts = *c.torus;
    const size_t es = dtype_size(k.dtype);
    const int p = c.size, r = c.rank;
    switch (k.kind) {
      case CollKind::AllReduce: {
        char* buf = static_cast<char*>(k.recv);
        if (p == 1) return copy_if_needed(buf, k.send, k.count * es), true;
        // The first reduce-scatter reads this rank's contribution from send
        // and writes partial sums into recv, so no upfront copy is needed.
        const char* in = static_cast<const char*>(k.send);
        for (int half = 0; half < 2; ++half) {
          auto blk = [&](int lin) { return half_block(k.count, p, half, lin); };
          reduce_scatter(ts, r, p, &c, nullptr, blk, es, in, buf, k.dtype, k.op, half == 1, nullptr);
          all_gather(ts, r, &c, nullptr, blk, es, buf, half == 1);
        }
        return true;
      }
      case CollKind::ReduceScatter: {
        if (p == 1) return copy_if_needed(k.recv, k.send, k.count * es), true;
        auto blk = [&](int lin) { return Range{static_cast<size_t>(lin) * k.count, k.count}; };
        char* ws = static_cast<char*>(c.ws->get(static_cast<size_t>(p) * k.count * es));
        reduce_scatter(ts, r, p, &c, nullptr, blk, es, static_cast<const char*>(k.send), ws, k.dtype, k.op, false,
                       static_cast<char*>(k.recv));
        return true;
      }
      default: {  // all-gather
        char* buf = static_cast<char*>(k.recv);
        copy_if_needed(buf + static_cast<size_t>(r) * k.count * es, k.send, k.count * es);
        if (p == 1) return true;
        auto blk = [&](int lin) { return Range{static_cast<size_t>(lin) * k.count, k.count}; };
        all_gather(ts, r, &c, nullptr, blk, es, buf, false);
        return true;
      }
    }
  }

 private:
  // Linear block `lin` of one half of a `count`-element all-reduce (the
  // first half holds the extra element of an odd count).
  static Range half_block(size_t count, int p, int half, int lin) {
    const size_t h0 = (count + 1) / 2;
    Range b = part(half == 0 ? h0 : count - h0, p, lin);
    if (half == 1) b.off += h0;
    return b;
  }
  // Fills members (group ranks along dim i through `rank`, ordered by
  // coordinate, reversed when backward) and returns rank's position.
  static int line(const TorusShape& ts, int rank, int i, bool backward, int* members) {
    int stride = 1;
    for (int j = 0; j < i; ++j) stride *= ts.extent[j];
    const int k = ts.extent[i], me = ts.linear[rank], my = ts.coord[rank][i];
    for (int t = 0; t < k; ++t) {
      const int pos = backward ? k - 1 - t : t;
      members[pos] = ts.rank_of_linear[me + (t - my) * stride];
    }
    return backward ? k - 1 - my : my;
  }

  // The reduce-scatter's rings as `rank` runs them, from the slowest dim to
  // the fastest, [glo, ghi) the linear blocks it covers before each. With
  // `c`, moves the data; with `links`, returns the rings' cost instead (one
  // walk for both, so the charge is the schedule's).
  template <typename BlockFn>
  static double reduce_scatter(const TorusShape& ts, int rank, int size, AlgoContext* c, const LinkCosts* links,
                               BlockFn blk, size_t es, const char* src, char* dst, DType dt, ReduceOp op, bool backward,
                               char* final_dst) {
    const int D = static_cast<int>(ts.extent.size());
    int glo = 0, ghi = size;
    double t = 0;
    int members[64];
    const char* cur_src = src;
    // The last dim with extent > 1 in this order writes the final block.
    for (int i = D - 1; i >= 0; --i) {
      const int k = ts.extent[i];
      const int q = line(ts, rank, i, backward, members);
      const int sz = (ghi - glo) / k;
      auto block = [&](int pos) {
        const int g = backward ? k - 1 - pos : pos;
        const Range a = blk(glo + g * sz), b = blk(glo + (g + 1) * sz - 1);
        return Range{a.off, b.off + b.len - a.off};
      };
      const bool last = (i == 0);
      if (links) t += ring_phase_cost(*links, members, k, block, es);
      if (c) ring_reduce_scatter(*c, members, k, q, block, cur_src, dst, dt, op, last ? final_dst : nullptr);
      if (k > 1) cur_src = dst;  // a dim of extent 1 wrote nothing: keep reading src
      const int g = ts.coord[rank][i];
      glo = glo + g * sz;
      ghi = glo + sz;
    }
    return t;
  }

  template <typename BlockFn>
  static double all_gather(const TorusShape& ts, int rank, AlgoContext* c, const LinkCosts* links, BlockFn blk,
                           size_t es, char* buf, bool backward) {
    const int D = static_cast<int>(ts.extent.size());
    double t = 0;
    int members[64];
    int span = 1;  // linear blocks this rank holds, aligned
    for (int i = 0; i < D; ++i) {
      const int k = ts.extent[i];
      const int q = line(ts, rank, i, backward, members);
      const int base = (ts.linear[rank] / (span * k)) * (span * k);
      auto block = [&](int pos) {
        const int g = backward ? k - 1 - pos : pos;
        const Range a = blk(base + g * span), b = blk(base + (g + 1) * span - 1);
        return Range{a.off, b.off + b.len - a.off};
      };
      if (links) t += ring_phase_cost(*links, members, k, block, es);
      if (c) ring_all_gather(*c, members, k, q, block, buf, es);
      span *= k;
    }
    return t;
  }
};

// ---------------------------------------------------------------- shm direct
// Shared memory only, ranks reading and writing each other's buffers in
// place: all-reduce (each rank reduces its block of the vector from all
// peers' send buffers and writes it into every peer's recv), all-gather
// (each copies the peers' blocks), reduce-scatter (each reduces its block),
// broadcast (each copies the root's buffer). Two publish rounds (exchange
// pointers; done reading and writing). Declines (after the first round, which every rank sees alike) when some
// rank's buffers are outside every shared arena.
class DirectAlgorithm final : public Algorithm {
 public:
  const char* name() const override { return "direct"; }
  double cost(const GroupCostModel& g, const CostQuery& q) const override {
    const int p = g.size;
    const double b = static_cast<double>(q.count * q.elem);
    if (!g.shared_memory) return -1;
    if (q.kind == CollKind::Barrier) return 0;  // one publish round
    if (p == 1 || p > 64 || !q.buffers_shared) return -1;
    switch (q.kind) {
      case CollKind::AllReduce:  // pull p-1 blocks, push this rank's to p-1 peers
        return 2 * gather_from_peers_seconds(g.links, p, static_cast<double>(part(q.count, p, 0).len * q.elem));
      case CollKind::AllGather:
      case CollKind::ReduceScatter:
        return gather_from_peers_seconds(g.links, p, b);
      case CollKind::Broadcast: {  // every peer copies the root's buffer
        double worst = 0;
        for (int a = 0; a < p; ++a) worst = std::max(worst, g.links.time(q.root, a, b));
        return worst;
      }
      default:
        return -1;
    }
  }

 protected:
  bool execute(AlgoContext& c, const CollCall& k) override {
    SharedMemoryPeers* shm = c.transport->shared_memory();
    TESSERA_CHECK(shm != nullptr, "direct: the group's model says it shares memory, the transport does not");
    const size_t es = dtype_size(k.dtype);
    if (k.kind == CollKind::Barrier) {
      shm->publish(nullptr, nullptr, 0, nullptr, 0);
      return true;
    }
    if (k.kind == CollKind::AllReduce) return all_reduce(c, *shm, k, es);
    if (k.kind == CollKind::AllGather) return all_gather(c, *shm, k, es);
    if (k.kind == CollKind::ReduceScatter) return reduce_scatter(c, *shm, k, es);
    return broadcast(c, *shm, k, es);
  }

 private:
  // Round 1 for (send, recv): true when every rank's buffers are shared.
  static bool exchange(SharedMemoryPeers& shm, const void* a, size_t abytes, const void* b, size_t bbytes, void** ptrs,
                       int p) {
    const uint8_t ok = shm.is_shared(a, abytes) && shm.is_shared(b, bbytes);
    const void* bufs[2] = {a, b};
    const size_t sizes[2] = {abytes, bbytes};
    shm.publish(bufs, sizes, ok ? 2 : 0, &ok, 1);
    bool all = true;
    for (int j = 0; j < p; ++j) all = all && *static_cast<const uint8_t*>(shm.peer_inline(j)) == 1;
    if (!all) return false;
    for (int j = 0; j < p; ++j) {
      ptrs[slot(j, 0)] = shm.peer_buffer(j, 0);
      ptrs[slot(j, 1)] = shm.peer_buffer(j, 1);
    }
    return true;
  }
  // Index in exchange()'s ptrs of rank j's buffer b (0: a, 1: b).
  static size_t slot(int j, int b) { return 2 * static_cast<size_t>(j) + static_cast<size_t>(b); }
  static char* peer(void* const* ptrs, int j, int b) { return static_cast<char*>(ptrs[slot(j, b)]); }

  bool all_reduce(AlgoContext& c, SharedMemoryPeers& shm, const CollCall& k, size_t es) {
    const int p = c.size, r = c.rank;
    const size_t n = k.count;
    void* ptrs[128];
    if (!exchange(shm, k.send, n * es, k.recv, n * es, ptrs, p)) return false;
    const Range mine = part(n, p, r);
    // Reduce my block in cache-sized pieces across all sources, then push
    // each piece, still in cache, into every peer's recv: each rank reads n
    // and writes n bytes in all, and one round less than pull-after-reduce.
    constexpr size_t kPiece = 16384;
    char* out = static_cast<char*>(k.recv) + mine.off * es;
    // A large block goes to the peers with streaming stores (docs/algorithms.md,
    // "direct, large messages"): a plain store reads each cold line of a
    // peer's recv first, and the peer does not read it again soon. Out of
    // place only: in place, the peer's recv block is its send block, which
    // this rank has just read into its cache. At least 1 MiB: reduce2's own
    // threshold (reduce.cc, kStreamingBytes).
    const bool stream = k.send != k.recv && mine.len * es >= (size_t{1} << 20) && streaming_stores();
    // Streamed, a piece is reduced into a scratch piece that stays in cache
    // and streamed from there to this rank's recv as well: a plain store
    // into the own recv would read each cold line first too (docs/algorithms.md).
    thread_local std::vector<char> scratch;
    if (stream && scratch.size() < kPiece * es) scratch.assign(kPiece * es, 0);  // once a thread, pre-faulted
    for (size_t done = 0; done < mine.len; done += kPiece) {
      const size_t len = std::min(kPiece, mine.len - done), off = (mine.off + done) * es;
      char* acc = stream ? scratch.data() : out + done * es;
      // Own contribution first: in place, `out` is this rank's send block.
      const int first = (r + 1) % p;
      reduce2(acc, peer(ptrs, r, 0) + off, peer(ptrs, first, 0) + off, len, k.dtype, k.op);
      for (int j = 2; j < p; ++j) reduce2(acc, acc, peer(ptrs, (r + j) % p, 0) + off, len, k.dtype, k.op);
      if (stream) copy_streaming(out + done * es, acc, len * es);
      // Only this rank touches block `mine` of any buffer, and it has read
      // the peers' inputs of this piece already, so in place is safe.
      for (int j = 1; j < p; ++j)
        (stream ? copy_streaming : copy_cached)(peer(ptrs, (r + j) % p, 1) + off, acc, len * es);
    }
    if (stream) streaming_fence();                 // the stores reach memory before the round below says so
    shm.publish(nullptr, nullptr, 0, nullptr, 0);  // every block reduced and delivered
    return true;
  }

  // Every rank copies each peer's block from the peer's send buffer into its
  // own recv (one copy of (p-1) blocks, where a ring copies each block into
  // a channel slot and out again), then a round: done reading.
  bool all_gather(AlgoContext& c, SharedMemoryPeers& shm, const CollCall& k, size_t es) {
    const int p = c.size, r = c.rank;
    const size_t blk = k.count * es;
    void* ptrs[128];
    if (!exchange(shm, k.send, blk, k.recv, blk * static_cast<size_t>(p), ptrs, p)) return false;
    char* recv = static_cast<char*>(k.recv);
    for (int i = 0; i < p; ++i) {
      const int j = (r + i) % p;
      copy_if_needed(recv + static_cast<size_t>(j) * blk, j == r ? k.send : peer(ptrs, j, 0), blk);
    }
    shm.publish(nullptr, nullptr, 0, nullptr, 0);  // every peer's block read
    return true;
  }

  // Every rank reduces block r of all ranks' send buffers, read in place, in
  // cache-sized pieces, into its recv; then a round: done reading.
  bool reduce_scatter(AlgoContext& c, SharedMemoryPeers& shm, const CollCall& k, size_t es) {
    const int p = c.size, r = c.rank;
    const size_t n = k.count, blk = n * es;
    void* ptrs[128];
    if (!exchange(shm, k.send, blk * static_cast<size_t>(p), k.recv, blk, ptrs, p)) return false;
    constexpr size_t kPiece = 16384;
    char* out = static_cast<char*>(k.recv);
    const size_t base = static_cast<size_t>(r) * blk;
    for (size_t done = 0; done < n; done += kPiece) {
      const size_t len = std::min(kPiece, n - done), off = base + done * es;
      // Own contribution first: in place, `out` is this rank's send block r.
      reduce2(out + done * es, peer(ptrs, r, 0) + off, peer(ptrs, (r + 1) % p, 0) + off, len, k.dtype, k.op);
      for (int j = 2; j < p; ++j)
        reduce2(out + done * es, out + done * es, peer(ptrs, (r + j) % p, 0) + off, len, k.dtype, k.op);
    }
    shm.publish(nullptr, nullptr, 0, nullptr, 0);  // every peer's block r read
    return true;
  }

  bool broadcast(AlgoContext& c, SharedMemoryPeers& shm, const CollCall& k, size_t es) {
    const int p = c.size, r = c.rank;
    const size_t bytes = k.count * es;
    void* ptrs[128];
    if (!exchange(shm, k.recv, bytes, nullptr, 0, ptrs, p)) return false;
    if (r != k.root && bytes) std::memcpy(k.recv, peer(ptrs, k.root, 0), bytes);
    shm.publish(nullptr, nullptr, 0, nullptr, 0);
    return true;
  }
};

// ---------------------------------------------------------------- shm oneshot
// Shared memory, small messages: one publish round with the data inline in
// the round's slot (at most SharedMemoryPeers::kInlineBytes per rank). A
// slot of round s is rewritten only in round s+2, which nobody can reach
// before every rank published s+1, i.e. finished reading s.
// - all-reduce: every rank publishes its vector and reduces all slots in
//   rank order (so every rank computes bitwise the same result);
// - all-gather: every rank publishes its block and copies the p blocks;
// - reduce-scatter: every rank publishes its p blocks and reduces block r
//   of every slot, in rank order;
// - broadcast: the root publishes the buffer, the others copy it.
class OneshotAlgorithm final : public Algorithm {
 public:
  const char* name() const override { return "oneshot"; }
  // (Its size rule, oneshot_max_bytes, is a selection rule: algorithm_candidates.)
  double cost(const GroupCostModel& g, const CostQuery& q) const override {
    const int p = g.size;
    const size_t bytes = q.count * q.elem;
    const double b = static_cast<double>(bytes);
    const size_t published = q.kind == CollKind::ReduceScatter ? bytes * static_cast<size_t>(p) : bytes;
    if (!g.shared_memory || published > SharedMemoryPeers::kInlineBytes) return -1;
    switch (q.kind) {
      case CollKind::AllReduce:
      case CollKind::AllGather:
      case CollKind::ReduceScatter:  // every rank reads each peer's slot once
        return p == 1 ? 0.0 : gather_from_peers_seconds(g.links, p, b);
      case CollKind::Broadcast: {
        double worst = 0;
        for (int a = 0; a < p; ++a)
          if (a != q.root) worst = std::max(worst, g.links.time(q.root, a, b));
        return worst;
      }
      default:
        return -1;
    }
  }

 protected:
  bool execute(AlgoContext& c, const CollCall& k) override {
    SharedMemoryPeers* shm = c.transport->shared_memory();
    TESSERA_CHECK(shm != nullptr, "oneshot: the group's model says it shares memory, the transport does not");
    const int p = c.size, r = c.rank;
    const size_t es = dtype_size(k.dtype), bytes = k.count * es;
    auto in = [&](int j) { return static_cast<const char*>(shm->peer_inline(j)); };
    switch (k.kind) {
      case CollKind::AllReduce:
        shm->publish(nullptr, nullptr, 0, k.send, bytes);
        if (p == 1) return copy_if_needed(k.recv, k.send, bytes), true;
        reduce2(k.recv, in(0), in(1), k.count, k.dtype, k.op);
        for (int j = 2; j < p; ++j) reduce2(k.recv, k.recv, in(j), k.count, k.dtype, k.op);
        return true;
      case CollKind::AllGather:
        shm->publish(nullptr, nullptr, 0, k.send, bytes);
        for (int j = 0; j < p; ++j)
          copy_if_needed(static_cast<char*>(k.recv) + static_cast<size_t>(j) * bytes, j == r ? k.send : in(j), bytes);
        return true;
      case CollKind::ReduceScatter: {
        shm->publish(nullptr, nullptr, 0, k.send, bytes * static_cast<size_t>(p));
        const size_t off = static_cast<size_t>(r) * bytes;
        if (p == 1) return copy_if_needed(k.recv, k.send, bytes), true;
        reduce2(k.recv, in(0) + off, in(1) + off, k.count, k.dtype, k.op);
        for (int j = 2; j < p; ++j) reduce2(k.recv, k.recv, in(j) + off, k.count, k.dtype, k.op);
        return true;
      }
      case CollKind::Broadcast: {
        shm->publish(nullptr, nullptr, 0, k.recv, r == k.root ? bytes : 0);
        if (r != k.root) copy_if_needed(k.recv, in(k.root), bytes);
        return true;
      }
      default:
        return false;
    }
  }
};

// ---------------------------------------------------------------- tree
// Binomial trees rooted at `root`: broadcast (ceil(log2 p) rounds of the
// whole buffer) and reduce (the mirror image, reducing as data arrives).
class TreeAlgorithm final : public Algorithm {
 public:
  const char* name() const override { return "tree"; }
  // Round with distance `mask`: pairs (v, v + mask) for v < mask, counted from the root.
  double cost(const GroupCostModel& g, const CostQuery& q) const override {
    if (q.kind != CollKind::Broadcast && q.kind != CollKind::Reduce) return -1;
    return tree_seconds(g.links, g.size, q.root, static_cast<double>(q.count * q.elem));
  }

 protected:
  bool execute(AlgoContext& c, const CollCall& k) override {
    const int p = c.size, r = c.rank;
    const size_t es = dtype_size(k.dtype), bytes = k.count * es;
    const int vr = mod(r - k.root, p);
    auto real = [&](int v) { return (v + k.root) % p; };
    if (k.kind == CollKind::Broadcast) {
      binomial_broadcast(c, p, vr, real, k.recv, bytes);
      return true;
    }
    // Reduce: accumulate in the root's recv, elsewhere in the workspace.
    char* acc = (r == k.root) ? static_cast<char*>(k.recv) : static_cast<char*>(c.ws->get(bytes));
    binomial_reduce(c, k, p, vr, real, static_cast<const char*>(k.send), acc, bytes);
    return true;
  }
};

// ---------------------------------------------------------------- flat
// Shared memory, small broadcasts: the root sends the buffer to every peer
// through its channel to that peer and returns; each peer receives it. A
// send only copies into a free slot of the channel (4 per peer), so the root
// runs up to 4 broadcasts ahead of its slowest receiver and a receiver
// waits for the root only, not for the group: when ranks outnumber cores,
// back-to-back broadcasts cost far fewer hand-offs of a core than a publish
// round (a barrier) or a tree's relays. Declines elsewhere (over TCP the
// root's p-1 sends would be serial network hops).
class FlatAlgorithm final : public Algorithm {
 public:
  const char* name() const override { return "flat"; }
  // The root's p-1 transfers, one after another. (Its size limit,
  // flat_broadcast_max_bytes, is a selection rule: algorithm_candidates.)
  double cost(const GroupCostModel& g, const CostQuery& q) const override {
    if (!g.shared_memory || q.kind != CollKind::Broadcast) return -1;
    double t = 0;
    for (int a = 0; a < g.size; ++a)
      if (a != q.root) t += g.links.time(q.root, a, static_cast<double>(q.count * q.elem));
    return t;
  }

 protected:
  bool execute(AlgoContext& c, const CollCall& k) override {
    const int p = c.size, r = c.rank;
    const size_t bytes = k.count * dtype_size(k.dtype);
    if (r == k.root) {
      for (int j = 1; j < p; ++j) c.transport->send((k.root + j) % p, c.tag, k.recv, bytes);
    } else {
      c.transport->recv(k.root, c.tag, k.recv, bytes);
    }
    return true;
  }
};

// Steps s = first, first * 2 (doubling) or first + 1 (linear) ... < p, each
// with every rank a sending `bytes` to a + s: the slowest such link per step.
double shifted_steps_seconds(const LinkCosts& links, int p, bool doubling, double bytes) {
  double t = 0;
  for (int s = 1; s < p; s = doubling ? s * 2 : s + 1) {
    double w = 0;
    for (int a = 0; a < p; ++a) w = std::max(w, links.time(a, (a + s) % p, bytes));
    t += w;
  }
  return t;
}

// ---------------------------------------------------------------- pairwise
// All-to-all in p-1 steps: step s sends block r+s to rank r+s and receives
// block r-s from rank r-s.
class PairwiseAlgorithm final : public Algorithm {
 public:
  const char* name() const override { return "pairwise"; }
  double cost(const GroupCostModel& g, const CostQuery& q) const override {
    if (q.kind != CollKind::AllToAll) return -1;
    return shifted_steps_seconds(g.links, g.size, false, static_cast<double>(q.count * q.elem));
  }

 protected:
  bool execute(AlgoContext& c, const CollCall& k) override {
    const int p = c.size, r = c.rank;
    const size_t blk = k.count * dtype_size(k.dtype), total = blk * static_cast<size_t>(p);
    const char* send = static_cast<const char*>(k.send);
    char* recv = static_cast<char*>(k.recv);
    const bool overlap = total && send < recv + total && recv < send + total;
    if (overlap) {
      char* ws = static_cast<char*>(c.ws->get(total));
      std::memcpy(ws, send, total);
      send = ws;
    }
    if (blk) std::memcpy(recv + static_cast<size_t>(r) * blk, send + static_cast<size_t>(r) * blk, blk);
    for (int s = 1; s < p; ++s) {
      const int to = (r + s) % p, from = mod(r - s, p);
      c.transport->sendrecv(to, send + static_cast<size_t>(to) * blk, blk, from, recv + static_cast<size_t>(from) * blk,
                            blk, c.tag);
    }
    return true;
  }
};

// ---------------------------------------------------------------- dissemination
class DisseminationAlgorithm final : public Algorithm {
 public:
  const char* name() const override { return "dissemination"; }
  double cost(const GroupCostModel& g, const CostQuery& q) const override {
    return q.kind == CollKind::Barrier ? shifted_steps_seconds(g.links, g.size, true, 0) : -1;
  }

 protected:
  bool execute(AlgoContext& c, const CollCall&) override {
    const int p = c.size, r = c.rank;
    for (int d = 1; d < p; d <<= 1) c.transport->sendrecv((r + d) % p, nullptr, 0, mod(r - d, p), nullptr, 0, c.tag);
    return true;
  }
};

RingAlgorithm g_ring;
HierAlgorithm g_hier;
RhdAlgorithm g_rhd;
HierRdAlgorithm g_hier_rd;
HierLeaderAlgorithm g_hier_leader;
RdAlgorithm g_rd;
TorusAlgorithm g_torus;
DirectAlgorithm g_direct;
OneshotAlgorithm g_oneshot;
TreeAlgorithm g_tree;
FlatAlgorithm g_flat;
PairwiseAlgorithm g_pairwise;
DisseminationAlgorithm g_dissemination;

Algorithm* const kAll[] = {&g_oneshot, &g_direct, &g_torus, &g_hier, &g_hier_rd,  &g_hier_leader,  &g_rd,
                           &g_rhd,     &g_ring,   &g_tree,  &g_flat, &g_pairwise, &g_dissemination};

}  // namespace

std::vector<std::string> algorithm_names() {
  std::vector<std::string> v;
  for (auto* a : kAll) v.emplace_back(a->name());
  return v;
}

size_t oneshot_max_bytes(int group_size) { return group_size == 2 ? size_t{1} << 10 : SharedMemoryPeers::kInlineBytes; }

size_t flat_broadcast_max_bytes(int group_size) { return group_size == 2 ? size_t{4} << 10 : size_t{32} << 10; }

size_t direct_broadcast_min_bytes(int group_size) { return group_size <= 2 ? size_t{4} << 10 : size_t{32} << 10; }

Algorithm* find_algorithm(const std::string& name) {
  for (auto* a : kAll)
    if (name == a->name()) return a;
  return nullptr;
}

int algorithm_candidates(CollKind kind, size_t bytes, bool multi_dim_torus, bool multi_host, const std::string& forced,
                         Algorithm** out, const GroupCostModel* g, size_t elem) {
  int n = 0;
  auto add = [&](Algorithm* a) {
    for (int i = 0; i < n; ++i)
      if (out[i] == a) return;
    out[n++] = a;
  };
  if (!forced.empty()) {
    Algorithm* f = find_algorithm(forced);
    if (!f) {
      std::string names;
      for (auto* a : kAll) names += std::string(names.empty() ? "" : ", ") + a->name();
      throw InvalidArgument("unknown collective algorithm '" + forced +
                            "' (TESSERA_ALGO / CommOptions::algo; known: " + names + ")");
    }
    add(f);
  }
  // oneshot's limit: a rank reads (p-1) copies of the data after one round,
  // where direct and ring read less after more rounds. With 2 ranks (a core
  // each, rounds cost < 1 us) direct and ring overtake it above 1 KiB; with
  // more ranks every round saved is a hand-off saved, and it stays fastest
  // up to the 4 KiB a publish slot holds (docs/algorithms.md, "Crossovers").
  const int size = g ? g->size : 0;
  const size_t oneshot_max = oneshot_max_bytes(size);
  switch (kind) {
    case CollKind::AllReduce:
      if (multi_host && g && g->hosts.valid) {
        // A group spanning hosts: the two-level algorithms that can serve it,
        // cheapest first by their cost on the group (rank 0's view: the same
        // order on every rank), those not slower than the ring; ring stays
        // last as the fallback that serves everything. On crowded hosts
        // (HostLevels::crowded) hier_rd's L messages across hosts at once
        // take turns on the host's cores, which the per-link figures cannot
        // express; hier_leader sends one per host, and serves instead.
        const CostQuery q{CollKind::AllReduce, bytes / std::max<size_t>(elem, 1), std::max<size_t>(elem, 1), 0, true};
        const double ring = g_ring.cost(*g, q);
        std::pair<double, Algorithm*> by_time[] = {
            {g_hier.cost(*g, q), &g_hier},
            {g->hosts.crowded ? -1.0 : g_hier_rd.cost(*g, q), &g_hier_rd},
            {g->hosts.crowded ? g_hier_leader.cost(*g, q) : -1.0, &g_hier_leader},
            {g_rhd.cost(*g, q), &g_rhd}};
        std::stable_sort(std::begin(by_time), std::end(by_time),
                         [](const auto& x, const auto& y) { return x.first < y.first; });
        for (const auto& [sec, a] : by_time)
          if (sec >= 0 && sec <= ring) add(a);
        if (multi_dim_torus) add(&g_torus);
        add(&g_ring);
        break;
      }
      if (bytes <= oneshot_max) add(&g_oneshot);
      add(&g_direct);
      // rd: without shared memory.
      if (bytes <= rd_max_bytes(g ? size : 2) && !(g && g->shared_memory)) add(&g_rd);
      if (multi_host && bytes >= (size_t{256} << 10)) add(&g_hier);
      if (multi_dim_torus) add(&g_torus);
      if (bytes < (size_t{256} << 10)) add(&g_rhd);
      add(&g_ring);
      break;
    case CollKind::ReduceScatter:
    case CollKind::AllGather:
      if (bytes <= oneshot_max) add(&g_oneshot);
      add(&g_direct);
      if (multi_host) add(&g_hier);
      if (multi_dim_torus) add(&g_torus);
      add(&g_ring);
      break;
    case CollKind::Broadcast:
      if (bytes <= flat_broadcast_max_bytes(size)) add(&g_flat);
      if (bytes <= SharedMemoryPeers::kInlineBytes) add(&g_oneshot);
      if (bytes > direct_broadcast_min_bytes(size)) add(&g_direct);
      if (multi_host && bytes >= (size_t{256} << 10)) add(&g_hier);
      add(&g_tree);
      break;
    case CollKind::Reduce:
      add(&g_tree);
      break;
    case CollKind::AllToAll:
      add(&g_pairwise);
      break;
    case CollKind::Barrier:
      add(&g_direct);
      add(&g_dissemination);
      break;
  }
  return n;
}

}  // namespace tessera::collectives
