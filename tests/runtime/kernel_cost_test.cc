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

// A100 (a100-80gb: 108 SMs, 128 x 256 x 64 tiles, 267.9 / 312 sustained on
// ideal shapes). GPT-3 175B's QKV GEMM at tp = 8, one sequence: 2048 x 4608
// over 12288. 128 x 256 tiles: 16 x 18 = 288 tiles, 3 waves of 108 = 324
// slots, 288 / 324 = 8/9 (the transpose, 8 x 36, the same); k = 12288 is 192
// whole steps of 64.
TEST(KernelCost, GemmEfficiencyQuantisesTilesAndWaves) {
  const DeviceSpec a100 = DeviceSpec::preset("a100-80gb");
  const double ideal = 267.9 / 312;
  EXPECT_DOUBLE_EQ(a100.sustained_fraction, ideal);
  EXPECT_NEAR(cost::gemm_efficiency(a100, 2048, 4608, 12288), ideal * 8 / 9, 1e-12);
  const cost::Kernel g = cost::gemm(2048, 4608, 12288, false);
  EXPECT_EQ(g.m, 2048);
  EXPECT_EQ(g.n, 4608);
  EXPECT_EQ(g.k, 12288);
  // FLOP-bound: 2 m n k at 312 TFLOP/s x that, plus the 4 us launch.
  EXPECT_NEAR(cost::kernel_seconds(a100, g, DType::BF16), 4e-6 + 2.0 * 2048 * 4608 * 12288 / (312e12 * ideal * 8 / 9),
              1e-12);
  // Whole waves of whole tiles sustain the ideal fraction: 108 tiles of 128 x 256.
  EXPECT_NEAR(cost::gemm_efficiency(a100, int64_t{128} * 108, 256, 4096), ideal, 1e-12);
  // One more row starts a second wave: efficiency (108 * 128 + 1) / (2 * 108 * 128)... the transpose (256 x 128
  // tiles) needs 55 x 2 = 110 tiles, 2 waves as well, so the same.
  EXPECT_NEAR(cost::gemm_efficiency(a100, 128 * 108 + 1, 256, 4096), ideal * (128.0 * 108 + 1) / (2 * 108 * 128.0),
              1e-12);
  // A contraction of 96 (the 1.7B model's head size) pays for 128: 3/4.
  EXPECT_NEAR(cost::gemm_efficiency(a100, int64_t{128} * 108, 256, 96), ideal * 0.75, 1e-12);
  // Batched: 36 products of one 128 x 256 tile each fill a third of a wave.
  EXPECT_NEAR(cost::gemm_efficiency(a100, 128, 256, 64, 36), ideal / 3, 1e-12);
  // Without compute units (trn1-core, test-core) every shape sustains the device's fraction.
  const DeviceSpec trn1 = DeviceSpec::preset("trn1-core");
  EXPECT_DOUBLE_EQ(cost::gemm_efficiency(trn1, 3, 5, 7), trn1.sustained_fraction);
}

// Growing any dimension never makes a GEMM faster, and the efficiency never
// exceeds what an ideal shape sustains.
TEST(KernelCost, GemmTimeIsMonotoneInEveryDimension) {
  const DeviceSpec a100 = DeviceSpec::preset("a100-80gb");
  auto t = [&](int64_t m, int64_t n, int64_t k) {
    return cost::kernel_seconds(a100, cost::gemm(m, n, k, false), DType::BF16);
  };
  for (int64_t m : {1, 100, 128, 1000, 2048, 8192})
    for (int64_t n : {1, 64, 256, 2304, 4608})
      for (int64_t k : {1, 64, 96, 1536, 12288}) {
        EXPECT_LE(cost::gemm_efficiency(a100, m, n, k), a100.sustained_fraction + 1e-15);
        EXPECT_LE(t(m, n, k), t(m + 1, n, k) * (1 + 1e-12)) << m << " " << n << " " << k;
        EXPECT_LE(t(m, n, k), t(m, n + 37, k) * (1 + 1e-12)) << m << " " << n << " " << k;
        EXPECT_LE(t(m, n, k), t(m, n, 2 * k) * (1 + 1e-12)) << m << " " << n << " " << k;
      }
}

