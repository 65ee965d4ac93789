#include "runtime/topology.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "runtime/error.h"
#include "runtime/files.h"
#include "runtime/library_text.h"

namespace tessera {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kUs = 1e-6;

// ---- figures (docs/planner.md lists the source of each) -------------------------
// trn1: NeuronLink-v2 gives 384 GiB/s per chip over 4 links (2D torus).
// ASSUMPTION: 384/4 = 96 GiB/s per link and direction (per-link figures are
// not published).
constexpr double kTrn1LinkBw = 96 * kGiB;
// trn2: NeuronLink-v3 gives 1024 GB/s per chip inside the instance over 4
// links. ASSUMPTION: 256 GB/s per link and direction.
constexpr double kTrn2LinkBw = 256e9;
// trn2 UltraServer: 256 GB/s per chip to other instances, on a ring of 4
// (2 neighbours). ASSUMPTION: 128 GB/s per link and direction.
constexpr double kTrn2ZLinkBw = 128e9;
// Cores of one chip exchange through the chip's shared HBM. ASSUMPTION: a
// core-to-core copy runs at one core's share of HBM bandwidth, halved because
// it reads and writes (trn1: 820 GiB/s / 2 cores / 2; trn2: 2.9 TB/s / 8 / 2).
constexpr double kTrn1CoreBw = 820 * kGiB / 4;
constexpr double kTrn2CoreBw = 2.9e12 / 16;
// Inferentia2 (aws-neuron-sdk inferentia2.rst, inf2-arch.rst): NeuronLink-v2
// at 192 GiB/s per chip; inf2.48xlarge's 12 chips sit on one ring (the
// topology diagram), 2 neighbours each. ASSUMPTION: 96 GiB/s per link and
// direction (per-link figures are not published).
constexpr double kInf2LinkBw = 192 * kGiB / 2;
// Trn3 (trainium3.rst, trn3-arch.rst): NeuronLink-v4 at 2.56 TB/s per chip
// into NeuronSwitch-v1, one hop from every chip to every other. ASSUMPTION:
// the whole 2.56 TB/s per direction into the switch (read as trn2's 1024 GB/s
// is: a per-chip total).
constexpr double kTrn3SwitchBw = 2.56e12;
// Cores of one chip (as kTrn1CoreBw): Trn3's 4.9 TB/s HBM over 8 cores, halved.
constexpr double kTrn3CoreBw = 4.9e12 / 16;
// EFA: 800 Gbps per trn1.32xlarge, 3200 Gbps (EFAv3) per trn2.48xlarge.
constexpr double kTrn1EfaBw = 800e9 / 8;
constexpr double kTrn2EfaBw = 3200e9 / 8;
// NVLink3 on A100: 12 links x 25 GB/s per direction = 300 GB/s per GPU through
// NVSwitch (spec); what NCCL's all-reduce sustains over it is ~200 GB/s of bus
// bandwidth on 8 A100-SXM4-80GB behind NVSwitch (nccl-tests all_reduce_perf,
// NVIDIA/nccl-tests issue #149), the figure a ring step's link runs at here.
// DGX A100: 8 x 200 Gb/s HDR InfiniBand per node.
constexpr double kA100NvlinkBw = 200e9;
constexpr double kDgxIbBw = 8 * 200e9 / 8;
// ASSUMPTIONS (no public per-hop figures): latency per hop.
constexpr double kOnChipLat = 0.5 * kUs;
constexpr double kNeuronLinkLat = 2 * kUs;
constexpr double kEfaLat = 15 * kUs;
constexpr double kNvlinkLat = 3 * kUs;
constexpr double kIbLat = 5 * kUs;

TopologyDim make_dim(const std::string& name, TopoLevel level, int size, LinkKind kind, double bw, double lat) {
  TopologyDim d;
  d.name = name;
  d.level = level;
  d.net.size = size;
  d.net.kind = kind;
  d.net.bandwidth = bw;
  d.net.latency = lat;
  return d;
}

int parse_count(const std::string& spec, const std::string& text) {
  size_t pos = 0;
  long v = 0;
  try {
    v = std::stol(text, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  TESSERA_ARG_CHECK(pos == text.size() && !text.empty() && v >= 1, "topology preset '", spec, "': '", text,
                    "' is not a positive count");
  TESSERA_ARG_CHECK(v <= (1 << 24), "topology preset '", spec, "': ", text, " is more than ", 1 << 24,
                    " (the largest count a preset takes)");
  return static_cast<int>(v);
}

std::string presets_text() {
  std::string s;
  for (const auto& p : Topology::preset_names()) s += (s.empty() ? "" : ", ") + p;
  return s;
}

Topology trn1(const std::string& name, int instances) {
  std::vector<TopologyDim> dims = {make_dim("core", TopoLevel::Core, 2, LinkKind::Switch, kTrn1CoreBw, kOnChipLat),
                                   make_dim("x", TopoLevel::Chip, 4, LinkKind::Ring, kTrn1LinkBw, kNeuronLinkLat),
                                   make_dim("y", TopoLevel::Chip, 4, LinkKind::Ring, kTrn1LinkBw, kNeuronLinkLat)};
  if (instances > 1)
    dims.push_back(make_dim("instance", TopoLevel::Instance, instances, LinkKind::Switch, kTrn1EfaBw / 32, kEfaLat));
  return Topology(name, std::move(dims), DeviceSpec::preset("trn1-core"));
}

Topology trn2(const std::string& name, int instances, bool ultraserver) {
  std::vector<TopologyDim> dims = {make_dim("core", TopoLevel::Core, 8, LinkKind::Switch, kTrn2CoreBw, kOnChipLat),
                                   make_dim("x", TopoLevel::Chip, 4, LinkKind::Ring, kTrn2LinkBw, kNeuronLinkLat),
                                   make_dim("y", TopoLevel::Chip, 4, LinkKind::Ring, kTrn2LinkBw, kNeuronLinkLat)};
  if (ultraserver)
    dims.push_back(make_dim("z", TopoLevel::Instance, 4, LinkKind::Ring, kTrn2ZLinkBw, kNeuronLinkLat));
  else if (instances > 1)
    dims.push_back(make_dim("instance", TopoLevel::Instance, instances, LinkKind::Switch, kTrn2EfaBw / 128, kEfaLat));
  return Topology(name, std::move(dims), DeviceSpec::preset("trn2-core"));
}

// inf2.48xlarge: 12 Inferentia2 chips on one ring, 2 NeuronCore-v2 each.
Topology inf2(const std::string& name) {
  std::vector<TopologyDim> dims = {make_dim("core", TopoLevel::Core, 2, LinkKind::Switch, kTrn1CoreBw, kOnChipLat),
                                   make_dim("ring", TopoLevel::Chip, 12, LinkKind::Ring, kInf2LinkBw, kNeuronLinkLat)};
  return Topology(name, std::move(dims), DeviceSpec::preset("inf2-core"));
}

// A Trn3 UltraServer: `chips` Trainium3 chips (64: Gen1, 144: Gen2) behind
// NeuronSwitch-v1, 8 NeuronCore-v4 each.
Topology trn3(const std::string& name, int chips) {
  std::vector<TopologyDim> dims = {
      make_dim("core", TopoLevel::Core, 8, LinkKind::Switch, kTrn3CoreBw, kOnChipLat),
      make_dim("switch", TopoLevel::Chip, chips, LinkKind::Switch, kTrn3SwitchBw, kNeuronLinkLat)};
  return Topology(name, std::move(dims), DeviceSpec::preset("trn3-core"));
}

// ---- JSON ------------------------------------------------------------------------
using nlohmann::json;

[[noreturn]] void bad_file(const std::string& source, const std::string& what) {
  throw FormatError("topology file '" + source + "': " + what);
}

void check_fields(const json& j, const std::string& where, const std::set<std::string>& allowed,
                  const std::string& source) {
  if (!j.is_object()) bad_file(source, where + " must be a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!allowed.count(it.key())) {
      std::string list;
      for (const auto& a : allowed) list.append(list.empty() ? "" : ", ").append(a);
      bad_file(source, detail::concat("unknown field '", it.key(), "' in ", where, " (allowed: ", list, ")"));
    }
  }
}

double get_positive(const json& j, const char* key, const std::string& where, const std::string& source) {
  if (!j.contains(key)) bad_file(source, std::string("missing field '") + key + "' in " + where);
  const json& v = j.at(key);
  if (!v.is_number() || v.get<double>() <= 0)
    bad_file(source, std::string("field '") + key + "' in " + where + " must be a positive number");
  return v.get<double>();
}

std::string get_string(const json& j, const char* key, const std::string& where, const std::string& source) {
  if (!j.contains(key)) bad_file(source, std::string("missing field '") + key + "' in " + where);
  if (!j.at(key).is_string()) bad_file(source, std::string("field '") + key + "' in " + where + " must be a string");
  return j.at(key).get<std::string>();
}

}  // namespace

const char* topo_level_name(TopoLevel l) {
  switch (l) {
    case TopoLevel::Core:
      return "core";
    case TopoLevel::Chip:
      return "chip";
    case TopoLevel::Instance:
      return "instance";
  }
  return "?";
}

Topology::Topology(std::string name, std::vector<TopologyDim> dims, DeviceSpec device)
    : name_(std::move(name)), dims_(std::move(dims)), device_(std::move(device)) {
  TESSERA_ARG_CHECK(!dims_.empty(), "topology '", name_, "' has no dimensions");
  long n = 1;
  for (const auto& d : dims_) {
    TESSERA_ARG_CHECK(d.net.size >= 1, "topology '", name_, "': dimension '", d.name, "' has size ", d.net.size);
    TESSERA_ARG_CHECK(d.net.bandwidth > 0 && d.net.latency >= 0, "topology '", name_, "': dimension '", d.name,
                      "' needs a positive bandwidth and a non-negative latency");
    n *= d.net.size;
    TESSERA_ARG_CHECK(n <= (1 << 24), "topology '", name_, "' has more than 2^24 cores");
  }
}

std::vector<std::string> Topology::preset_names() {
  return {"trn1.32xlarge",    "trn1-cluster:N", "trn2.48xlarge",    "trn2-cluster:N",
          "trn2-ultraserver", "inf2.48xlarge",  "trn3-ultraserver", "trn3-ultraserver:144",
          "torus4d:AxBxCxD",  "dgx-a100:N",     "emulated:N"};
}

Topology Topology::preset(const std::string& spec, const TopologyOptions& opts) {
  auto colon = spec.find(':');
  std::string head = spec.substr(0, colon);
  std::string arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  bool has_arg = colon != std::string::npos;
  auto no_arg = [&] { TESSERA_ARG_CHECK(!has_arg, "topology preset '", head, "' takes no ':' argument"); };
  auto need_arg = [&] {
    TESSERA_ARG_CHECK(has_arg, "topology preset '", head, "' needs an argument, e.g. ", head, ":4");
  };

  TESSERA_ARG_CHECK(head == "torus4d" || (opts.link_bandwidth <= 0 && opts.link_latency <= 0),
                    "link bandwidth and latency options apply to torus4d only, not '", spec,
                    "' (use a JSON topology file for other figures)");
  Topology t;
  if (head == "trn1.32xlarge") {
    no_arg();
    t = trn1(spec, 1);
  } else if (head == "trn1-cluster") {
    need_arg();
    t = trn1(spec, parse_count(spec, arg));
  } else if (head == "trn2.48xlarge") {
    no_arg();
    t = trn2(spec, 1, false);
  } else if (head == "trn2-cluster") {
    need_arg();
    t = trn2(spec, parse_count(spec, arg), false);
  } else if (head == "trn2-ultraserver") {
    no_arg();
    t = trn2(spec, 1, true);
  } else if (head == "inf2.48xlarge") {
    no_arg();
    t = inf2(spec);
  } else if (head == "trn3-ultraserver") {
    // Gen1 (64 chips) by default; ":144" is Gen2.
    const int chips = has_arg ? parse_count(spec, arg) : 64;
    TESSERA_ARG_CHECK(chips == 64 || chips == 144, "topology preset '", spec,
                      "': a Trn3 UltraServer has 64 (Gen1) or 144 (Gen2) chips");
    t = trn3(spec, chips);
  } else if (head == "dgx-a100") {
    need_arg();
    int n = parse_count(spec, arg);
    std::vector<TopologyDim> dims = {make_dim("gpu", TopoLevel::Chip, 8, LinkKind::Switch, kA100NvlinkBw, kNvlinkLat)};
    if (n > 1) dims.push_back(make_dim("node", TopoLevel::Instance, n, LinkKind::Switch, kDgxIbBw / 8, kIbLat));
    t = Topology(spec, std::move(dims), DeviceSpec::preset("a100-80gb"));
  } else if (head == "emulated") {
    // N emulated cores on one host as train_gpt models them without a
    // topology: every communicator a ring of its own members with
    // NetModel::default_ring's figures (the planner costs each group so).
    need_arg();
    std::vector<TopologyDim> dims = {make_dim("rank", TopoLevel::Core, parse_count(spec, arg), LinkKind::Ring,
                                              NetModel::kDefaultLinkBandwidth, NetModel::kDefaultLinkLatency)};
    t = Topology(spec, std::move(dims), DeviceSpec::preset("trn1-core"));
  } else if (head == "torus4d") {
    need_arg();
    std::vector<int> sizes;
    std::stringstream ss(arg);
    std::string part;
    while (std::getline(ss, part, 'x')) sizes.push_back(parse_count(spec, part));
    TESSERA_ARG_CHECK(sizes.size() == 4 && arg.back() != 'x', "topology preset '", spec,
                      "': expected torus4d:AxBxCxD, e.g. torus4d:16x16x16x16");  // getline drops a trailing "x"
    double bw = opts.link_bandwidth > 0 ? opts.link_bandwidth : kTrn1LinkBw;
    double lat = opts.link_latency > 0 ? opts.link_latency : kNeuronLinkLat;
    std::vector<TopologyDim> dims;
    dims.reserve(4);
    const char* names[] = {"a", "b", "c", "d"};
    for (int i = 0; i < 4; ++i) dims.push_back(make_dim(names[i], TopoLevel::Chip, sizes[i], LinkKind::Ring, bw, lat));
    t = Topology(spec, std::move(dims), DeviceSpec::preset(opts.device.empty() ? "trn1-core" : opts.device));
    return t;
  } else {
    throw InvalidArgument("unknown topology preset '" + spec + "' (presets: " + presets_text() +
                          "; or a JSON file path)");
  }
  if (!opts.device.empty()) t.device_ = DeviceSpec::preset(opts.device);
  return t;
}

Topology Topology::load(const std::string& preset_or_file, const TopologyOptions& opts) {
  if (names_input_file(preset_or_file)) {
    TESSERA_ARG_CHECK(opts.link_bandwidth <= 0 && opts.link_latency <= 0 && opts.device.empty(),
                      "link and device options apply to presets; topology file '", preset_or_file,
                      "' sets its own figures");
    return from_json_file(preset_or_file);
  }
  return preset(preset_or_file, opts);
}

Topology Topology::from_json_file(const std::string& path) {
  return from_json_text(read_input_file(path, "topology file"), path);
}

Topology Topology::from_json_text(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // syntax, or a number out of range (out_of_range.406)
    bad_file(source, "malformed JSON: " + json_library_text(e));
  }
  check_fields(j, "the top level", {"name", "device", "dims"}, source);
  std::string name = j.contains("name") ? get_string(j, "name", "the top level", source) : source;

