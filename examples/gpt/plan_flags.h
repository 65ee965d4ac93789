// train_gpt's --plan FILE: runs a plan written by `tessera plan --json`
// (parallel/plan_io.h, parallel/proto/plan.proto). docs/training.md, "Running
// a plan".
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "parallel/models/gpt/trainer.h"

namespace tessera::gpt {

// What the run takes from the plan besides the options.
struct PlanRun {
  std::string path;
  int world_size = 1;           // tp x pp x dp of the plan
  double predicted_step_s = 0;  // the plan's step_time_s.total
  // The plan's stage_bubble_fraction: each stage's predicted bubble, as a
  // trace reads it (empty for pp = 1 and in older plans).
  std::vector<double> stage_bubble;
  std::string topology;  // the plan's topology (its name: a preset, or a JSON file's "name")
};

// Reads the plan at `path` and fills `t` (tp, pp, dp, micro-batch, global
// batch, seq, schedule, virtual stages, stage partition, ZeRO-1, sequence
// parallelism, and the model sizes the command line leaves open), `schedule`
// (train_gpt's --schedule text) and `device`. `given(flag)` says whether the
// user gave a flag; `model_fixed` that the model sizes in `t` are fixed
// already (--init). Throws InvalidArgument naming the file and both values
// when the plan does not match the model (family, layers, hidden, heads,
// vocab, seq), the device, or a given flag, or asks for what train_gpt
// cannot run (bf16, recompute, a rank order other than tp-dp-pp);
// FormatError for a malformed plan.
PlanRun apply_plan(const std::string& path, parallel::models::gpt::TrainOptions& t, std::string& schedule,
                   std::string& device, bool model_fixed, const std::function<bool(const char*)>& given);

// Exit 2 with a message naming the plan unless the job has the plan's world size.
void check_plan_world(const PlanRun& plan, int world_size);

// Each pipeline stage's bubble fraction, as a trace of this run reads it,
// predicted by the planner's cost model (parallel/cost_model.h) for the
// run's layout on `device` with train_gpt's communicators (what `tessera
// plan --topology emulated:N --precision fp32` pinned to the layout
// predicts). Empty for pp = 1 and for interleaved chunks of unequal sizes,
// which the cost model does not take. `t` is normalized.
std::vector<double> predicted_stage_bubbles(const parallel::models::gpt::TrainOptions& t, const std::string& device);

}  // namespace tessera::gpt
