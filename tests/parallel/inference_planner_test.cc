// The inference planner (parallel/inference_planner.h) against figures
// computed by hand for a tiny GPT on two test-core cores, and its refusals.
// That its TTFT and time per output token equal the emulated cores' clock is
// tests/inference/generation_test.cc's and generate_cli_test.cc's.
#include "parallel/inference_planner.h"

#include <gtest/gtest.h>

#include "runtime/error.h"

namespace tessera::parallel {
namespace {

ModelConfig tiny() {
  return ModelConfig::from_json_text(
      R"({"name": "tiny", "layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "max_seq": 64, "ffn_hidden": 256})",
      "tiny");
}

Topology two_test_cores() {
  TopologyOptions o;
  o.device = "test-core";  // 256 MiB, 0.5 TFLOP/s fp32, 100 GB/s, all of it sustained
  return Topology::preset("emulated:2", o);
}

// The time per output token is the mean of the decode steps, each costed
// from the batch's totals in closed form (a loop over the batch made
// --batch 10^7 take 90 s): equal to costing every step's sequences one by one.
TEST(InferencePlanner, DecodeStepsFromTotalsEqualTheSequencesOneByOne) {
  const ModelConfig m = tiny();
  const Topology topo = two_test_cores();
  InferenceConfig c;
  c.prompts = {5, 9, 2};
  c.generate = 6;
  c.dtype = DType::F32;
  c.tp = 2;
  const InferencePlan p = plan_inference(m, topo, c).at(0);
  const collectives::GroupCostModel g = inference_tp_group(m, topo, 2);
  double sum = 0;
  for (int k = 1; k <= c.generate - 1; ++k) {
    std::vector<std::pair<int64_t, int64_t>> seqs;
    for (int prompt : c.prompts) seqs.emplace_back(prompt + k - 1, 1);
    sum += cached_forward_cost(m, topo.device(), c.dtype, g, 2, seqs).total_s();
  }
  EXPECT_NEAR(p.tpot_s, sum / (c.generate - 1), 1e-12 * sum);
}

TEST(InferencePlanner, TinyGptOnTwoCoresByHand) {
  InferenceConfig c;
  c.batch = 2;
  c.prompt = 8;
  c.generate = 4;
  c.dtype = DType::F32;
  c.tp = 2;
  const std::vector<InferencePlan> plans = plan_inference(tiny(), two_test_cores(), c);
  ASSERT_EQ(plans.size(), 1u);
  const InferencePlan& p = plans[0];
  EXPECT_EQ(p.replicas, 1);
  // Per layer: QKV 64x192 + 192, output 64x64 + 64, MLP 2 x 64x256 + 256 + 64, 2 LayerNorms 4 x 64.
  // TP 2 splits the matrices and column biases (49,600) and keeps 384: 24,800 + 384 = 25,184.
  // Vocab-parallel tokens 256 x 64 / 2 = 8,192, positions 64 x 64 = 4,096, final LayerNorm 128 (tied head).
  // 2 x 25,184 + 8,192 + 4,096 + 128 = 62,784 parameters, 251,136 bytes.
  EXPECT_DOUBLE_EQ(p.weight_bytes, 251136);
  // KV: 2 layers x (K, V) x 2 local heads x 16 x 4 bytes = 512 per token; 2 x 12 tokens.
  EXPECT_DOUBLE_EQ(p.kv_bytes_per_token, 512);
  EXPECT_DOUBLE_EQ(p.kv_bytes, 512 * 2 * 12);
  EXPECT_TRUE(p.fits);
  // (0.9 x 256 MiB - 251,136) / 512 = 471,368.7.
  EXPECT_EQ(p.max_cached_tokens, 471368);
  // Prefill: matrices a token multiplies per rank 2 x 49,152 / 2 + LM head 8,192 = 57,344;
  // 2 x 57,344 x 16 tokens + attention 2 layers x 2 seqs x 2 x 8^2 x 32 = 1,835,008 + 16,384 FLOPs
  // at 0.5 TFLOP/s (above the weights' 251,136 B at 100 GB/s = 2.51 us).
  EXPECT_NEAR(p.prefill_compute_s, 1851392 / 0.5e12, 1e-18);
  EXPECT_NEAR(p.prefill_memory_s, 251136 / 100e9, 1e-18);
  // The TP collectives the emulated cores charge (shared memory, one host, 2 us and 48 GiB/s per step):
  // the embedding's all-reduce and two per layer of 2 x 8 x 64 floats (4 KiB: "direct", a reduce-scatter
  // and an all-gather step of 2 KiB each), then the logits' all-gather of 2 rows x 128 vocabulary
  // columns per rank (1 KiB, "oneshot": one step). Decode's all-reduces of 2 x 64 floats are one step too.
  const double bw = 51539607552.0;
  const double ar_prompt = 2 * (2e-6 + 2048 / bw), ar_token = 2e-6 + 512 / bw, gather = 2e-6 + 1024 / bw;
  EXPECT_NEAR(p.prefill_comm_s, 5 * ar_prompt + gather, 1e-15);
  // TTFT and TPOT are the kernels' sums (each at least its roofline) plus those collectives.
  EXPECT_GE(p.ttft_s, 1851392 / 0.5e12 + p.prefill_comm_s);
  EXPECT_LE(p.ttft_s, 2 * (1851392 / 0.5e12) + p.prefill_comm_s);
  // Decode at the mean context 8 + 1.5: weights + 512 x 2 x 9.5 KV bytes at 100 GB/s (memory-bound:
  // 2 x 57,344 x 2 + 2 x 2 x 4 x 9.5 x 32 = 234,240 FLOPs take 0.47 us), plus the same 5 all-reduces of 128 floats
  // and the all-gather.
  EXPECT_NEAR(p.decode_compute_s, 234240 / 0.5e12, 1e-18);
  EXPECT_NEAR(p.decode_memory_s, (251136 + 9728) / 100e9, 1e-18);
  EXPECT_NEAR(p.allreduce_token_s, ar_token, 1e-15);
  EXPECT_NEAR(p.decode_comm_s, 5 * ar_token + gather, 1e-15);
  EXPECT_GE(p.tpot_s, (251136 + 9728) / 100e9 + p.decode_comm_s);
  EXPECT_LE(p.tpot_s, 1.5 * (251136 + 9728) / 100e9 + p.decode_comm_s);
  EXPECT_NEAR(p.tokens_per_s, 2 / p.tpot_s, 1e-6);
}