// Memory-bound kernels of Megatron-LM's unfused attention, by hand (fp32
// bytes; the planner halves them at 16-bit): softmax reads and writes rows x
// cols, its backward reads two and writes one; dropout writes its output and
// a mask of one byte per element at 16 bit (half an element here).
TEST(KernelCost, UnfusedAttentionKernels) {
  const DeviceSpec a100 = DeviceSpec::preset("a100-80gb");
  EXPECT_DOUBLE_EQ(cost::softmax_forward(1024, 2048).bytes, 4.0 * 2 * 1024 * 2048);
  EXPECT_DOUBLE_EQ(cost::softmax_backward(1024, 2048).bytes, 4.0 * 3 * 1024 * 2048);
  EXPECT_DOUBLE_EQ(cost::dropout_forward(1000).bytes, 4.0 * 2.5 * 1000);
  // Softmax of 12 heads x 2048 rows of 2048 at bf16: 2 x 50.3 MB at the
  // 1.80 TB/s a streaming kernel measures (not the 2039 GB/s spec).
  cost::Kernel sm = cost::softmax_forward(int64_t{12} * 2048, 2048);
  sm.bytes *= 0.5;
  EXPECT_NEAR(cost::kernel_seconds(a100, sm, DType::BF16), 4e-6 + 2.0 * 2 * 12 * 2048 * 2048 / 1.80e12, 1e-12);
  // The score GEMM of 12 heads: [2048, 128] x [128, 2048], batched.
  const cost::Kernel qk = cost::batched_gemm(12, 2048, 2048, 128);
  EXPECT_DOUBLE_EQ(qk.flops, 2.0 * 12 * 2048 * 2048 * 128);
  EXPECT_EQ(qk.batch, 12);
  // 12 x 16 x 8 = 1536 tiles, 15 waves of 108 (1620 slots).
  EXPECT_NEAR(cost::gemm_efficiency(a100, 2048, 2048, 128, 12), a100.sustained_fraction * 1536 / 1620, 1e-12);
}

// Megatron-LM's cross entropy, by hand over 3 rows of 5 logits: on an
// fp32 copy of 16-bit logits the forward is cast (2 + 4 bytes), max (4),
// subtract (4 + 4), exp (4 + 4), sum (4), divide (4 + 4): 38 bytes a logit
// in 6 kernels; the backward scales (4 + 4) and casts back (4 + 2): 14 in
// 2. On the 16-bit logits themselves (--fp16-lm-cross-entropy): 16 and 4,
// no casts; fp32 logits: 32 and 8.
TEST(KernelCost, MegatronCrossEntropyKernels) {
  auto bytes = [](const std::vector<cost::Kernel>& ks) {
    double b = 0;
    for (const cost::Kernel& k : ks) b += k.bytes;
    return b;
  };
  EXPECT_EQ(cost::megatron_cross_entropy_forward(3, 5, 2, 4).size(), 6u);
  EXPECT_DOUBLE_EQ(bytes(cost::megatron_cross_entropy_forward(3, 5, 2, 4)), 38.0 * 15);
  EXPECT_EQ(cost::megatron_cross_entropy_backward(3, 5, 2, 4).size(), 2u);
  EXPECT_DOUBLE_EQ(bytes(cost::megatron_cross_entropy_backward(3, 5, 2, 4)), 14.0 * 15);
  EXPECT_EQ(cost::megatron_cross_entropy_forward(3, 5, 2, 2).size(), 5u);
  EXPECT_DOUBLE_EQ(bytes(cost::megatron_cross_entropy_forward(3, 5, 2, 2)), 16.0 * 15);
  EXPECT_EQ(cost::megatron_cross_entropy_backward(3, 5, 2, 2).size(), 1u);
  EXPECT_DOUBLE_EQ(bytes(cost::megatron_cross_entropy_backward(3, 5, 2, 2)), 4.0 * 15);
  EXPECT_DOUBLE_EQ(bytes(cost::megatron_cross_entropy_forward(3, 5, 4, 4)), 32.0 * 15);
  EXPECT_DOUBLE_EQ(bytes(cost::megatron_cross_entropy_backward(3, 5, 4, 4)), 8.0 * 15);
}

