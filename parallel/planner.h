// Planner: searches how to split a transformer over a topology and ranks the
// choices by predicted step time.
//
// Searched: tp (dividing the attention heads, the KV heads and the MLP size),
// pp (up to the number of layers; even partition when it divides, and a
// balanced partition that counts the LM head), dp = cores / (tp pp) dividing
// the global batch, the micro-batch size (dividing global_batch / dp),
// virtual stages (Megatron's interleaved 1F1B: layers divisible by pp*v and
// micro-batches by pp), the schedule (GPipe or 1F1B without virtual
// stages, interleaved 1F1B with them), ZeRO-1, sequence parallelism (with tp > 1) and
// recompute (none, selective, full). Any of them can be pinned. Step times
// come from cost_model.h (the emulated cores' own kernel and collective
// costs); on an "emulated:N" topology each group is costed as train_gpt's
// communicators model it. Plans whose
// memory exceeds the usable HBM are dropped; the rest are ranked by step
// time (then by memory).
//
// plan() is a pure function; it throws InvalidArgument for pins that cannot
// hold (a tp that does not divide the heads, tp*pp*dp not the core count, ...)
// and Error when nothing fits in memory.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "parallel/cost_model.h"
#include "parallel/mesh.h"
#include "parallel/model_config.h"
#include "runtime/topology.h"

namespace tessera::parallel {

struct PlanPins {
  std::optional<int> tp, pp, dp, micro_batch, virtual_stages;
  std::optional<pipeline::Schedule> schedule;  // gpipe or 1f1b need v = 1, interleaved v > 1
  std::optional<bool> zero1, sequence_parallel;
  std::optional<Recompute> recompute;
};

struct PlannerOptions {
  TrainingConfig train;
  PlanPins pins;
  int top_k = 5;
  MeshOrder order = kDefaultMeshOrder;
};

struct RankedPlan {
  PlanChoice choice;
  PlanCost cost;
};

// Hop statistics of a placement, per axis (TP, DP, PP).
struct PlacementSummary {
  HopStats tp, dp, pp;
};

struct PlannerResult {
  std::vector<RankedPlan> top;  // best first, at most top_k
  long evaluated = 0;           // choices costed
  long over_memory = 0;         // of those, dropped for memory
  double capacity_bytes = 0;    // usable bytes per core
  // The fastest plan that did not fit, if it is faster than the best (why we could not take it).
  std::optional<RankedPlan> fastest_over_memory;
  std::vector<std::string> why;  // a few lines on why the best plan wins
  double seconds = 0;            // wall time of the search
};

PlannerResult plan(const ModelConfig& model, const Topology& topo, const PlannerOptions& opts);

// Placement and hop statistics of a choice (used for printing and the JSON plan).
PlacementSummary summarize_placement(const Placement& placement);

}  // namespace tessera::parallel