TEST(InferencePlanner, EveryTpThatSplitsTheHeadsBestFirst) {
  InferenceConfig c;
  c.batch = 1;
  c.prompt = 8;
  c.generate = 8;
  const std::vector<InferencePlan> plans = plan_inference(tiny(), two_test_cores(), c);
  ASSERT_EQ(plans.size(), 2u);
  EXPECT_LE(plans[0].tpot_s, plans[1].tpot_s);
  for (const InferencePlan& p : plans) EXPECT_EQ(p.tp * p.replicas, 2);
}

TEST(InferencePlanner, GqaReplicatesKvHeadsPastTp) {
  // 4 heads sharing 1 K/V head at tp 2: each rank holds the whole K/V head (cache included).
  ModelConfig m = ModelConfig::from_json_text(
      R"({"name": "gqa", "family": "llama", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 1, "ffn_hidden": 96,
          "vocab": 256, "max_seq": 64})",
      "gqa");
  InferenceConfig c;
  c.prompt = 8;
  c.generate = 8;
  c.dtype = DType::BF16;
  c.tp = 2;
  const InferencePlan p = plan_inference(m, two_test_cores(), c).at(0);
  EXPECT_DOUBLE_EQ(p.kv_bytes_per_token, 2.0 * 2 * 1 * 16 * 2);  // layers x (K, V) x 1 head x 16 x bf16
  // Per layer: q 64x64 and o 64x64 split (4,096 per rank), k and v 64x16 each replicated (2,048),
  // gate/up/down 3 x 64x96 split (9,216), 2 RMSNorms 128: 15,488; embedding and untied head
  // 256 x 64 / 2 each, final norm 64: 2 x 15,488 + 16,384 + 64 = 47,424 parameters, 2 bytes each.
  EXPECT_DOUBLE_EQ(p.weight_bytes, 47424.0 * 2);
}

TEST(InferencePlanner, RefusesWhatCannotRun) {
  InferenceConfig c;
  c.prompt = 60;
  c.generate = 8;  // 68 > 64
  EXPECT_THROW(plan_inference(tiny(), two_test_cores(), c), InvalidArgument);
  c.prompt = 8;
  c.tp = 3;
  EXPECT_THROW(plan_inference(tiny(), two_test_cores(), c), InvalidArgument);
  // Too large for 256 MiB per core: nothing fits, and the plan says so.
  ModelConfig big = ModelConfig::from_json_text(
      R"({"name": "big", "layers": 4, "hidden": 4096, "heads": 32, "vocab": 32000, "max_seq": 64})", "big");
  c.tp = 0;
  for (const InferencePlan& p : plan_inference(big, two_test_cores(), c)) EXPECT_FALSE(p.fits) << p.tp;
}

}  // namespace
}  // namespace tessera::parallel
