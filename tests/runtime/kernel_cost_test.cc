// Kernel costs (runtime/kernel_cost.h) against hand-computed figures, and
// the SimClock charging exactly those figures.
#include "runtime/kernel_cost.h"

#include <gtest/gtest.h>

#include "runtime/device.h"
#include "runtime/kernels.h"

namespace tessera {
namespace {

TEST(KernelCost, GemmIsFlopBoundOnTrn1) {
  // 1024^3 fp32 GEMM on trn1-core: 2 x 2^30 FLOPs at 23.75 TFLOP/s x 0.5
  // sustained = 180.84 us; its 12 MiB at 410 GiB/s take 28.6 us, so FLOPs
  // bound; plus the 1 us launch: 181.84 us.
  const DeviceSpec trn1 = DeviceSpec::preset("trn1-core");
  const cost::Kernel g = cost::gemm(1024, 1024, 1024, false);
  EXPECT_DOUBLE_EQ(g.flops, 2147483648.0);
  EXPECT_DOUBLE_EQ(g.bytes, 4.0 * 3 * 1048576);
  EXPECT_NEAR(cost::kernel_seconds(trn1, g), 1e-6 + 2147483648.0 / 11.875e12, 1e-15);
  EXPECT_NEAR(cost::kernel_seconds(trn1, g), 181.84e-6, 0.01e-6);
  // Accumulating reads C as well.
  EXPECT_DOUBLE_EQ(cost::gemm(1024, 1024, 1024, true).bytes, 4.0 * 4 * 1048576);
}

TEST(KernelCost, SmallKernelsAreMemoryBound) {
  // LayerNorm of 128 x 128: 131072 FLOPs (11 ns) but 132096 bytes at
  // 410 GiB/s = 300.06 ns; plus the launch.
  const DeviceSpec trn1 = DeviceSpec::preset("trn1-core");
  const cost::Kernel ln = cost::layernorm_forward(128, 128);
  EXPECT_DOUBLE_EQ(ln.flops, 131072.0);
  EXPECT_DOUBLE_EQ(ln.bytes, 4.0 * (2 * 16384 + 256));
  EXPECT_NEAR(cost::kernel_seconds(trn1, ln), 1e-6 + 132096.0 / (410.0 * 1073741824.0), 1e-15);
  // Causal attention of 4 x 2 heads of [128, 32]: 8256 score entries per head.
  const cost::Kernel at = cost::attention_forward(4, 2, 128, 32);
  EXPECT_DOUBLE_EQ(at.flops, 8 * (4.0 * 32 * 8256 + 5.0 * 8256));
  EXPECT_DOUBLE_EQ(at.bytes, 4.0 * 8 * (4.0 * 128 * 32 + 8256));
}

TEST(KernelCost, ClockChargesTheSameFigures) {
  Device dev(DeviceSpec::preset("trn1-core"));
  constexpr int64_t kM = 64, kN = 16, kK = 32;
  std::vector<float> a(kM * kK, 1.f), b(kK * kN, 1.f), c(kM * kN, 0.f);
  kern::gemm(&dev, false, false, kM, kN, kK, 1.f, a.data(), kK, b.data(), kN, 0.f, c.data(), kN);
  kern::gelu_forward(&dev, c.data(), c.data(), kM * kN);
  const double want = cost::kernel_seconds(dev.spec(), cost::gemm(kM, kN, kK, false)) +
                      cost::kernel_seconds(dev.spec(), cost::gelu_forward(kM * kN));
  ClockTotals t = dev.clock().totals();
  EXPECT_DOUBLE_EQ(t.compute_s, want);
  EXPECT_DOUBLE_EQ(t.kernels, 2.0);
  dev.clock().charge_idle(1e-3);
  dev.clock().charge_comm(2e-3);
  t = dev.clock().totals();
  EXPECT_DOUBLE_EQ(t.idle_s, 1e-3);
  EXPECT_DOUBLE_EQ(t.total_s(), want + 3e-3);
}

}  // namespace
}  // namespace tessera
