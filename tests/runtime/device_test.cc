#include "runtime/device.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "runtime/netmodel.h"
#include "runtime/tensor.h"

using namespace tessera;

TEST(DeviceSpec, PresetsFromPublicFigures) {
  auto trn1 = DeviceSpec::preset("trn1-core");
  EXPECT_EQ(trn1.hbm_bytes, 16ull << 30);
  EXPECT_DOUBLE_EQ(trn1.peak_flops_bf16, 95e12);
  auto trn2 = DeviceSpec::preset("trn2-core");
  EXPECT_EQ(trn2.hbm_bytes, 12ull << 30);
  EXPECT_THROW(DeviceSpec::preset("h100"), InvalidArgument);
  // The error names every preset, from the one list.
  try {
    DeviceSpec::preset("h100");
  } catch (const InvalidArgument& e) {
    for (const auto& n : DeviceSpec::preset_names()) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << n;
  }
}

TEST(DeviceSpec, OneListServesEveryTool) {
  // train_gpt validates --device against preset_names(); topologies (plan)
  // build their devices through preset(): both must see the same list,
  // including the dgx-a100 topology's device.
  const auto names = DeviceSpec::preset_names();
  ASSERT_EQ(names.size(), 6u);
  for (const auto& n : names) EXPECT_EQ(DeviceSpec::preset(n).name, n);
  for (const char* n : {"test-core", "trn1-core", "trn2-core", "inf2-core", "trn3-core", "a100-80gb"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  auto a100 = DeviceSpec::preset("a100-80gb");
  EXPECT_EQ(a100.hbm_bytes, 80ull << 30);
  EXPECT_DOUBLE_EQ(a100.peak_flops_fp32, 19.5e12);
}

TEST(Device, OutOfMemoryStatesRequestInUseAndCapacity) {
  DeviceSpec spec = DeviceSpec::preset("test-core");
  spec.hbm_bytes = 1000;
  Device dev(spec, 3);
  Tensor a = Tensor::empty({150}, DType::F32, &dev);  // 600 bytes
  try {
    Tensor b = Tensor::empty({101}, DType::F32, &dev);  // 404 more: over
    FAIL() << "expected DeviceOutOfMemory";
  } catch (const DeviceOutOfMemory& e) {
    EXPECT_EQ(e.requested(), 404u);
    EXPECT_EQ(e.in_use(), 600u);
    EXPECT_EQ(e.capacity(), 1000u);
    std::string msg = e.what();
    EXPECT_NE(msg.find("404"), std::string::npos);
    EXPECT_NE(msg.find("600"), std::string::npos);
    EXPECT_NE(msg.find("1000"), std::string::npos);
    EXPECT_NE(msg.find("test-core:3"), std::string::npos);
  }
  // The failed allocation charged nothing; exactly the rest still fits.
  EXPECT_EQ(dev.memory_stats().in_use, 600u);
  Tensor c = Tensor::empty({100}, DType::F32, &dev);
  EXPECT_EQ(dev.memory_stats().in_use, 1000u);
  EXPECT_EQ(dev.memory_stats().peak, 1000u);
}

TEST(Device, PeakTracksHighWaterMark) {
  Device dev(DeviceSpec::preset("test-core"));
  { Tensor a = Tensor::empty({1000}, DType::F32, &dev); }
  { Tensor b = Tensor::empty({10}, DType::F32, &dev); }
  auto s = dev.memory_stats();
  EXPECT_EQ(s.peak, 4000u);
  EXPECT_EQ(s.in_use, 0u);
  EXPECT_EQ(s.num_allocs, 2u);
  EXPECT_EQ(s.num_frees, 2u);
  dev.reset_peak();
  EXPECT_EQ(dev.memory_stats().peak, 0u);
}

TEST(SimClock, RooflineChargesTheSlowerOfComputeAndMemory) {
  Device dev(DeviceSpec::preset("test-core"));                     // 1e12 bf16, 0.5e12 fp32, 100e9 B/s
  double t1 = dev.clock().charge_compute(2e12, 1e9, DType::BF16);  // 2 s compute vs 0.01 s memory
  EXPECT_DOUBLE_EQ(t1, 2.0);
  double t2 = dev.clock().charge_compute(1e9, 50e9, DType::F32);  // 0.002 s vs 0.5 s
  EXPECT_DOUBLE_EQ(t2, 0.5);
  dev.clock().charge_comm(0.25);
  auto tot = dev.clock().totals();
  EXPECT_DOUBLE_EQ(tot.compute_s, 2.5);
  EXPECT_DOUBLE_EQ(tot.comm_s, 0.25);
  EXPECT_DOUBLE_EQ(tot.total_s(), 2.75);
}

TEST(NetModel, ClosedFormsByHand) {
  // Ring all-reduce, p=4, n=8e6 bytes, a=1e-6, B=1e9: 2*3*1e-6 + 2*3/4*8e6/1e9 = 6e-6 + 0.012
  EXPECT_DOUBLE_EQ(NetModel::ring_allreduce_time(4, 8e6, 1e-6, 1e9), 6e-6 + 0.012);
  // 2D torus 4x4, same links: 2*(3+3)*a + 2*(15/16)*n/B
  NetDim d{4, LinkKind::Ring, 1e9, 1e-6};
  NetModel m({d, d});
  EXPECT_NEAR(m.torus_allreduce_time(16e6), 12e-6 + 2.0 * 15 / 16 * 16e6 / 1e9, 1e-12);
  EXPECT_EQ(m.num_nodes(), 16);
  EXPECT_EQ(m.hops_between(0, 3), 1);   // wrap-around on the ring
  EXPECT_EQ(m.hops_between(0, 10), 4);  // (2,2) is two hops in each dim
  EXPECT_EQ(m.node(m.coords(13)), 13);
}
