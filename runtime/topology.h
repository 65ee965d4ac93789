// Topology: the machine a job runs on, as an N-dimensional network of cores.
//
// A Topology is a list of dimensions, fastest first (the same numbering as
// NetModel: core = c0 + k0*(c1 + k1*(c2 ...))). Each dimension has a size, a
// link kind (ring = torus wrap-around, line, switch = all-to-all), the
// bandwidth of one link per direction, a per-hop latency, and the level of
// the machine it belongs to: cores inside a chip, chips in the torus inside
// an instance, or instances over the network. Every core is one DeviceSpec.
//
// The collectives charge their schedules to net_model(), and the planner
// costs whole collectives with the same model, so there is one interconnect
// model in tessera (runtime/netmodel.h).
//
// Figures: presets use public figures (docs/planner.md, shared REFERENCES).
// Per-link bandwidths are NOT published for Trainium; they are derived by
// dividing per-chip totals over the chip's links and are assumptions, as are
// all latencies. Network dimensions (EFA, InfiniBand) are modeled as a switch
// whose per-core bandwidth is the instance's share divided by its cores,
// because every core crosses the network at once in a collective over that
// dimension.
//
// A Topology is an immutable value: copy it freely, share it across threads.
#pragma once

#include <string>
#include <vector>

#include "runtime/device.h"
#include "runtime/netmodel.h"

namespace tessera {

enum class TopoLevel { Core, Chip, Instance };
const char* topo_level_name(TopoLevel l);

struct TopologyDim {
  std::string name;  // "core", "x", "y", "instance", ...
  TopoLevel level = TopoLevel::Chip;
  NetDim net;  // size, kind, bandwidth (bytes/s per direction per link), latency (s)
};

// Link figures for the generic presets (torus4d); zero means "preset default".
struct TopologyOptions {
  double link_bandwidth = 0;  // bytes/s per direction per link
  double link_latency = 0;    // seconds per hop
  std::string device;         // DeviceSpec preset name (DeviceSpec::preset_names())
};

class Topology {
 public:
  Topology() = default;
  Topology(std::string name, std::vector<TopologyDim> dims, DeviceSpec device);

  // Presets: "trn1.32xlarge", "trn1-cluster:N", "trn2.48xlarge", "trn2-cluster:N",
  // "trn2-ultraserver", "torus4d:AxBxCxD", "dgx-a100:N", "emulated:N" (the
  // emulated cores of one host: each group its own NetModel::default_ring).
  // Throws InvalidArgument naming the presets for anything else.
  static bool is_emulated(const std::string& name) { return name.rfind("emulated:", 0) == 0; }
  static Topology preset(const std::string& spec, const TopologyOptions& opts = {});
  static std::vector<std::string> preset_names();
  // A custom topology from a JSON file (format in docs/planner.md). Throws
  // FormatError naming the file for malformed JSON, unknown fields, bad values.
  static Topology from_json_file(const std::string& path);
  // The same from text; `source` names it in errors.
  static Topology from_json_text(const std::string& text, const std::string& source);
  // A preset name if it looks like one, else a JSON file path.
  static Topology load(const std::string& preset_or_file, const TopologyOptions& opts = {});

  const std::string& name() const { return name_; }
  const std::vector<TopologyDim>& dims() const { return dims_; }
  const DeviceSpec& device() const { return device_; }
  int num_cores() const;
  // Product of the sizes of the dimensions at a level (1 when there are none).
  int level_size(TopoLevel l) const;
  int cores_per_chip() const { return level_size(TopoLevel::Core); }
  int chips_per_instance() const { return level_size(TopoLevel::Chip); }
  int num_instances() const { return level_size(TopoLevel::Instance); }

  // The interconnect model the collectives and the planner cost with.
  NetModel net_model() const;

  // The first n cores as a topology of their own: whole fastest dimensions,
  // then a part of the next one (a partial ring becomes a line); one core is
  // the first dimension cut to size 1. Throws InvalidArgument when n cores
  // are not such a prefix.
  Topology first_cores(int n) const;

  // One line per dimension, for `tessera plan` and `tessera bench`.
  std::string describe() const;

 private:
  std::string name_;
  std::vector<TopologyDim> dims_;
  DeviceSpec device_;
};

}  // namespace tessera
