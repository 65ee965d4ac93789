#include "runtime/topology.h"

#include <gtest/gtest.h>

#include <cmath>

#include "runtime/error.h"

namespace tessera {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

TEST(Topology, Trn1Instance) {
  Topology t = Topology::preset("trn1.32xlarge");
  EXPECT_EQ(t.num_cores(), 32);
  EXPECT_EQ(t.cores_per_chip(), 2);
  EXPECT_EQ(t.chips_per_instance(), 16);
  EXPECT_EQ(t.num_instances(), 1);
  EXPECT_EQ(t.device().hbm_bytes, 16ull << 30);
  ASSERT_EQ(t.dims().size(), 3u);
  EXPECT_EQ(t.dims()[1].net.kind, LinkKind::Ring);
  EXPECT_DOUBLE_EQ(t.dims()[1].net.bandwidth, 384 * kGiB / 4);  // 384 GiB/s per chip over 4 links
  NetModel m = t.net_model();
  EXPECT_EQ(m.num_nodes(), 32);
  // Core 0 (chip 0,0) to core 2 (chip 1,0): one NeuronLink hop; to chip (3,0) wraps around: 1 hop.
  EXPECT_EQ(m.hops_between(0, 2), 1);
  EXPECT_EQ(m.hops_between(0, 6), 1);
  EXPECT_EQ(m.hops_between(0, 4), 2);
}

TEST(Topology, ClusterAddsNetworkDimension) {
  Topology t = Topology::preset("trn1-cluster:4");
  EXPECT_EQ(t.num_cores(), 128);
  EXPECT_EQ(t.num_instances(), 4);
  // 800 Gbps per instance shared by its 32 cores.
  EXPECT_DOUBLE_EQ(t.dims().back().net.bandwidth, 100e9 / 32);
  EXPECT_EQ(t.dims().back().net.kind, LinkKind::Switch);
}

TEST(Topology, Trn2AndUltraserver) {
  EXPECT_EQ(Topology::preset("trn2.48xlarge").num_cores(), 128);
  Topology u = Topology::preset("trn2-ultraserver");
  EXPECT_EQ(u.num_cores(), 512);
  EXPECT_EQ(u.num_instances(), 4);
  EXPECT_EQ(u.dims().back().net.kind, LinkKind::Ring);
}

// The inference instance and the switched generation (docs/planner.md's figures).
TEST(Topology, Inf2RingAndTrn3Switch) {
  Topology inf = Topology::preset("inf2.48xlarge");
  EXPECT_EQ(inf.num_cores(), 24);
  EXPECT_EQ(inf.cores_per_chip(), 2);
  EXPECT_EQ(inf.chips_per_instance(), 12);
  EXPECT_EQ(inf.device().hbm_bytes, 16ull << 30);                // 32 GiB per chip over 2 cores
  EXPECT_DOUBLE_EQ(inf.device().hbm_bandwidth, 820 * kGiB / 2);  // 820 GiB/s per chip
  EXPECT_DOUBLE_EQ(inf.device().peak_flops_bf16, 190e12 / 2);
  ASSERT_EQ(inf.dims().size(), 2u);
  EXPECT_EQ(inf.dims()[1].net.kind, LinkKind::Ring);
  EXPECT_DOUBLE_EQ(inf.dims()[1].net.bandwidth, 192 * kGiB / 2);  // 192 GiB/s per chip, 2 ring neighbours
  NetModel m = inf.net_model();
  // One row: chip 6 is 6 hops from chip 0 either way round, chip 11 one (the wrap).
  EXPECT_EQ(m.hops_between(0, 2 * 6), 6);
  EXPECT_EQ(m.hops_between(0, 2 * 11), 1);
  EXPECT_EQ(m.hops_between(0, 2 * 3), 3);

  Topology t3 = Topology::preset("trn3-ultraserver");
  EXPECT_EQ(t3.num_cores(), 64 * 8);
  EXPECT_EQ(t3.device().hbm_bytes, 18ull << 30);  // 144 GiB per chip over 8 cores
  EXPECT_DOUBLE_EQ(t3.device().peak_flops_bf16, 671e12 / 8);
  EXPECT_EQ(t3.dims()[1].net.kind, LinkKind::Switch);
  EXPECT_DOUBLE_EQ(t3.dims()[1].net.bandwidth, 2.56e12);
  NetModel s = t3.net_model();
  // NeuronSwitch: every chip one hop from every other.
  for (int chip : {1, 7, 32, 63}) EXPECT_EQ(s.hops_between(0, 8 * chip), 1) << chip;
  EXPECT_EQ(Topology::preset("trn3-ultraserver:144").num_cores(), 144 * 8);
  try {
    Topology::preset("trn3-ultraserver:100");
    FAIL() << "a 100-chip Trn3 UltraServer was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("64 (Gen1) or 144 (Gen2)"), std::string::npos) << e.what();
  }
}

TEST(Topology, Torus4dWithLinkOptions) {
  TopologyOptions o;
  o.link_bandwidth = 50e9;
  o.link_latency = 3e-6;
  Topology t = Topology::preset("torus4d:16x16x16x16", o);
  EXPECT_EQ(t.num_cores(), 65536);
  EXPECT_EQ(t.cores_per_chip(), 1);
  for (const auto& d : t.dims()) {
    EXPECT_EQ(d.net.size, 16);
    EXPECT_DOUBLE_EQ(d.net.bandwidth, 50e9);
    EXPECT_DOUBLE_EQ(d.net.latency, 3e-6);
  }
  // The closed form over 4 dims of 16: 2 * 4 * 15 alpha + 2 (p-1)/p n / B.
  double n = 1e9;
  double expect = 2 * 4 * 15 * 3e-6 + 2.0 * 65535 / 65536 * n / 50e9;
  EXPECT_NEAR(t.net_model().torus_allreduce_time(n), expect, 1e-12);
}

TEST(Topology, DgxA100) {
  Topology t = Topology::preset("dgx-a100:4");
  EXPECT_EQ(t.num_cores(), 32);
  EXPECT_DOUBLE_EQ(t.device().peak_flops_bf16, 312e12);
  EXPECT_EQ(t.device().hbm_bytes, 80ull << 30);
  EXPECT_DOUBLE_EQ(t.dims()[1].net.bandwidth, 200e9 / 8);  // 8 x 200 Gb/s per node over 8 GPUs
}

TEST(Topology, FirstCores) {
  Topology t = Topology::preset("trn1.32xlarge").first_cores(16);
  EXPECT_EQ(t.num_cores(), 16);
  ASSERT_EQ(t.dims().size(), 3u);
  EXPECT_EQ(t.dims()[2].net.size, 2);
  EXPECT_THROW(Topology::preset("trn1.32xlarge").first_cores(64), InvalidArgument);
  EXPECT_THROW(Topology::preset("trn1-cluster:4").first_cores(48), InvalidArgument);
  EXPECT_EQ(Topology::preset("trn1-cluster:4").first_cores(96).num_instances(), 3);
  // One core is a valid topology: the first dimension cut to size 1.
  Topology one = Topology::preset("trn1.32xlarge").first_cores(1);
  EXPECT_EQ(one.num_cores(), 1);
  ASSERT_EQ(one.dims().size(), 1u);
  EXPECT_EQ(one.dims()[0].net.size, 1);
  EXPECT_EQ(one.dims()[0].name, Topology::preset("trn1.32xlarge").dims()[0].name);
  EXPECT_EQ(Topology::preset("torus4d:4x4x4x4").first_cores(1).num_cores(), 1);
}

TEST(Topology, UnknownPresetNamesPresets) {
  try {
    Topology::preset("trn9.huge");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("trn1.32xlarge"), std::string::npos);
  }
  EXPECT_THROW(Topology::preset("torus4d:4x4x4"), InvalidArgument);
  EXPECT_THROW(Topology::preset("trn1-cluster:0"), InvalidArgument);
  EXPECT_THROW(Topology::preset("trn1-cluster"), InvalidArgument);
  TopologyOptions o;
  o.link_bandwidth = 1e9;  // only torus4d takes link figures
  EXPECT_THROW(Topology::preset("trn1.32xlarge", o), InvalidArgument);
  TopologyOptions d;
  d.device = "a100-80gb";
  EXPECT_DOUBLE_EQ(Topology::preset("torus4d:2x2x2x2", d).device().peak_flops_bf16, 312e12);
}

