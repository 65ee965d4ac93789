#include "parallel/cost_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "parallel/mesh.h"
#include "parallel/models/gpt/trainer.h"
#include "runtime/error.h"
#include "runtime/kernel_cost.h"

namespace tessera::parallel {
namespace {

// Parameter counts against the released checkpoints' sizes.
TEST(ModelConfig, ParameterCounts) {
  EXPECT_EQ(ModelConfig::preset("gpt2-124m").total_params(), 124439808);     // Hugging Face gpt2
  EXPECT_EQ(ModelConfig::preset("llama2-7b").total_params(), 6738415616);    // Llama-2-7b
  EXPECT_EQ(ModelConfig::preset("llama2-13b").total_params(), 13015864320);  // Llama-2-13b
  EXPECT_EQ(ModelConfig::preset("llama2-70b").total_params(), 68976648192);  // Llama-2-70b
  // GPT-3 175B: 96 (12 h^2 + 13 h) + V h + 2048 h + 2 h with h = 12288, V = 50257.
  EXPECT_EQ(ModelConfig::preset("gpt3-175b").total_params(), 174604259328);
}

TEST(ModelConfig, JsonAndErrors) {
  ModelConfig m = ModelConfig::from_json_text(R"({"layers": 4, "hidden": 256, "heads": 8, "vocab": 1000,
                                                  "max_seq": 128})",
                                              "tiny.json");
  EXPECT_EQ(m.ffn_hidden, 1024);  // 4 * hidden by default
  EXPECT_EQ(m.kv_heads, 8);
  auto err = [](const std::string& text, const std::string& needle) {
    try {
      ModelConfig::from_json_text(text, "m.json");
      ADD_FAILURE() << text;
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find("m.json"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  err(R"({"layers": 4, "hidden": 256)", "malformed JSON");
  err(R"({"layers": 4, "hidden": 256, "heads": 8, "vocab": 1000, "max_seq": 128, "dropout": 0.1})",
      "unknown field 'dropout'");
  err(R"({"layers": 4, "hidden": 256, "heads": 7, "vocab": 1000, "max_seq": 128})", "do not divide");
  err(R"({"layers": 4, "hidden": 256, "heads": 8, "max_seq": 128})", "missing field 'vocab'");
  err(R"({"layers": -4, "hidden": 256, "heads": 8, "vocab": 1000, "max_seq": 128})", "positive integer");
  EXPECT_THROW(ModelConfig::preset("gpt5"), InvalidArgument);
}

// Narayanan et al. 2021 for gpt2-124m, B=1, s=1024 (l=12, h=768, V=50257), by hand:
//   full recompute: 96 B s l h^2 (1 + s/6h + V/16lh) = 695784701952 * 1.563065...
//   none:           72 B s l h^2 (1 + s/6h + V/12lh) (the logit layer is not recomputed)
//   selective:      72 B s l h^2 + 16 B s^2 h l + 6 B s h V
TEST(Formulas, StepFlops) {
  ModelConfig m = ModelConfig::preset("gpt2-124m");
  EXPECT_NEAR(step_flops(m, 1, 1024, Recompute::Full), 1087545802752.0, 1.0);
  EXPECT_NEAR(step_flops(m, 1, 1024, Recompute::None), 874944921600.0, 1.0);
  EXPECT_NEAR(step_flops(m, 1, 1024, Recompute::Selective), 913599627264.0, 1.0);
  // Linear in the batch; and the closed form of the paper for GPT-3 175B.
  ModelConfig g = ModelConfig::preset("gpt3-175b");
  const double B = 1536, s = 2048, l = 96, h = 12288, V = 50257;
  EXPECT_NEAR(step_flops(g, B, 2048, Recompute::Full) / (96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))),
              1.0, 1e-12);
}

// Korthikanti et al. 2022 for GPT-3 175B (s=2048, b=1, h=12288, a=96, 5as/h = 80), by hand:
//   no parallelism: sbh (34 + 80) = 2868903936 bytes
//   TP=8 only:      sbh (10 + 24/8 + 80/8) = 578813952
//   TP=8 + SP:      sbh (34 + 80) / 8 = 358612992
//   selective + SP: 34 sbh / 8 = 106954752
//   full:           2 sbh = 50331648
TEST(Formulas, ActivationBytes) {
  ModelConfig g = ModelConfig::preset("gpt3-175b");
  EXPECT_DOUBLE_EQ(layer_activation_bytes(g, 2048, 1, 1, false, Recompute::None), 2868903936.0);
  EXPECT_DOUBLE_EQ(layer_activation_bytes(g, 2048, 1, 8, false, Recompute::None), 578813952.0);
  EXPECT_DOUBLE_EQ(layer_activation_bytes(g, 2048, 1, 8, true, Recompute::None), 358612992.0);
  EXPECT_DOUBLE_EQ(layer_activation_bytes(g, 2048, 1, 8, true, Recompute::Selective), 106954752.0);
  EXPECT_DOUBLE_EQ(layer_activation_bytes(g, 2048, 1, 1, false, Recompute::Full), 50331648.0);
  EXPECT_DOUBLE_EQ(layer_activation_bytes(g, 2048, 2, 1, false, Recompute::Full), 2 * 50331648.0);
  EXPECT_DOUBLE_EQ(layer_activation_bytes(g, 2048, 1, 1, false, Recompute::Full, true), 2 * 50331648.0);
}

TEST(Formulas, StateBytes) {
  StateBytes a = state_bytes_per_param(false, false, 8);
  EXPECT_DOUBLE_EQ(a.weights + a.grads + a.optimizer, 16);
  StateBytes z = state_bytes_per_param(false, true, 8);
  EXPECT_DOUBLE_EQ(z.weights + z.grads + z.optimizer, 4 + 12.0 / 8);
  StateBytes f = state_bytes_per_param(true, false, 8);
  EXPECT_DOUBLE_EQ(f.weights + f.grads + f.optimizer, 16);
  StateBytes fz = state_bytes_per_param(true, true, 4);
  EXPECT_DOUBLE_EQ(fz.weights + fz.grads + fz.optimizer, 8 + 8.0 / 4);
}

TEST(Formulas, InFlight) {
  EXPECT_EQ(in_flight(0, 4, 1, 8), 4);  // 1F1B: stage i holds p - i
  EXPECT_EQ(in_flight(3, 4, 1, 8), 1);
  EXPECT_EQ(in_flight(0, 4, 1, 2), 2);  // fewer micro-batches than stages
  EXPECT_EQ(in_flight(0, 1, 1, 16), 1);
  // Interleaved, p=4, v=2: stage 0 holds 2*3 + 4 + 1 = 11 chunks of L/8 layers,
  // i.e. L (1 + (p-1)/(p v)) = 11 L / 8 layers (Korthikanti et al. 2022).
  EXPECT_EQ(in_flight(0, 4, 2, 8), 11);
  EXPECT_EQ(in_flight(3, 4, 2, 8), 5);
}

TEST(Formulas, Partition) {
  EXPECT_EQ(partition_layers(96, 8, false, 0.33), std::vector<int>(8, 12));
  EXPECT_EQ(partition_layers(10, 4, false, 0), (std::vector<int>{2, 2, 3, 3}));
  // gpt2-124m's LM head is worth ~4.5 layers at s=1024: the last stage gets 1 layer.
  EXPECT_EQ(partition_layers(12, 4, true, 4.5), (std::vector<int>{3, 4, 4, 1}));
  EXPECT_EQ(partition_layers(96, 8, true, 0.33), std::vector<int>(8, 12));
  EXPECT_THROW(partition_layers(4, 8, false, 0), InvalidArgument);
}

// One core, no parallelism: memory against hand-computed totals; time at
// least the FLOPs at the sustained rate and at most a quarter more (the rest
// is memory-bound: mostly the cross-entropy reading and writing 1024 x 50257
// logits, 0.41 GB per micro-batch in bf16, ~1 ms each at 410 GiB/s; then
// launches and the optimizer step). gpt2-124m, b=1, s=1024, bf16: params 124439808 * 2 =
// 248879616 bytes (grads the same, optimizer * 6); activations 12 sbh (34 +
// 5as/h) + 4 s V (fp32 logits) = 1281691648; step of B=8: 8 * 72 s l h^2 (1 +
// s/6h + V/12lh) at 95e12 * 0.5 FLOP/s = 0.147359 s.
TEST(CostModel, SingleCoreByHand) {
  ModelConfig m = ModelConfig::preset("gpt2-124m");
  TrainingConfig tc;
  tc.global_batch = 8;
  tc.seq = 1024;
  tc.efficiency = 0.5;
  CostModel cm(m, DeviceSpec::preset("trn1-core"), tc);
  PlanChoice c;
  c.stage_layers = {12};
  PlanCost k = cm.evaluate(c, emulated_group_nets(1, 1, 1));
  EXPECT_DOUBLE_EQ(k.memory.params, 248879616.0);
  EXPECT_DOUBLE_EQ(k.memory.grads, 248879616.0);
  EXPECT_DOUBLE_EQ(k.memory.optimizer, 6 * 248879616.0);
  EXPECT_DOUBLE_EQ(k.memory.activations, 1281691648.0);
  EXPECT_DOUBLE_EQ(k.memory.total, 3272728576.0);
  EXPECT_EQ(k.num_micro_batches, 8);
  EXPECT_GT(k.time.total, 0.14735914469052633);
  EXPECT_LT(k.time.total, 1.25 * 0.14735914469052633);
  EXPECT_DOUBLE_EQ(k.time.tp_comm + k.time.pp_comm + k.time.bubble + k.time.dp_comm, 0.0);
  EXPECT_LT(k.mfu, 0.5);
  EXPECT_GT(k.mfu, 0.5 / 1.25);
}

// Communication is costed as the group's communicator runs it
// (collectives::predict): dp = 8 emulated ranks, one gradient bucket: an
// all-reduce of the gradients (direct, shared memory), the loss's two floats
// (oneshot); with ZeRO-1 a reduce-scatter and an all-gather of a slice each,
// and the norm's float.
TEST(CostModel, CommIsTheCommunicatorsCost) {
  ModelConfig m = ModelConfig::preset("gpt2-124m");
  TrainingConfig tc;
  tc.global_batch = 8;
  tc.seq = 128;
  tc.fp32 = true;
  tc.bucket_elems = int64_t{1} << 30;  // one bucket
  CostModel cm(m, DeviceSpec::preset("trn1-core"), tc);
  const GroupNets nets = emulated_group_nets(1, 1, 8);
  PlanChoice c;
  c.dp = 8;
  c.stage_layers = {12};
  const int64_t P = m.total_params(), padded = (P + 7) / 8 * 8;
  using collectives::CollKind;
  auto pred = [&](CollKind kind, int64_t n) { return collectives::predict(kind, n, DType::F32, nets.dp).seconds; };
  PlanCost k = cm.evaluate(c, nets);
  EXPECT_DOUBLE_EQ(k.time.dp_comm, pred(CollKind::AllReduce, padded) + pred(CollKind::AllReduce, 2));
  EXPECT_EQ(collectives::predict(CollKind::AllReduce, padded, DType::F32, nets.dp).algorithm, "direct");
  c.zero1 = true;
  PlanCost z = cm.evaluate(c, nets);
  EXPECT_DOUBLE_EQ(z.time.dp_comm, pred(CollKind::ReduceScatter, padded / 8) + pred(CollKind::AllGather, padded / 8) +
                                       pred(CollKind::AllReduce, 1) + pred(CollKind::AllReduce, 2));
  EXPECT_LT(z.memory.optimizer, k.memory.optimizer / 7);
}

// Overlapped DP reduction (bucketed DP): every full bucket reduces behind
// the last micro-batch's backward; only the last bucket (and the loss's two
// floats) show. On test-core (1 TFLOP/s) the backward of gpt2-124m's 128
// tokens takes ~60 ms and the 118 full 1 Mi-element buckets' all-reduces
// over 8 emulated ranks well under that, so they hide entirely.
TEST(CostModel, OverlappedGradReduceShowsTheLastBucket) {
  ModelConfig m = ModelConfig::preset("gpt2-124m");
  TrainingConfig tc;
  tc.global_batch = 8;
  tc.seq = 128;
  tc.fp32 = true;
  const GroupNets nets = emulated_group_nets(1, 1, 8);
  PlanChoice c;
  c.dp = 8;
  c.stage_layers = {12};
  const int64_t P = m.total_params(), E = tc.bucket_elems, nb = (P + E - 1) / E;
  const int64_t tail = (P - (nb - 1) * E + 7) / 8 * 8;
  using collectives::CollKind;
  auto pred = [&](CollKind kind, int64_t n) { return collectives::predict(kind, n, DType::F32, nets.dp).seconds; };
  const double all = static_cast<double>(nb - 1) * pred(CollKind::AllReduce, E) + pred(CollKind::AllReduce, tail) +
                     pred(CollKind::AllReduce, 2);
  const PlanCost off = CostModel(m, DeviceSpec::preset("test-core"), tc).evaluate(c, nets);
  EXPECT_NEAR(off.time.dp_comm, all, 1e-12 * all);
  tc.overlap_grad_reduce = true;
  const PlanCost on = CostModel(m, DeviceSpec::preset("test-core"), tc).evaluate(c, nets);
  EXPECT_NEAR(on.time.dp_comm, pred(CollKind::AllReduce, tail) + pred(CollKind::AllReduce, 2), 1e-15);
  EXPECT_DOUBLE_EQ(on.time.compute, off.time.compute);
  EXPECT_NEAR(on.time.total, off.time.total - (off.time.dp_comm - on.time.dp_comm), 1e-12);
  // One bucket: nothing to hide behind.
  tc.bucket_elems = int64_t{1} << 30;
  const PlanCost one_off = [&] {
    TrainingConfig t2 = tc;
    t2.overlap_grad_reduce = false;
    return CostModel(m, DeviceSpec::preset("test-core"), t2).evaluate(c, nets);
  }();
  EXPECT_DOUBLE_EQ(CostModel(m, DeviceSpec::preset("test-core"), tc).evaluate(c, nets).time.dp_comm,
                   one_off.time.dp_comm);
}

// Megatron-LM's runtime with sequence parallelism gathers each
// column-parallel input again in the backward pass (Korthikanti et al.
// 2022, 4.2.2): two all-gathers of the sequence shard per layer and
// micro-batch more than tessera's; at fp32 (no 16-bit reductions) the only
// other change in tp_comm is the gradient buckets'.
TEST(CostModel, MegatronRedoesSequenceParallelGathers) {
  ModelConfig m = ModelConfig::preset("gpt2-124m");
  TrainingConfig tc;
  tc.global_batch = 4;
  tc.seq = 128;
  tc.fp32 = true;
  const GroupNets nets = emulated_group_nets(2, 1, 1);
  PlanChoice c;
  c.tp = 2;
  c.micro_batch = 2;
  c.sequence_parallel = true;
  c.stage_layers = {12};
  const PlanCost ts = CostModel(m, DeviceSpec::preset("trn1-core"), tc).evaluate(c, nets);
  tc.runtime = StepRuntime::MegatronLM;
  const PlanCost mg = CostModel(m, DeviceSpec::preset("trn1-core"), tc).evaluate(c, nets);
  using collectives::CollKind;
  auto pred = [&](CollKind kind, int64_t n) { return collectives::predict(kind, n, DType::F32, nets.tp).seconds; };
  const double gather = pred(CollKind::AllGather, int64_t{2} * 128 / 2 * 768);
  // The sequence-parallel weights' gradients (norms, row-parallel biases,
  // positions, final norm) are summed over TP per gradient bucket: tessera's
  // 1 Mi-element buckets, Megatron-LM's one buffer.
  const double sp = 12.0 * static_cast<double>(m.layer_params() - m.layer_params_tp_sharded()) + 1024.0 * 768 + 2 * 768;
  const int64_t P = (12 * m.layer_params_tp_sharded()) / 2 + 12 * (m.layer_params() - m.layer_params_tp_sharded()) +
                    int64_t{50257} * 768 / 2 + int64_t{1024} * 768 + int64_t{2} * 768;
  const int64_t nb = (P + (int64_t{1} << 20) - 1) >> 20;
  const double sp_sums =
      pred(CollKind::AllReduce, std::llround(sp)) -
      static_cast<double>(nb) * pred(CollKind::AllReduce, std::llround(sp / static_cast<double>(nb)));
  EXPECT_NEAR(mg.time.tp_comm - ts.time.tp_comm, 2 /*micro-batches*/ * 12 * 2 * gather + sp_sums, 1e-12);
  // Unfused attention over the whole square costs more than the fused causal kernel.
  EXPECT_GT(mg.time.compute, ts.time.compute);
  EXPECT_EQ(parse_runtime("megatron-lm"), StepRuntime::MegatronLM);
  EXPECT_THROW(parse_runtime("nccl"), InvalidArgument);
}

// Megatron-LM since late 2021 runs each column-parallel layer's TP
// collective of the backward pass beside a GEMM (ColumnParallelLinear with
// async all-reduce; with sequence parallelism the input's all-gather beside
// the input-gradient GEMM, the reduce-scatter beside the weight-gradient
// GEMM): per layer and micro-batch, the QKV and FC1 layers each hide
// min(collective, GEMM) of it. Nothing else changes.
TEST(CostModel, MegatronOverlapsTheColumnParallelBackwardCollectives) {
  // h 4096 over tp 8: QKV 1536 and FC1 2048 output columns a rank, biases.
  const ModelConfig m = ModelConfig::from_json_text(
      R"({"layers": 2, "hidden": 4096, "heads": 32, "vocab": 1000, "max_seq": 2048})", "wide.json");
  const int t = 8;
  const GroupNets nets = emulated_group_nets(t, 1, 1);
  TrainingConfig tc;
  tc.global_batch = 2;
  tc.seq = 2048;
  tc.runtime = StepRuntime::MegatronLM;
  using collectives::CollKind;
  auto pred = [&](CollKind kind, int64_t count) {  // 16-bit elements; NCCL reduces in 16 bits
    if (kind == CollKind::AllGather) return collectives::predict(kind, count, DType::BF16, nets.tp).seconds;
    return collectives::predict(kind, (count + 1) / 2, DType::F32, nets.tp).seconds;
  };
  const int64_t n = 2048, c = 4096;  // tokens of a micro-batch of 1, hidden
  // An A100's GEMMs (at the Megatron-LM figure) are shorter than these
  // shared-memory collectives, which are hidden only in part; the test
  // core's (1 TFLOP/s) are longer, and hide them whole.
  for (const char* name : {"a100-80gb", "test-core"}) {
    DeviceSpec dev = DeviceSpec::preset(name);
    dev.sustained_fraction = gemm_sustained_fraction(dev, tc);
    auto secs = [&](cost::Kernel k) {  // bf16: half the fp32 kernel's bytes
      k.bytes *= 0.5;
      return cost::kernel_seconds(dev, k, DType::BF16);
    };
    const bool in_part = std::string(name) == "a100-80gb";
    for (bool sp : {false, true}) {
      SCOPED_TRACE(std::string(name) + (sp ? ", sequence parallel" : ", tensor parallel"));
      PlanChoice ch;
      ch.tp = t;
      ch.sequence_parallel = sp;
      ch.stage_layers = {2};
      tc.overlap_tp_backward = false;
      const PlanCost off = CostModel(m, DeviceSpec::preset(name), tc).evaluate(ch, nets);
      tc.overlap_tp_backward = true;
      const PlanCost on = CostModel(m, DeviceSpec::preset(name), tc).evaluate(ch, nets);
      double hidden = 0;  // per layer and micro-batch
      for (int64_t out : {int64_t{3 * 4096 / t}, int64_t{4 * 4096 / t}}) {
        const double wgrad = secs(cost::gemm(c, out, n, true)) + secs(cost::bias_grad(n, out));
        const double dgrad = secs(cost::gemm(n, c, out, false));
        const double reduce = sp ? pred(CollKind::ReduceScatter, n / t * c) : pred(CollKind::AllReduce, n * c);
        const double gather = sp ? pred(CollKind::AllGather, n / t * c) : 0.0;
        ASSERT_EQ(reduce > wgrad, in_part);  // the weight-gradient GEMM's time of it, or all of it
        if (!in_part) {
          ASSERT_LT(gather, dgrad);
        }
        hidden += std::min(reduce, wgrad) + std::min(gather, dgrad);
      }
      EXPECT_NEAR(off.time.tp_comm - on.time.tp_comm, 2 * 2 * hidden,
                  1e-9 * off.time.tp_comm);  // 2 micro-batches, 2 layers
      EXPECT_DOUBLE_EQ(on.time.compute, off.time.compute);
      EXPECT_NEAR(off.time.total - on.time.total, 2 * 2 * hidden, 1e-9 * off.time.total);
    }
  }
  // tessera's runtime blocks on every TP collective, and a Llama layer is
  // LlamaModel's under either runtime: asking for the overlap there is an error.
  EXPECT_THROW(CostModel(ModelConfig::preset("llama2-7b"), DeviceSpec::preset("a100-80gb"), tc), InvalidArgument);
  tc.runtime = StepRuntime::Tessera;
  EXPECT_THROW(CostModel(m, DeviceSpec::preset("a100-80gb"), tc), InvalidArgument);
}

// Megatron-LM's 16-bit optimizer copies the gradients to its fp32 main
// gradients (2 + 4 bytes an element), unscales them in place (4 + 4) and
// copies the stepped main parameters back (4 + 2): 20 bytes an element of
// the rank's optimizer shard beside Adam's, as three kernels. ZeRO-1 over
// dp 2 halves the shard, so the compute it saves grows by those 20 bytes
// for half the parameters at the A100's 1.80 TB/s, and by nothing with
// tessera's runtime or in fp32.
TEST(CostModel, MegatronMixedPrecisionOptimizerCopies) {
  const ModelConfig m = ModelConfig::preset("gpt2-124m");
  const GroupNets nets = emulated_group_nets(1, 1, 2);
  auto saved_by_zero1 = [&](StepRuntime rt, bool fp32) {
    TrainingConfig tc;
    tc.global_batch = 4;
    tc.seq = 128;
    tc.fp32 = fp32;
    tc.runtime = rt;
    PlanChoice c;
    c.dp = 2;
    c.micro_batch = 2;
    c.stage_layers = {12};
    const DeviceSpec dev = DeviceSpec::preset("a100-80gb");
    const double whole = CostModel(m, dev, tc).evaluate(c, nets).time.compute;
    c.zero1 = true;
    return whole - CostModel(m, dev, tc).evaluate(c, nets).time.compute;
  };
  const int64_t P = m.total_params(), half = (P + 1) / 2;                // 124,439,808 and the shard of ZeRO-1
  const double copies = 20.0 * static_cast<double>(P - half) / 1.80e12;  // the launches cancel
  EXPECT_NEAR(copies, 20.0 * 62219904 / 1.8e12, 1e-15);
  EXPECT_NEAR(saved_by_zero1(StepRuntime::MegatronLM, false) - saved_by_zero1(StepRuntime::Tessera, false), copies,
              1e-9);
  EXPECT_NEAR(saved_by_zero1(StepRuntime::MegatronLM, true), saved_by_zero1(StepRuntime::Tessera, true), 1e-12);
}

// Megatron-LM computes its cross entropy on an fp32 copy of the 16-bit
// logits unless --fp16-lm-cross-entropy: 52 bytes a logit in 8 kernels
// against 20 in 6 (kernel_cost_test). gpt2-124m at seq 128, micro-batch 2,
// 2 micro-batches on one A100: 256 x 50257 logits a micro-batch, each
// kernel streaming at 1.80 TB/s with a 4 us launch. Nothing else changes;
// the flag needs the Megatron-LM runtime in 16 bits and a GPT model.
TEST(CostModel, MegatronCrossEntropyOnAnFp32Copy) {
  const ModelConfig m = ModelConfig::preset("gpt2-124m");
  const DeviceSpec a100 = DeviceSpec::preset("a100-80gb");
  const GroupNets nets = emulated_group_nets(1, 1, 1);
  TrainingConfig tc;
  tc.global_batch = 4;
  tc.seq = 128;
  tc.runtime = StepRuntime::MegatronLM;
  PlanChoice c;
  c.micro_batch = 2;
  c.stage_layers = {12};
  const PlanCost fp32_copy = CostModel(m, a100, tc).evaluate(c, nets);
  tc.fp16_lm_cross_entropy = true;
  const PlanCost in_16_bits = CostModel(m, a100, tc).evaluate(c, nets);
  const double logits = 256.0 * 50257;
  EXPECT_NEAR(fp32_copy.time.compute - in_16_bits.time.compute, 2 * ((52 - 20) * logits / 1.80e12 + 2 * 4e-6), 1e-12);
  EXPECT_DOUBLE_EQ(fp32_copy.time.tp_comm, in_16_bits.time.tp_comm);
  EXPECT_DOUBLE_EQ(fp32_copy.time.dp_comm, in_16_bits.time.dp_comm);
  tc.fp32 = true;
  EXPECT_THROW(CostModel(m, a100, tc), InvalidArgument);
  tc.fp32 = false;
  EXPECT_THROW(CostModel(ModelConfig::preset("llama2-7b"), a100, tc), InvalidArgument);  // LlamaModel's head
  tc.runtime = StepRuntime::Tessera;
  EXPECT_THROW(CostModel(m, a100, tc), InvalidArgument);
}

// The Megatron-LM runtime costs GEMMs with the GEMM library its published
// runs used (DeviceSpec::megatron_sustained_fraction, 0.7386 on the A100);
// tessera's runtime keeps the device's sustained_fraction (what the emulated
// cores charge); --efficiency overrides both; devices without the figure
// keep theirs under either runtime.
TEST(CostModel, MegatronRuntimeUsesItsGemmLibrarysFigure) {
  const ModelConfig m = ModelConfig::preset("gpt2-124m");
  TrainingConfig tc;
  tc.global_batch = 8;
  tc.seq = 1024;
  const DeviceSpec a100 = DeviceSpec::preset("a100-80gb");
  EXPECT_DOUBLE_EQ(CostModel(m, a100, tc).device().sustained_fraction, 267.9 / 312);
  tc.runtime = StepRuntime::MegatronLM;
  EXPECT_DOUBLE_EQ(CostModel(m, a100, tc).device().sustained_fraction, 230.0 / 312 * (19.0 * 108) / 2048);
  EXPECT_DOUBLE_EQ(gemm_sustained_fraction(a100, tc), 230.0 / 312 * (19.0 * 108) / 2048);  // what `plan` prints
  EXPECT_DOUBLE_EQ(CostModel(m, DeviceSpec::preset("trn1-core"), tc).device().sustained_fraction, 0.5);
  tc.efficiency = 0.6;
  EXPECT_DOUBLE_EQ(CostModel(m, a100, tc).device().sustained_fraction, 0.6);
  // The same step with the current library's figure pinned runs its GEMMs
  // 267.9 / 230 = 1.165 times faster, so the whole compute is over 5% shorter.
  tc.efficiency = 0;
  const GroupNets nets = emulated_group_nets(1, 1, 1);
  PlanChoice c;
  c.micro_batch = 8;
  c.stage_layers = {12};
  const PlanCost legacy = CostModel(m, a100, tc).evaluate(c, nets);
  tc.efficiency = 267.9 / 312;
  const PlanCost modern = CostModel(m, a100, tc).evaluate(c, nets);
  EXPECT_GT(legacy.time.compute, modern.time.compute * 1.05);
}

// The pipeline as the executor runs it, with uniform stages and free links:
// stage 0 ends after (v m + p - 1) chunk slots, its waits are the bubble
// (p - 1) slots; every stage runs all its passes.
TEST(CostModel, SimulatedPipelineHasTheSchedulesBubble) {
  using pipeline::Schedule;
  const int p = 4, m = 8;
  for (Schedule s : {Schedule::k1F1B, Schedule::kGpipe, Schedule::kInterleaved}) {
    const int v = s == Schedule::kInterleaved ? 2 : 1;
    const double f = 1.0 / v, b = 2.0 / v;  // per chunk: a stage's F + B is 3 per micro-batch
    std::vector<std::vector<double>> fwd(p, std::vector<double>(v, f)), bwd(p, std::vector<double>(v, b));
    PipelineTimes t = simulate_pipeline(s, p, m, v, fwd, bwd, 0.0);
    SCOPED_TRACE(pipeline::schedule_name(s));
    EXPECT_NEAR(t.end[0], (v * m + p - 1) * (f + b), 1e-12);
    EXPECT_NEAR(t.wait[0], (p - 1) * (f + b), 1e-12);
    EXPECT_NEAR(t.wait[0] / t.end[0], pipeline::bubble_fraction(p, m, v), 1e-12);
    for (int st = 0; st < p; ++st) {
      EXPECT_NEAR(t.end[st] - t.wait[st], m * 3.0, 1e-12);
      EXPECT_DOUBLE_EQ(t.idle[st], t.wait[st]);  // free links: every wait is idle
      EXPECT_DOUBLE_EQ(t.link[st], 0.0);
    }
  }
  // A link transfer delays every hop of the fill and the drain. Stage 1
  // idles until stage 0's F0 is sent (at 1), then waits 0.5 for the
  // transfer; stage 0 idles from 1 until B0 is sent (at 1 + 0.5 + 1 + 2), then
  // 0.5 for its transfer.
  std::vector<std::vector<double>> fwd(2, {1.0}), bwd(2, {2.0});
  PipelineTimes t = simulate_pipeline(Schedule::k1F1B, 2, 1, 1, fwd, bwd, 0.5);
  EXPECT_NEAR(t.end[0], 1 + 0.5 + 1 + 2 + 0.5 + 2, 1e-12);
  EXPECT_NEAR(t.idle[1], 1.0, 1e-12);
  EXPECT_NEAR(t.link[1], 0.5, 1e-12);
  EXPECT_NEAR(t.idle[0], 0.5 + 1 + 2, 1e-12);
  EXPECT_NEAR(t.link[0], 0.5, 1e-12);
  for (int st = 0; st < 2; ++st) EXPECT_NEAR(t.idle[st] + t.link[st], t.wait[st], 1e-12);
}

// A serial Trainer on one emulated core charges exactly what the cost model
// sums: the same kernels (runtime/kernel_cost.h), two micro-batches, the
// optimizer step.
TEST(CostModel, SerialTrainerStepEqualsPrediction) {
  Device dev(DeviceSpec::preset("trn1-core"));
  auto ps = parallel::layers::serial_state(&dev);
  models::gpt::TrainOptions o;
  o.model.layers = 2;
  o.model.hidden = 64;
  o.model.heads = 4;
  o.model.max_seq = 32;
  o.seq = 32;
  o.micro_batch = 2;
  o.global_batch = 4;
  o.steps = 2;
  auto data = std::make_shared<const parallel::data::ByteDataset>(parallel::data::ByteDataset::default_files());
  models::gpt::Trainer trainer(o, ps, data);
  trainer.init_random();
  trainer.step();
  const double emulated = trainer.step().modeled_step_s;

  ModelConfig m = ModelConfig::from_json_text(
      R"({"name": "tiny", "layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "max_seq": 32})", "tiny");
  TrainingConfig tc;
  tc.global_batch = 4;
  tc.seq = 32;
  tc.fp32 = true;
  CostModel cm(m, DeviceSpec::preset("trn1-core"), tc);
  PlanChoice c;
  c.micro_batch = 2;
  c.stage_layers = {2};
  const double predicted = cm.evaluate(c, emulated_group_nets(1, 1, 1)).time.total;
  EXPECT_NEAR(predicted, emulated, 1e-9 * emulated);
}