  DeviceSpec dev;
  if (!j.contains("device")) bad_file(source, "missing field 'device'");
  const json& jd = j.at("device");
  if (jd.is_string()) {
    try {
      dev = DeviceSpec::preset(jd.get<std::string>());
    } catch (const InvalidArgument& e) {
      bad_file(source, e.what());
    }
  } else {
    const std::string where = "'device'";
    check_fields(jd, where, {"name", "hbm_gib", "peak_tflops_bf16", "peak_tflops_fp32", "hbm_gb_s"}, source);
    dev.name = jd.contains("name") ? get_string(jd, "name", where, source) : "custom-core";
    dev.hbm_bytes = static_cast<uint64_t>(get_positive(jd, "hbm_gib", where, source) * kGiB);
    dev.peak_flops_bf16 = get_positive(jd, "peak_tflops_bf16", where, source) * 1e12;
    dev.peak_flops_fp32 = jd.contains("peak_tflops_fp32") ? get_positive(jd, "peak_tflops_fp32", where, source) * 1e12
                                                          : dev.peak_flops_bf16 / 4;
    dev.hbm_bandwidth = jd.contains("hbm_gb_s") ? get_positive(jd, "hbm_gb_s", where, source) * 1e9 : 0;
  }

  if (!j.contains("dims")) bad_file(source, "missing field 'dims'");
  const json& jdims = j.at("dims");
  if (!jdims.is_array() || jdims.empty()) bad_file(source, "'dims' must be a non-empty array");
  std::vector<TopologyDim> dims;
  for (size_t i = 0; i < jdims.size(); ++i) {
    const json& e = jdims[i];
    std::string where = "dims[" + std::to_string(i) + "]";
    check_fields(e, where, {"name", "size", "kind", "level", "bandwidth_gb_s", "latency_us"}, source);
    TopologyDim d;
    d.name = e.contains("name") ? get_string(e, "name", where, source) : "d" + std::to_string(i);
    if (!e.contains("size") || !e.at("size").is_number_integer() || e.at("size").get<long>() < 1 ||
        e.at("size").get<long>() > (1 << 24))
      bad_file(source, "field 'size' in " + where + " must be a positive integer");
    d.net.size = static_cast<int>(e.at("size").get<long>());
    try {
      d.net.kind = parse_link_kind(e.contains("kind") ? get_string(e, "kind", where, source) : "ring");
    } catch (const InvalidArgument& ex) {
      bad_file(source, where + ": " + ex.what());
    }
    std::string level = e.contains("level") ? get_string(e, "level", where, source) : "chip";
    if (level == "core")
      d.level = TopoLevel::Core;
    else if (level == "chip")
      d.level = TopoLevel::Chip;
    else if (level == "instance")
      d.level = TopoLevel::Instance;
    else
      bad_file(source, detail::concat(where, ": unknown level '", level, "' (expected core, chip or instance)"));
    d.net.bandwidth = get_positive(e, "bandwidth_gb_s", where, source) * 1e9;
    d.net.latency = get_positive(e, "latency_us", where, source) * kUs;
    dims.push_back(d);
  }
  try {
    return Topology(name, std::move(dims), dev);
  } catch (const InvalidArgument& e) {
    bad_file(source, e.what());
  }
}

