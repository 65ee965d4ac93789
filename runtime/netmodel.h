// NetModel: the alpha-beta cost of moving bytes over an N-dimensional torus.
//
// This is the one interconnect model in tessera: the collectives charge each
// step of their exact schedule to it (modeled NeuronLink time), and the
// planner costs whole collectives with the closed forms below, so predicted
// and emulated times can be compared.
//
// Nodes are numbered with dimension 0 fastest: node = c0 + k0*(c1 + k1*(c2 ...)).
// A step that sends `bytes` over `hops` links of dimension d costs
// hops * latency_d + bytes / bandwidth_d (cut-through routing).
#pragma once

#include <string>
#include <vector>

namespace tessera {

enum class LinkKind { Ring, Line, Switch };  // torus wrap-around, open line, all-to-all switch
const char* link_kind_name(LinkKind k);
LinkKind parse_link_kind(const std::string& s);

struct NetDim {
  int size = 1;
  LinkKind kind = LinkKind::Ring;
  double bandwidth = 1e9;  // bytes/s per direction per link
  double latency = 1e-6;   // seconds per hop (alpha)
};

class NetModel {
 public:
  NetModel() = default;
  explicit NetModel(std::vector<NetDim> dims) : dims_(std::move(dims)) {}

  // A single ring of p nodes.
  static NetModel ring(int p, double bandwidth, double latency);
  // The communicators' model of a group when no topology is given: a ring
  // of its p members with NeuronLink-v2-like figures (384 GiB/s per
  // Trainium chip over 4 ports: 48 GiB/s per direction per link; 2 us per
  // hop, an assumption). The planner's "emulated:N" topology costs with it.
  static constexpr double kDefaultLinkBandwidth = 48.0 * (1ull << 30);
  static constexpr double kDefaultLinkLatency = 2e-6;
  static NetModel default_ring(int p) { return ring(p, kDefaultLinkBandwidth, kDefaultLinkLatency); }

  const std::vector<NetDim>& dims() const { return dims_; }
  int num_nodes() const;
  std::vector<int> coords(int node) const;
  int node(const std::vector<int>& coords) const;

  // Links crossed between coordinates a and b along dimension d.
  int hops(int d, int a, int b) const;
  // Links crossed between two nodes with dimension-ordered routing, summed over dims.
  int hops_between(int node_a, int node_b) const;

  // One step of `bytes` over `hops` links of dimension d.
  double step_time(int d, int hops, double bytes) const;
  // One point-to-point transfer between two nodes (dimension-ordered route;
  // the slowest dimension crossed sets the bandwidth term).
  double p2p_time(int node_a, int node_b, double bytes) const;

  // ---- closed forms (n = bytes of the full buffer, p ranks) ----
  static double ring_allreduce_time(int p, double n, double alpha, double bandwidth);
  static double ring_allgather_time(int p, double n, double alpha, double bandwidth);       // n = gathered bytes
  static double ring_reduce_scatter_time(int p, double n, double alpha, double bandwidth);  // n = input bytes
  static double rhd_allreduce_time(int p, double n, double alpha, double bandwidth);
  // Dimension-by-dimension torus all-reduce over this model's dims:
  // 2 * sum_i (k_i - 1) * alpha_i + sum_i 2 (k_i - 1)/k_i * n_i / B_i with n_i = n / prod_{j<i} k_j
  // (= 2 sum (k_i - 1) a + 2 (p-1)/p n / B when all dims share a and B).
  double torus_allreduce_time(double n) const;
  double torus_allgather_time(double n) const;       // n = gathered bytes
  double torus_reduce_scatter_time(double n) const;  // n = input bytes

 private:
  std::vector<NetDim> dims_;
};

}  // namespace tessera
