#include "examples/gpt/plan_flags.h"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "parallel/cost_model.h"
#include "parallel/model_config.h"
#include "parallel/models/causal_lm.h"
#include "parallel/pipeline/partition.h"
#include "parallel/plan_io.h"
#include "runtime/device.h"
#include "runtime/error.h"

namespace tessera::gpt {

namespace {

// The train_gpt --schedule text for a plan's schedule field.
std::string schedule_flag(const std::string& plan_schedule) {
  if (plan_schedule == "interleaved-1f1b") return "interleaved";
  return plan_schedule;  // gpipe, 1f1b (none: pp = 1, no schedule)
}

// A value in a message: booleans as on/off.
template <typename T>
auto shown(const T& v) {
  if constexpr (std::is_same_v<T, bool>)
    return std::string(v ? "on" : "off");
  else
    return v;
}

}  // namespace

PlanRun apply_plan(const std::string& path, parallel::models::gpt::TrainOptions& t, std::string& schedule,
                   std::string& device, bool model_fixed, const std::function<bool(const char*)>& given) {
  const tessera::plan::Plan p = parallel::read_plan_json(path);
  const std::string where = "--plan " + path;
  auto refuse = [&](const auto&... what) { throw InvalidArgument(detail::concat(where, ": ", what...)); };
  // A value the plan sets: a flag the user gave must agree; else the plan's is taken.
  auto take = [&](const char* flag, const char* what, auto& field, auto plan_value) {
    if (given(flag)) {
      if (field != plan_value)
        refuse("the plan has ", what, " ", shown(plan_value), " but ", flag, " ", shown(field), " was given");
    } else {
      field = static_cast<std::remove_reference_t<decltype(field)>>(plan_value);
    }
  };

  // What train_gpt can run.
  // The precision: bf16 plans cost bf16 mixed precision with fp32 master
  // weights and bf16 gradient reduction (parallel/cost_model.h).
  if (p.precision() != "fp32" && p.precision() != "bf16")
    refuse("the plan is for precision ", p.precision(), "; train_gpt trains in fp32 or bf16");
  std::string precision = t.precision == DType::BF16 ? "bf16" : "fp32";
  take("--precision", "precision", precision, p.precision());
  t.precision = precision == "bf16" ? DType::BF16 : DType::F32;
  if (t.precision == DType::BF16 && (!t.master_weights || t.fp32_grads))
    refuse("the plan costs bf16 with fp32 master weights and gradients reduced in bf16, not ",
           !t.master_weights ? "--no-master-weights" : "--accumulate-allreduce-grads-in-fp32");
  if (p.recompute() != "none")
    refuse("the plan recomputes activations (recompute ", p.recompute(),
           "); train_gpt does not (plan with --recompute none)");
  if (!p.rank_order().empty() && p.rank_order() != "tp-dp-pp")
    refuse("the plan orders ranks ", p.rank_order(),
           "; train_gpt places them tp-dp-pp (TP fastest, then DP, then PP: ", "plan with --order tp-dp-pp)");

  // The model.
  parallel::ModelConfig m;
  if (auto recorded = parallel::plan_model(p)) {
    m = *recorded;
  } else {
    try {
      m = parallel::ModelConfig::preset(p.model());
    } catch (const InvalidArgument&) {
      refuse("the plan records no model sizes (model '", p.model(),
             "', written by an older tessera plan): write it again with tessera plan --json");
    }
  }
  auto model_size = [&](const char* flag, const char* what, auto& field, auto plan_value) {
    if (model_fixed && field != plan_value)
      refuse("the plan's model has ", what, " ", shown(plan_value), " but the --init / --model model has ",
             shown(field));
    if (!model_fixed) take(flag, what, field, plan_value);
  };
  model_size("--family", "family", t.model.family, m.family);
  model_size("--layers", "layers", t.model.layers, m.layers);
  model_size("--hidden", "hidden", t.model.hidden, m.hidden);
  model_size("--heads", "heads", t.model.heads, m.heads);
  // kv_heads and ffn_hidden left 0 on the command line mean the family's default: compare what they complete to.
  parallel::ModelConfig filled = t.model;
  if (!model_fixed) {
    filled.family = m.family;
    parallel::models::complete_model_config(filled);
  }
  model_size("--kv-heads", "kv_heads", filled.kv_heads, m.kv_heads);
  model_size("--ffn-hidden", "ffn_hidden", filled.ffn_hidden, m.ffn_hidden);
  model_size("--vocab", "vocab", t.model.vocab, m.vocab);
  take("--seq", "seq", t.seq, static_cast<int64_t>(p.seq()));
  if (!model_fixed) {
    // The plan's model as recorded (rope_theta, tied head, ...), with the run's context.
    const std::string name = t.model.name;
    t.model = m;
    t.model.name = name;
    t.model.max_seq = static_cast<int>(t.seq);
  }

  // The device.
  if (p.device().empty()) refuse("the plan records no device (written by an older tessera plan): write it again");
  const auto presets = DeviceSpec::preset_names();
  if (std::find(presets.begin(), presets.end(), p.device()) == presets.end())
    refuse("the plan's device '", p.device(), "' is not an emulated core train_gpt knows");
  take("--device", "device", device, p.device());

  // The layout.
  take("--tp", "tp", t.tp, p.tp());
  take("--pp", "pp", t.pp, p.pp());
  take("--dp", "dp", t.dp, p.dp());
  take("--micro-batch", "micro-batch", t.micro_batch, static_cast<int64_t>(p.micro_batch()));
  take("--global-batch", "global batch", t.global_batch, p.global_batch());
  if (p.num_micro_batches() != 0 && int64_t{p.num_micro_batches()} * p.micro_batch() * p.dp() != p.global_batch())
    throw FormatError(detail::concat("plan file '", path, "': ", p.num_micro_batches(), " micro-batches of ",
                                     p.micro_batch(), " x dp ", p.dp(), " is not the global batch ", p.global_batch()));
  if (p.pp() > 1) take("--schedule", "schedule", schedule, schedule_flag(p.schedule()));
  take("--virtual-stages", "virtual stages", t.virtual_stages, p.virtual_stages());
  bool zero1 = t.adamw.zero1, sp = t.sequence_parallel;
  take("--zero1", "zero1", zero1, p.zero1());
  take("--sequence-parallel", "sequence parallelism", sp, p.sequence_parallel());
  t.adamw.zero1 = zero1;
  t.sequence_parallel = sp;

  // The partition: the plan lists layers per stage; chunk c of stage r is
  // virtual stage c pp + r with stages[r] / v layers (parallel/planner.h).
  const int v = p.virtual_stages(), pp = p.pp();
  std::vector<int> stages(static_cast<size_t>(pp) * static_cast<size_t>(v));
  for (int r = 0; r < pp; ++r) {
    const int layers = p.stages(r);
    if (layers % v != 0)
      refuse("stage ", r, "'s ", layers, " layers do not split into ", v, " virtual stages of whole layers");
    for (int c = 0; c < v; ++c) stages[static_cast<size_t>(c) * pp + r] = layers / v;
  }
  if (given("--stages") && t.stages != stages)
    refuse("the plan has stages ", parallel::pipeline::stages_str(stages), " (layers per virtual stage) but --stages ",
           parallel::pipeline::stages_str(t.stages), " was given");
  t.stages = stages;
  return PlanRun{path, p.tp() * p.pp() * p.dp(), p.step_time_s().total(),
                 std::vector<double>(p.stage_bubble_fraction().begin(), p.stage_bubble_fraction().end()), p.topology()};
}

void check_plan_world(const PlanRun& plan, int world_size) {
  TESSERA_ARG_CHECK(world_size == plan.world_size, "--plan ", plan.path, " is for ", plan.world_size,
                    " ranks (tp x pp x dp) but this job has ", world_size, " process(es)");
}

std::vector<double> predicted_stage_bubbles(const parallel::models::gpt::TrainOptions& t, const std::string& device) {
  const int pp = t.pp, v = t.virtual_stages, layers = static_cast<int>(t.model.layers);
  if (pp <= 1) return {};
  // The cost model splits interleaved chunks evenly (the planner's only partition for v > 1).
  if (v > 1 && t.stages != parallel::pipeline::stage_layers(layers, pp * v)) return {};
  std::vector<int> per_stage(static_cast<size_t>(pp), 0);  // chunk c of stage r is virtual stage c pp + r
  for (int c = 0; c < v; ++c)
    for (int r = 0; r < pp; ++r)
      per_stage[static_cast<size_t>(r)] += t.stages[static_cast<size_t>(c) * static_cast<size_t>(pp) + r];
  parallel::ModelConfig m = t.model;
  m.name = "train_gpt";
  parallel::TrainingConfig tc;
  tc.global_batch = t.global_batch;
  tc.seq = static_cast<int>(t.seq);
  tc.fp32 = t.precision != DType::BF16;
  tc.bucket_elems = t.adamw.bucket_elems;
  const parallel::CostModel cm(m, DeviceSpec::preset(device), tc);
  parallel::PlanChoice c;
  c.tp = t.tp;
  c.pp = pp;
  c.dp = t.dp;
  c.micro_batch = static_cast<int>(t.micro_batch);
  c.virtual_stages = v;
  c.schedule = t.schedule;
  c.zero1 = t.adamw.zero1;
  c.sequence_parallel = t.sequence_parallel;
  c.stage_layers = per_stage;
  const parallel::PlanCost k =
      cm.evaluate(c, parallel::emulated_group_nets(t.tp, pp, t.dp, parallel::kv_replicas_of(t.model, t.tp)));
  std::vector<double> out;
  out.reserve(k.stage_bubbles.size());
  for (const parallel::StageBubble& b : k.stage_bubbles) out.push_back(b.fraction());
  return out;
}

}  // namespace tessera::gpt