int Topology::num_cores() const {
  int n = 1;
  for (const auto& d : dims_) n *= d.net.size;
  return n;
}

int Topology::level_size(TopoLevel l) const {
  int n = 1;
  for (const auto& d : dims_)
    if (d.level == l) n *= d.net.size;
  return n;
}

NetModel Topology::net_model() const {
  std::vector<NetDim> nd;
  nd.reserve(dims_.size());
  for (const auto& d : dims_) nd.push_back(d.net);
  return NetModel(std::move(nd));
}

Topology Topology::first_cores(int n) const {
  int total = num_cores();
  TESSERA_ARG_CHECK(n >= 1 && n <= total, "--cores ", n, " is outside 1..", total, " (topology '", name_, "' has ",
                    total, " cores)");
  if (n == total) return *this;
  std::vector<TopologyDim> dims;
  int left = n;
  for (const auto& d : dims_) {
    if (left == 1) break;
    if (left >= d.net.size) {
      TESSERA_ARG_CHECK(left % d.net.size == 0, "--cores ", n, " is not a whole number of '", d.name,
                        "' rows of topology '", name_, "'");
      dims.push_back(d);
      left /= d.net.size;
    } else {
      TopologyDim part = d;
      part.net.size = left;
      // A part of a ring has no wrap-around link; a part of a switch is still a switch.
      if (d.net.kind == LinkKind::Ring && left > 2) part.net.kind = LinkKind::Line;
      dims.push_back(part);
      left = 1;
    }
  }
  if (dims.empty()) {  // one core: the first dimension, cut to size 1 (no links to use)
    TopologyDim one = dims_.front();
    one.net.size = 1;
    if (one.net.kind == LinkKind::Ring) one.net.kind = LinkKind::Line;
    dims.push_back(one);
  }
  return Topology(name_ + " (first " + std::to_string(n) + " cores)", std::move(dims), device_);
}

std::string Topology::describe() const {
  std::ostringstream os;
  os << name_ << ": " << num_cores() << " cores of " << device_.name << " ("
     << static_cast<double>(device_.hbm_bytes) / kGiB << " GiB, " << device_.peak_flops_bf16 / 1e12
     << " TFLOP/s bf16)\n";
  for (const auto& d : dims_) {
    os << "  dim " << d.name << ": " << d.net.size << " x " << link_kind_name(d.net.kind) << " ("
       << topo_level_name(d.level) << " level), " << d.net.bandwidth / 1e9 << " GB/s per link per direction, "
       << d.net.latency / kUs << " us per hop\n";
  }
  return os.str();
}

}  // namespace tessera