TEST(Topology, Json) {
  Topology t = Topology::from_json_text(R"({"name": "mine", "device": "trn2-core",
    "dims": [{"name": "x", "size": 4, "kind": "ring", "bandwidth_gb_s": 100, "latency_us": 1},
             {"name": "net", "size": 2, "kind": "switch", "level": "instance", "bandwidth_gb_s": 10, "latency_us": 10}]})",
                                        "mine.json");
  EXPECT_EQ(t.num_cores(), 8);
  EXPECT_EQ(t.num_instances(), 2);
  EXPECT_DOUBLE_EQ(t.dims()[0].net.bandwidth, 100e9);
  EXPECT_DOUBLE_EQ(t.dims()[1].net.latency, 10e-6);
}

TEST(Topology, JsonErrorsNameTheFile) {
  auto expect_error = [](const std::string& text, const std::string& needle) {
    try {
      Topology::from_json_text(text, "bad.json");
      ADD_FAILURE() << "no error for " << text;
    } catch (const FormatError& e) {
      std::string w = e.what();
      EXPECT_NE(w.find("bad.json"), std::string::npos) << w;
      EXPECT_NE(w.find(needle), std::string::npos) << w;
    }
  };
  expect_error("{\"device\": ", "malformed JSON");
  expect_error(R"({"device": "trn1-core", "dims": [], "colour": 1})", "unknown field 'colour'");
  expect_error(R"({"device": "trn1-core", "dims": [{"size": 4, "bandwidth_gb_s": 1, "latency_us": 1, "speed": 2}]})",
               "unknown field 'speed'");
  expect_error(R"({"device": "trn1-core", "dims": [{"size": 0, "bandwidth_gb_s": 1, "latency_us": 1}]})", "size");
  expect_error(R"({"device": "nope", "dims": [{"size": 2, "bandwidth_gb_s": 1, "latency_us": 1}]})", "nope");
  expect_error(
      R"({"device": "trn1-core", "dims": [{"size": 2, "kind": "tree", "bandwidth_gb_s": 1, "latency_us": 1}]})",
      "tree");
}

}  // namespace
}  // namespace tessera