// Memory-bound kernels run at the measured HBM rate, hbm_bandwidth x
// hbm_sustained_fraction: on the A100 1.80 TB/s (88% of 2039 GB/s); on a
// device without a named measurement (trn1-core) the spec itself.
TEST(KernelCost, MemoryBoundKernelsRunAtTheSustainedBandwidth) {
  const DeviceSpec a100 = DeviceSpec::preset("a100-80gb");
  EXPECT_DOUBLE_EQ(a100.hbm_bandwidth, 2039e9);
  EXPECT_NEAR(a100.sustained_hbm_bandwidth(), 1.80e12, 1e-3);
  // GELU over 2048 x 6144 elements at bf16: reads and writes 2 bytes each,
  // 50.3 MB, 27.96 us at 1.80 TB/s (24.7 us at the spec), plus the 4 us launch.
  cost::Kernel g = cost::gelu_forward(int64_t{2048} * 6144);
  g = cost::in_dtype(g, DType::BF16);
  EXPECT_DOUBLE_EQ(g.bytes, 2.0 * 2 * 2048 * 6144);
  EXPECT_NEAR(cost::kernel_seconds(a100, g, DType::BF16), 4e-6 + 50331648.0 / 1.80e12, 1e-12);
  EXPECT_NEAR(cost::kernel_seconds(a100, g, DType::BF16), 31.962e-6, 1e-9);
  const DeviceSpec trn1 = DeviceSpec::preset("trn1-core");
  EXPECT_DOUBLE_EQ(trn1.hbm_sustained_fraction, 1.0);
  EXPECT_DOUBLE_EQ(trn1.sustained_hbm_bandwidth(), trn1.hbm_bandwidth);
}

// The GEMM library of the published Megatron-LM runs (2022: 230 TFLOP/s on
// an fp16 8192^3 GEMM, mli/transformers-benchmarks): that shape's 2048
// tiles of 128 x 256 fill 19 waves of 108 SMs to 2048/2052, so the ideal
// shape's fraction is 230/312 x 2052/2048 = 0.7386193, and the measured shape
// gets back exactly 230 TFLOP/s.
TEST(KernelCost, MegatronGemmLibraryFigure) {
  DeviceSpec a100 = DeviceSpec::preset("a100-80gb");
  EXPECT_NEAR(a100.megatron_sustained_fraction, 0.7386193, 1e-7);
  a100.sustained_fraction = a100.megatron_sustained_fraction;
  EXPECT_NEAR(cost::gemm_efficiency(a100, 8192, 8192, 8192) * 312e12, 230e12, 1e3);
  const cost::Kernel g = cost::gemm(8192, 8192, 8192, false);
  EXPECT_NEAR(cost::kernel_seconds(a100, g, DType::BF16), 4e-6 + 2.0 * 8192 * 8192 * 8192 / 230e12, 1e-12);
  // Presets without such a figure leave it unset (sustained_fraction applies).
  EXPECT_DOUBLE_EQ(DeviceSpec::preset("trn1-core").megatron_sustained_fraction, 0.0);
}

TEST(KernelCost, ClockChargesTheSameFigures) {
  Device dev(DeviceSpec::preset("trn1-core"));
  constexpr int64_t kM = 64, kN = 16, kK = 32;
  std::vector<float> a(kM * kK, 1.f), b(kK * kN, 1.f), c(kM * kN, 0.f);
  kern::gemm(&dev, false, false, kM, kN, kK, 1.f, a.data(), kK, b.data(), kN, 0.f, c.data(), kN);
  kern::gelu_forward(&dev, c.data(), c.data(), kM * kN);
  const double want = cost::kernel_seconds(dev.spec(), cost::gemm(kM, kN, kK, false)) +
                      cost::kernel_seconds(dev.spec(), cost::gelu_forward(kM * kN));
  // On a device with compute units the clock charges the GEMM's shaped cost
  // (1 of 108 SMs busy), not an unshaped roofline.
  Device a100(DeviceSpec::preset("a100-80gb"));
  kern::gemm(&a100, false, false, kM, kN, kK, 1.f, a.data(), kK, b.data(), kN, 0.f, c.data(), kN);
  EXPECT_DOUBLE_EQ(a100.clock().totals().compute_s, cost::kernel_seconds(a100.spec(), cost::gemm(kM, kN, kK, false)));
  EXPECT_GT(a100.clock().totals().compute_s,
            cost::kernel_seconds(a100.spec(), cost::Kernel{2.0 * kM * kN * kK, cost::gemm(kM, kN, kK, false).bytes}));
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
