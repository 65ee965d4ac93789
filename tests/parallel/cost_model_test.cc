#include "parallel/cost_model.h"

#include <gtest/gtest.h>

#include "parallel/mesh.h"
#include "runtime/error.h"

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

// One core, no parallelism: memory and time against hand-computed totals.
// gpt2-124m, b=1, s=1024, bf16: params 124439808 * 2 = 248879616 bytes (grads
// the same, optimizer * 6); activations 12 sbh (34 + 5as/h) + 4 s V (fp32
// logits) = 1281691648; step of B=8: 8 * 72 s l h^2 (1 + s/6h + V/12lh) at
// 95e12 * 0.5 FLOP/s = 0.147359 s.
TEST(CostModel, SingleCoreByHand) {
  ModelConfig m = ModelConfig::preset("gpt2-124m");
  TrainingConfig tc;
  tc.global_batch = 8;
  tc.seq = 1024;
  tc.efficiency = 0.5;
  CostModel cm(m, DeviceSpec::preset("trn1-core"), tc);
  PlanChoice c;
  c.stage_layers = {12};
  PlanCost k = cm.evaluate(c, GroupNets{});
  EXPECT_DOUBLE_EQ(k.memory.params, 248879616.0);
  EXPECT_DOUBLE_EQ(k.memory.grads, 248879616.0);
  EXPECT_DOUBLE_EQ(k.memory.optimizer, 6 * 248879616.0);
  EXPECT_DOUBLE_EQ(k.memory.activations, 1281691648.0);
  EXPECT_DOUBLE_EQ(k.memory.total, 3272728576.0);
  EXPECT_EQ(k.num_micro_batches, 8);
  EXPECT_NEAR(k.time.total, 0.14735914469052633, 1e-12);
  EXPECT_DOUBLE_EQ(k.time.tp_comm + k.time.pp_comm + k.time.bubble + k.time.dp_comm, 0.0);
  EXPECT_NEAR(k.mfu, 0.5, 1e-12);
}

// Communication is costed with NetModel's closed forms on the group networks.
TEST(CostModel, CommUsesNetModel) {
  ModelConfig m = ModelConfig::preset("gpt2-355m");
  TrainingConfig tc;
  tc.global_batch = 64;
  tc.seq = 1024;
  Topology t = Topology::preset("trn1.32xlarge");
  CostModel cm(m, t.device(), tc);
  // dp=32 on the whole torus: one all-reduce of every gradient (bf16).
  Placement all(t, Mesh({.tp = 1, .dp = 32, .pp = 1}));
  GroupNets nets{all.group_model(MeshAxis::TP), all.group_model(MeshAxis::PP), all.group_model(MeshAxis::DP)};
  PlanChoice c;
  c.dp = 32;
  c.stage_layers = {24};
  PlanCost k = cm.evaluate(c, nets);
  EXPECT_DOUBLE_EQ(k.time.dp_comm, t.net_model().torus_allreduce_time(2.0 * static_cast<double>(m.total_params())));
  // ZeRO-1: reduce-scatter of gradients plus all-gather of weights, same bytes.
  c.zero1 = true;
  PlanCost z = cm.evaluate(c, nets);
  double n = 2.0 * static_cast<double>(m.total_params());
  EXPECT_DOUBLE_EQ(z.time.dp_comm, t.net_model().torus_reduce_scatter_time(n) + t.net_model().torus_allgather_time(n));
  EXPECT_LT(z.memory.optimizer, k.memory.optimizer / 31);

  // tp=8, pp=4: per micro-batch 4 all-reduces of b s h bf16 per layer on the TP ring.
  Placement p(t, Mesh({.tp = 8, .dp = 1, .pp = 4}));
  GroupNets n2{p.group_model(MeshAxis::TP), p.group_model(MeshAxis::PP), p.group_model(MeshAxis::DP)};
  PlanChoice c2;
  c2.tp = 8;
  c2.pp = 4;
  c2.stage_layers = {6, 6, 6, 6};
  PlanCost k2 = cm.evaluate(c2, n2);
  double ar = n2.tp.torus_allreduce_time(2.0 * 1024 * 1024);
  int stage = k2.time_stage;
  int extra = (stage == 0 || stage == 3) ? 1 : 0;  // embedding / LM head all-reduce
  EXPECT_NEAR(k2.time.tp_comm, 64 * (6 * 4 + extra) * ar, 1e-12);
  // Bubble (p-1)/m of the pipelined time.
  double per_mb = (k2.time.compute + k2.time.tp_comm + k2.time.pp_comm) / 64;
  EXPECT_NEAR(k2.time.bubble, 3 * per_mb, 1e-12);
}

TEST(CostModel, RejectsBadWorkload) {
  ModelConfig m = ModelConfig::preset("gpt2-124m");
  TrainingConfig tc;
  tc.global_batch = 8;
  tc.seq = 4096;  // over max_seq 1024
  EXPECT_THROW(CostModel(m, DeviceSpec::preset("trn1-core"), tc), InvalidArgument);
}

}  // namespace
}  // namespace tessera::parallel
