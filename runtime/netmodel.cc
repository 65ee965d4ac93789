#include "runtime/netmodel.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "runtime/error.h"

namespace tessera {

const char* link_kind_name(LinkKind k) {
  switch (k) {
    case LinkKind::Ring:
      return "ring";
    case LinkKind::Line:
      return "line";
    case LinkKind::Switch:
      return "switch";
  }
  return "?";
}

LinkKind parse_link_kind(const std::string& s) {
  if (s == "ring" || s == "torus") return LinkKind::Ring;
  if (s == "line" || s == "mesh") return LinkKind::Line;
  if (s == "switch") return LinkKind::Switch;
  throw InvalidArgument("unknown link kind '" + s + "' (expected ring, line or switch)");
}

NetModel NetModel::ring(int p, double bandwidth, double latency) {
  NetDim d;
  d.size = std::max(1, p);
  d.kind = LinkKind::Ring;
  d.bandwidth = bandwidth;
  d.latency = latency;
  return NetModel({d});
}

int NetModel::num_nodes() const {
  int n = 1;
  for (const auto& d : dims_) n *= d.size;
  return n;
}

std::vector<int> NetModel::coords(int node) const {
  std::vector<int> c(dims_.size());
  for (size_t i = 0; i < dims_.size(); ++i) {
    c[i] = node % dims_[i].size;
    node /= dims_[i].size;
  }
  return c;
}

int NetModel::node(const std::vector<int>& c) const {
  TESSERA_CHECK_EQ(c.size(), dims_.size());
  int n = 0;
  for (size_t i = dims_.size(); i-- > 0;) n = n * dims_[i].size + c[i];
  return n;
}

int NetModel::hops(int d, int a, int b) const {
  const NetDim& dim = dims_.at(static_cast<size_t>(d));
  if (a == b) return 0;
  int diff = std::abs(a - b);
  switch (dim.kind) {
    case LinkKind::Ring:
      return std::min(diff, dim.size - diff);
    case LinkKind::Line:
      return diff;
    case LinkKind::Switch:
      return 1;
  }
  return diff;
}

int NetModel::hops_between(int node_a, int node_b) const {
  auto ca = coords(node_a), cb = coords(node_b);
  int h = 0;
  for (size_t i = 0; i < dims_.size(); ++i) h += hops(static_cast<int>(i), ca[i], cb[i]);
  return h;
}

double NetModel::step_time(int d, int h, double bytes) const {
  const NetDim& dim = dims_.at(static_cast<size_t>(d));
  if (h <= 0 && bytes <= 0) return 0;
  return std::max(h, 1) * dim.latency + bytes / dim.bandwidth;
}

double NetModel::p2p_time(int node_a, int node_b, double bytes) const {
  if (node_a == node_b || dims_.empty()) return 0;
  auto ca = coords(node_a), cb = coords(node_b);
  double lat = 0, min_bw = 0;
  for (size_t i = 0; i < dims_.size(); ++i) {
    int h = hops(static_cast<int>(i), ca[i], cb[i]);
    if (h == 0) continue;
    lat += h * dims_[i].latency;
    min_bw = (min_bw == 0) ? dims_[i].bandwidth : std::min(min_bw, dims_[i].bandwidth);
  }
  return lat + (min_bw > 0 ? bytes / min_bw : 0);
}

double NetModel::ring_allreduce_time(int p, double n, double a, double bw) {
  if (p <= 1) return 0;
  return 2.0 * (p - 1) * a + 2.0 * (p - 1) / p * n / bw;
}

double NetModel::ring_allgather_time(int p, double n, double a, double bw) {
  if (p <= 1) return 0;
  return (p - 1) * a + static_cast<double>(p - 1) / p * n / bw;
}

double NetModel::ring_reduce_scatter_time(int p, double n, double a, double bw) {
  return ring_allgather_time(p, n, a, bw);
}

double NetModel::rhd_allreduce_time(int p, double n, double a, double bw) {
  if (p <= 1) return 0;
  return 2.0 * std::ceil(std::log2(static_cast<double>(p))) * a + 2.0 * (p - 1) / p * n / bw;
}

double NetModel::torus_reduce_scatter_time(double n) const {
  double t = 0, ni = n;
  for (const auto& d : dims_) {
    if (d.size <= 1) continue;
    t += (d.size - 1) * d.latency + static_cast<double>(d.size - 1) / d.size * ni / d.bandwidth;
    ni /= d.size;
  }
  return t;
}

double NetModel::torus_allgather_time(double n) const { return torus_reduce_scatter_time(n); }

double NetModel::torus_allreduce_time(double n) const { return 2.0 * torus_reduce_scatter_time(n); }

}  // namespace tessera