TEST(CostModel, RejectsBadWorkload) {
  ModelConfig m = ModelConfig::preset("gpt2-124m");
  TrainingConfig tc;
  tc.global_batch = 8;
  tc.seq = 4096;  // over max_seq 1024
  EXPECT_THROW(CostModel(m, DeviceSpec::preset("trn1-core"), tc), InvalidArgument);
}

// Every group the planner costs is the communicator's own model, whatever
// its size: rank 0's DP group of 128 and TP group of 32 on the 4D torus
// carry their members' nodes (no closed-form stand-in), and what the planner
// charges for a collective is collectives::predict over group_cost_model of
// those nodes, which the communicator charges (CollCost.*ChargesItsCost*).
TEST(CostModel, LargeGroupsAreTheCommunicatorsModel) {
  const Topology t = Topology::preset("torus4d:16x16x16x16");
  const Mesh mesh({.tp = 32, .dp = 128, .pp = 16});
  const Placement pl(t, mesh);
  const GroupNets nets = placement_group_nets(t, pl);
  std::vector<int> dp_nodes, tp_nodes;
  for (int i = 0; i < 128; ++i) dp_nodes.push_back(pl.node(mesh.rank({.tp = 0, .dp = i, .pp = 0})));
  for (int i = 0; i < 32; ++i) tp_nodes.push_back(pl.node(mesh.rank({.tp = i, .dp = 0, .pp = 0})));
  EXPECT_EQ(nets.dp.nodes, dp_nodes);
  EXPECT_EQ(nets.tp.nodes, tp_nodes);
  using collectives::CollKind;
  for (const auto& [g, nodes] : {std::pair{&nets.dp, dp_nodes}, std::pair{&nets.tp, tp_nodes}}) {
    const collectives::GroupCostModel want =
        collectives::group_cost_model(t.net_model(), nodes, t.num_instances() <= 1);
    for (CollKind kind : {CollKind::AllReduce, CollKind::ReduceScatter, CollKind::AllGather})
      for (size_t count : {size_t{1000}, size_t{50000000}}) {
        const collectives::CollPrediction a = collectives::predict(kind, count, DType::F32, *g);
        const collectives::CollPrediction b = collectives::predict(kind, count, DType::F32, want);
        EXPECT_EQ(a.algorithm, b.algorithm) << collectives::coll_kind_name(kind) << " " << count;
        EXPECT_DOUBLE_EQ(a.seconds, b.seconds) << collectives::coll_kind_name(kind) << " " << count;
        EXPECT_GT(a.seconds, 0);
      }
  }
}

