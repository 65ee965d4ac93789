#include "parallel/planner.h"

#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>
#include <typeinfo>

#include "parallel/plan_io.h"
#include "runtime/error.h"

namespace tessera::parallel {
namespace {

PlannerOptions opts(int64_t batch, int seq, int top = 100000) {
  PlannerOptions o;
  o.train.global_batch = batch;
  o.train.seq = seq;
  o.top_k = top;
  return o;
}

TEST(Planner, NoPlanExceedsMemoryAndRankedByTime) {
  struct Case {
    const char* model;
    const char* topo;
    int64_t batch;
    int seq;
  };
  for (const Case& c :
       {Case{"gpt3-13b", "trn1-cluster:4", 256, 2048}, Case{"llama2-70b", "trn2-ultraserver", 512, 4096},
        Case{"gpt3-6.7b", "dgx-a100:2", 64, 2048}, Case{"gpt2-1.5b", "trn1.32xlarge", 64, 1024}}) {
    ModelConfig m = ModelConfig::preset(c.model);
    Topology t = Topology::preset(c.topo);
    PlannerResult r = plan(m, t, opts(c.batch, c.seq));
    ASSERT_FALSE(r.top.empty()) << c.model;
    EXPECT_EQ(static_cast<long>(r.top.size()), r.evaluated - r.over_memory) << c.model;
    EXPECT_GT(r.over_memory, 0) << c.model;  // the search met the memory wall
    for (size_t i = 0; i < r.top.size(); ++i) {
      const auto& p = r.top[i];
      EXPECT_LE(p.cost.memory.total, r.capacity_bytes) << c.model;
      EXPECT_EQ(p.choice.tp * p.choice.pp * p.choice.dp, t.num_cores());
      EXPECT_EQ(m.heads % p.choice.tp, 0);
      int layers = 0;
      for (int l : p.choice.stage_layers) layers += l;
      EXPECT_EQ(layers, m.layers);
      EXPECT_EQ(c.batch % (static_cast<int64_t>(p.choice.dp) * p.choice.micro_batch), 0);
      if (i) {
        EXPECT_LE(r.top[i - 1].cost.time.total, p.cost.time.total);
      }
    }
  }
}

TEST(Planner, SearchesEveryOption) {
  PlannerResult r = plan(ModelConfig::preset("gpt3-1.3b"), Topology::preset("trn1.32xlarge"), opts(64, 2048));
  bool v = false, z = false, sp = false, sel = false, full = false, none = false, bal = false;
  for (const auto& p : r.top) {
    v |= p.choice.virtual_stages > 1;
    z |= p.choice.zero1;
    sp |= p.choice.sequence_parallel;
    sel |= p.choice.recompute == Recompute::Selective;
    full |= p.choice.recompute == Recompute::Full;
    none |= p.choice.recompute == Recompute::None;
    bal |= p.choice.balanced;
  }
  EXPECT_TRUE(v && z && sp && sel && full && none && bal);
}

TEST(Planner, PinsRespected) {
  ModelConfig m = ModelConfig::preset("gpt3-13b");
  Topology t = Topology::preset("trn1-cluster:4");
  PlannerOptions o = opts(256, 2048);
  o.pins.tp = 8;
  o.pins.micro_batch = 1;
  o.pins.recompute = Recompute::Full;
  o.pins.sequence_parallel = false;
  o.pins.zero1 = true;
  PlannerResult r = plan(m, t, o);
  ASSERT_FALSE(r.top.empty());
  for (const auto& p : r.top) {
    EXPECT_EQ(p.choice.tp, 8);
    EXPECT_EQ(p.choice.micro_batch, 1);
    EXPECT_EQ(p.choice.recompute, Recompute::Full);
    EXPECT_FALSE(p.choice.sequence_parallel);
    EXPECT_TRUE(p.choice.zero1);
  }
  PlannerOptions o2 = opts(256, 2048);
  o2.pins.pp = 4;
  o2.pins.virtual_stages = 2;
  o2.pins.dp = 8;
  const PlannerResult r2 = plan(m, t, o2);
  ASSERT_FALSE(r2.top.empty()) << "no plan for pp 4, v 2, dp 8: the checks below would pass vacuously";
  for (const auto& p : r2.top) {
    EXPECT_EQ(p.choice.pp, 4);
    EXPECT_EQ(p.choice.dp, 8);
    EXPECT_EQ(p.choice.tp, 4);
    EXPECT_EQ(p.choice.virtual_stages, 2);
  }
}

TEST(Planner, BadPinsAreClearErrors) {
  ModelConfig m = ModelConfig::preset("gpt2-124m");  // 12 heads
  Topology t = Topology::preset("trn1.32xlarge");    // 32 cores
  auto expect_msg = [&](PlannerOptions o, const std::string& needle) {
    try {
      plan(m, t, o);
      ADD_FAILURE() << "no error, expected " << needle;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  PlannerOptions o = opts(32, 1024);
  o.pins.tp = 8;  // 8 does not divide 12 heads
  expect_msg(o, "does not divide the 12 attention heads");
  o = opts(32, 1024);
  o.pins.tp = 4;
  o.pins.pp = 2;
  o.pins.dp = 2;
  expect_msg(o, "is not the 32 cores");
  o = opts(32, 1024);
  o.pins.dp = 3;
  expect_msg(o, "does not divide the 32 cores");
  o = opts(32, 1024);
  o.pins.pp = 13;
  expect_msg(o, "must be in 1..12");
  o = opts(33,
           1024);  // no dp in 1..32 that is a power of two divides 33 except 1, with tp*pp = 32 impossible for tp|12
  o.pins.tp = 2;
  o.pins.pp = 2;
  expect_msg(o, "global batch");
}

TEST(Planner, NothingFitsIsAnError) {
  // 175B on one trn1 instance cannot fit: an Error (not a bad argument) saying why.
  try {
    plan(ModelConfig::preset("gpt3-175b"), Topology::preset("trn1.32xlarge"), opts(32, 2048));
    FAIL() << "a plan was found";
  } catch (const InvalidArgument& e) {
    FAIL() << "reported as a bad argument: " << e.what();
  } catch (const Error& e) {
    EXPECT_EQ(typeid(e), typeid(Error)) << e.what();
    const std::string w = e.what();
    EXPECT_NE(w.find("no plan fits in "), std::string::npos) << w;
    EXPECT_NE(w.find("GiB usable per core"), std::string::npos) << w;
    EXPECT_NE(w.find("the smallest needs "), std::string::npos) << w;
  }
}

// On a small case, every choice the planner's rules allow (enumerated here
// from the rules in planner.h) is costed with the cost model: the planner
// evaluated exactly that many, and its best plan is the fastest of those that
// fit, with the ranking in order.
TEST(Planner, BestPlanIsTheFastestThatFitsByBruteForce) {
  const ModelConfig m = ModelConfig::from_json_text(
      R"({"name": "tiny", "layers": 4, "hidden": 256, "heads": 8, "vocab": 1000, "max_seq": 512})", "tiny");
  const Topology t = Topology::from_json_text(R"({"name": "ring8",
      "device": {"name": "small-core", "hbm_gib": 0.05, "peak_tflops_bf16": 10},
      "dims": [{"name": "x", "size": 8, "kind": "ring", "level": "chip", "bandwidth_gb_s": 50, "latency_us": 2}]})",
                                              "ring8");
  const PlannerOptions o = opts(16, 512);
  const PlannerResult r = plan(m, t, o);
  ASSERT_FALSE(r.top.empty());
  const CostModel cm(m, t.device(), o.train);
  const int n = t.num_cores();
  const int64_t B = o.train.global_batch;
  long count = 0, fit = 0;
  std::optional<RankedPlan> best;
  for (int tp = 1; tp <= n; ++tp) {
    if (n % tp || m.heads % tp || m.kv_heads % tp || m.ffn_hidden % tp) continue;
    for (int pp = 1; pp <= std::min(n / tp, m.layers); ++pp) {
      if ((n / tp) % pp) continue;
      const int dp = n / (tp * pp);
      if (B % dp) continue;
      Placement pl(t, Mesh({.tp = tp, .dp = dp, .pp = pp}, o.order));
      const GroupNets nets = placement_group_nets(t, pl);
      for (int mbs = 1; mbs <= B / dp; ++mbs) {
        if ((B / dp) % mbs) continue;
        const int micro = static_cast<int>(B / dp / mbs);
        for (int v = 1; v <= m.layers; ++v) {
          if (v > 1 && (pp == 1 || m.layers % (pp * v) || micro % pp)) continue;
          for (bool balanced : {false, true}) {
            if (balanced && (pp == 1 || v > 1)) continue;
            const std::vector<int> stages = partition_layers(m.layers, pp, balanced, cm.head_layers());
            if (balanced && stages == partition_layers(m.layers, pp, false, cm.head_layers())) continue;
            for (bool zero1 : {false, true}) {
              if (zero1 && dp == 1) continue;
              for (bool sp : {false, true}) {
                if (sp && tp == 1) continue;
                using pipeline::Schedule;
                std::vector<Schedule> scheds = {Schedule::k1F1B};
                if (pp > 1 && v == 1) scheds.push_back(Schedule::kGpipe);
                if (v > 1) scheds = {Schedule::kInterleaved};
                for (Schedule sc : scheds)
                  for (Recompute rc : {Recompute::None, Recompute::Selective, Recompute::Full}) {
                    RankedPlan rp{PlanChoice{tp, pp, dp, mbs, v, sc, zero1, sp, rc, stages, balanced}, {}};
                    rp.cost = cm.evaluate(rp.choice, nets);
                    ++count;
                    if (rp.cost.memory.total > r.capacity_bytes) continue;
                    ++fit;
                    if (!best || rp.cost.time.total < best->cost.time.total ||
                        (rp.cost.time.total == best->cost.time.total && rp.cost.memory.total < best->cost.memory.total))
                      best = rp;
                  }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(r.evaluated, count);
  EXPECT_EQ(r.evaluated - r.over_memory, fit);
  EXPECT_GT(r.over_memory, 0) << "the case should meet the memory wall";
  ASSERT_TRUE(best);
  EXPECT_EQ(r.top[0].cost.time.total, best->cost.time.total);
  EXPECT_EQ(r.top[0].cost.memory.total, best->cost.memory.total);
  EXPECT_EQ(r.top[0].choice.tp * r.top[0].choice.pp * r.top[0].choice.dp, n);
  for (size_t i = 1; i < r.top.size(); ++i) EXPECT_LE(r.top[i - 1].cost.time.total, r.top[i].cost.time.total);
}

TEST(Planner, LargeTorus) {
  PlannerResult r =
      plan(ModelConfig::preset("gpt3-175b"), Topology::preset("torus4d:16x16x16x16"), opts(1536, 2048, 5));
  ASSERT_EQ(r.top.size(), 5u);
  EXPECT_GT(r.evaluated, 1000);
  EXPECT_FALSE(r.why.empty());
}

TEST(PlanIo, RoundTripAndRejects) {
  ModelConfig m = ModelConfig::preset("gpt2-355m");
  Topology t = Topology::preset("trn1.32xlarge");
  PlannerOptions o = opts(32, 1024, 1);
  PlannerResult r = plan(m, t, o);
  tessera::plan::Plan p = make_plan_proto(m, t, o, r.top[0]);
  EXPECT_EQ(p.tp() * p.pp() * p.dp(), 32);
  EXPECT_EQ(p.placement_size(), 32);
  EXPECT_EQ(p.stages_size(), p.pp());
  std::string json = plan_to_json(p);
  for (const char* field : {"\"tp\"", "\"micro_batch\"", "\"num_micro_batches\"", "\"virtual_stages\"", "\"zero1\"",
                            "\"sequence_parallel\"", "\"recompute\"", "\"schedule\"", "\"memory_bytes_per_rank\"",
                            "\"activations\"", "\"step_time_s\"", "\"bubble\"", "\"dp_comm\"", "\"flops_per_step\"",
                            "\"achieved_flops_per_device\"", "\"stages\"", "\"placement\""})
    EXPECT_NE(json.find(field), std::string::npos) << field;
  tessera::plan::Plan back = plan_from_json(json, "p.json");
  EXPECT_EQ(back.SerializeAsString(), p.SerializeAsString());
  // The model reads back as written; a plan without sizes has none.
  const auto model = plan_model(back);
  ASSERT_TRUE(model.has_value());
  EXPECT_EQ(model->name, m.name);
  EXPECT_EQ(model->family, m.family);
  EXPECT_EQ(std::tie(model->layers, model->hidden, model->heads, model->kv_heads, model->ffn_hidden, model->vocab,
                     model->max_seq),
            std::tie(m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.vocab, m.max_seq));
  tessera::plan::Plan bare = p;
  bare.clear_model_shape();
  EXPECT_FALSE(plan_model(bare).has_value());

  auto expect_bad = [](const std::string& text, const std::string& needle) {
    try {
      plan_from_json(text, "p.json");
      ADD_FAILURE() << text;
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find("p.json"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  std::string extra = json;
  extra.insert(1, "\"colour\": 1,");
  expect_bad(extra, "colour");
  expect_bad("{\"tp\": ", "p.json");
  expect_bad(R"({"tp": 2, "pp": 2, "dp": 1, "stages": [3], "micro_batch": 1, "virtual_stages": 1,
                 "recompute": "none", "schedule": "1f1b"})",
             "'stages' has 1 entries");
  expect_bad(R"({"tp": 1, "pp": 1, "dp": 1, "stages": [3], "micro_batch": 1, "virtual_stages": 1,
                 "recompute": "most", "schedule": "none"})",
             "recompute");
}

}  // namespace
}  // namespace tessera::parallel

namespace tessera::parallel {
namespace {

// jq and Python read the plan's 64-bit integers as numbers; files in
// protobuf's own JSON form (int64 as strings) still read.
// A pipeline plan lists each stage's predicted bubble (as trace_bubbles reads
// a trace) and the schedule's formula; plans without them (older files) read.
TEST(PlanIo, StageBubbles) {
  ModelConfig m = ModelConfig::preset("gpt2-124m");
  Topology t = Topology::preset("trn1.32xlarge");
  PlannerOptions o = opts(32, 1024, 1);
  o.pins.pp = 4;
  o.pins.virtual_stages = 1;
  o.pins.schedule = pipeline::Schedule::k1F1B;
  PlannerResult r = plan(m, t, o);
  const PlanCost& k = r.top[0].cost;
  ASSERT_EQ(k.stage_bubbles.size(), 4u);
  for (const StageBubble& b : k.stage_bubbles) {
    EXPECT_GT(b.busy, 0);
    EXPECT_GT(b.bubble, 0);  // the fill and the drain
    EXPECT_DOUBLE_EQ(b.fraction(), b.bubble / (b.busy + b.bubble + b.p2p));
  }
  tessera::plan::Plan p = make_plan_proto(m, t, o, r.top[0]);
  ASSERT_EQ(p.stage_bubble_fraction_size(), 4);
  for (int s = 0; s < 4; ++s)
    EXPECT_DOUBLE_EQ(p.stage_bubble_fraction(s), k.stage_bubbles[static_cast<size_t>(s)].fraction());
  EXPECT_DOUBLE_EQ(p.schedule_bubble_fraction(), 3.0 / (k.num_micro_batches + 3.0));
  const std::string json = plan_to_json(p);
  EXPECT_NE(json.find("\"stage_bubble_fraction\""), std::string::npos);
  EXPECT_EQ(plan_from_json(json, "p.json").SerializeAsString(), p.SerializeAsString());

  // An older plan, without the fields.
  nlohmann::json old = nlohmann::json::parse(json);
  old.erase("stage_bubble_fraction");
  old.erase("schedule_bubble_fraction");
  EXPECT_EQ(plan_from_json(old.dump(), "old.json").stage_bubble_fraction_size(), 0);
  // One value per stage, each a fraction.
  for (const char* bad : {"[0.1, 0.2]", "[0.1, 0.2, 0.3, 1.5]"}) {
    nlohmann::json j = nlohmann::json::parse(json);
    j["stage_bubble_fraction"] = nlohmann::json::parse(bad);
    EXPECT_THROW(plan_from_json(j.dump(), "p.json"), FormatError) << bad;
  }
}

TEST(PlanIo, Int64FieldsAreJsonNumbersAndStringFormStillReads) {
  ModelConfig m = ModelConfig::preset("gpt2-124m");
  Topology t = Topology::preset("trn1.32xlarge");
  PlannerOptions o;
  o.train.global_batch = 32;
  o.train.seq = 1024;
  o.top_k = 1;
  tessera::plan::Plan p = make_plan_proto(m, t, o, plan(m, t, o).top[0]);
  ASSERT_GT(p.memory_bytes_per_rank().total(), 0u);
  const std::string text = plan_to_json(p);
  const nlohmann::json j = nlohmann::json::parse(text);
  ASSERT_TRUE(j.at("global_batch").is_number_integer()) << j.at("global_batch");
  EXPECT_EQ(j.at("global_batch").get<int64_t>(), 32);
  for (const char* k : {"params", "grads", "optimizer", "activations", "total"})
    EXPECT_TRUE(j.at("memory_bytes_per_rank").at(k).is_number_unsigned()) << k;
  EXPECT_EQ(j.at("memory_bytes_per_rank").at("total").get<uint64_t>(), p.memory_bytes_per_rank().total());
  ASSERT_TRUE(j.at("memory_capacity_bytes").is_number_unsigned());
  EXPECT_EQ(j.at("memory_capacity_bytes").get<uint64_t>(), p.memory_capacity_bytes());
  EXPECT_TRUE(j.at("model").is_string());
  EXPECT_TRUE(j.at("flops_per_step").is_number());
  // Every key once: the placement is not also printed empty.
  size_t at = 0, placements = 0;
  while ((at = text.find("\"placement\"", at)) != std::string::npos) ++placements, ++at;
  EXPECT_EQ(placements, 1u);
  EXPECT_EQ(j.at("placement").size(), 32u);
  EXPECT_EQ(plan_from_json(text, "p.json").SerializeAsString(), p.SerializeAsString());

  // protobuf's mapping as the earlier writer printed it: int64 as strings.
  std::string string_form;
  google::protobuf::util::JsonPrintOptions po;
  po.preserve_proto_field_names = true;
  po.always_print_primitive_fields = true;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(p, &string_form, po).ok());
  ASSERT_NE(string_form.find("\"global_batch\":\"32\""), std::string::npos) << string_form.substr(0, 200);
  EXPECT_EQ(plan_from_json(string_form, "old.json").SerializeAsString(), p.SerializeAsString());
}

TEST(PlanIo, FileRoundTrip) {
  ModelConfig m = ModelConfig::preset("gpt2-124m");
  Topology t = Topology::preset("trn1.32xlarge");
  PlannerOptions o;
  o.train.global_batch = 32;
  o.train.seq = 1024;
  o.top_k = 1;
  tessera::plan::Plan p = make_plan_proto(m, t, o, plan(m, t, o).top[0]);
  std::string path = ::testing::TempDir() + "/tessera_plan_test.json";
  write_plan_json(path, p);
  tessera::plan::Plan back = read_plan_json(path);
  EXPECT_EQ(back.SerializeAsString(), p.SerializeAsString());
  EXPECT_THROW(read_plan_json(path + ".missing"), InvalidArgument);
  Mesh mesh = plan_mesh(back);
  EXPECT_EQ(mesh.world_size(), 32);
  EXPECT_EQ(mesh.tp(), back.tp());
  EXPECT_EQ(mesh.tp_group(0).size(), static_cast<size_t>(back.tp()));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace tessera::parallel