// A data-parallel group larger than the 4096 ranks the run-time algorithms
// keep member lists for is still costed (the ring's closed sum over its links):
// `tessera plan` of llama2-7b on trn2-cluster:64 at batch 8192 aborted with
// "no algorithm predicted for all_reduce over 8192 ranks".
TEST(CostModel, GroupsBeyond4096RanksAreCosted) {
  const Topology t = Topology::preset("torus4d:16x16x16x16");
  std::vector<int> nodes(8192);
  for (int i = 0; i < 8192; ++i) nodes[static_cast<size_t>(i)] = i * 8;
  const collectives::GroupCostModel g = collectives::group_cost_model(t.net_model(), nodes, true);
  for (collectives::CollKind kind :
       {collectives::CollKind::AllReduce, collectives::CollKind::ReduceScatter, collectives::CollKind::AllGather}) {
    const collectives::CollPrediction p = collectives::predict(kind, size_t{1} << 26, DType::F32, g);
    EXPECT_GT(p.seconds, 0) << collectives::coll_kind_name(kind) << " by " << p.algorithm;
    EXPECT_TRUE(std::isfinite(p.seconds));
  }
}

// On two instances the planner's groups have the host map their
// communicators would (shm+tcp): a DP group of 4 + 4 ranks is two-level
// (the hierarchical algorithms are candidates) and predicted as
// group_cost_model with that map; a TP group inside one instance is one
// host with shared memory.
TEST(CostModel, GroupsAcrossInstancesHaveTheirHostMap) {
  const Topology t = Topology::preset("trn1-cluster:2");
  ASSERT_EQ(t.num_instances(), 2);
  const int per_instance = t.num_cores() / 2;
  const Mesh mesh({.tp = 8, .dp = 8, .pp = 1});
  const Placement pl(t, mesh);
  const GroupNets nets = placement_group_nets(t, pl);
  std::vector<int> nodes, host_of;
  for (int i = 0; i < 8; ++i) {
    nodes.push_back(pl.node(mesh.rank({.tp = 0, .dp = i, .pp = 0})));
    host_of.push_back(nodes.back() / per_instance);
  }
  // 4 + 4 (the placement snakes: not in rank order); rank 0 on instance 0.
  EXPECT_EQ(std::count(host_of.begin(), host_of.end(), 0), 4);
  EXPECT_EQ(std::count(host_of.begin(), host_of.end(), 1), 4);
  EXPECT_EQ(host_of[0], 0);
  EXPECT_TRUE(nets.dp.hosts.valid);
  EXPECT_FALSE(nets.dp.shared_memory);
  EXPECT_TRUE(nets.dp.host_shared_memory);
  EXPECT_FALSE(nets.tp.hosts.valid);
  EXPECT_TRUE(nets.tp.shared_memory);
  const collectives::GroupCostModel want =
      collectives::group_cost_model(t.net_model(), nodes, false, &host_of, 0, /*host_shared_memory=*/true);
  using collectives::CollKind;
  for (CollKind kind : {CollKind::AllReduce, CollKind::ReduceScatter, CollKind::AllGather})
    for (size_t count : {size_t{1000}, size_t{50000000}}) {
      const collectives::CollPrediction a = collectives::predict(kind, count, DType::F32, nets.dp);
      const collectives::CollPrediction b = collectives::predict(kind, count, DType::F32, want);
      EXPECT_EQ(a.algorithm, b.algorithm) << collectives::coll_kind_name(kind) << " " << count;
      EXPECT_DOUBLE_EQ(a.seconds, b.seconds) << collectives::coll_kind_name(kind) << " " << count;
      EXPECT_EQ(a.algorithm.rfind("hier", 0), 0u) << a.algorithm;
    }
}

}  // namespace
}  // namespace tessera::parallel
