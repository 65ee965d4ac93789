// The plan as a document: the protobuf message of parallel/proto/plan.proto,
// built from a planner result, written and read as JSON through protobuf's
// JSON mapping (proto field names; unknown fields are rejected on reading),
// except that 64-bit integers are written as numbers, not the mapping's
// strings, so jq and Python read them as numbers; reading takes both.
// The training and checkpoint commands read plans through read_plan_json.
// Pure functions; no shared state.
#pragma once

#include <optional>
#include <string>

#include "parallel/planner.h"
#include "parallel/proto/plan.pb.h"

namespace tessera::parallel {

// The plan document for `p`; with_placement lists every rank's coordinates.
tessera::plan::Plan make_plan_proto(const ModelConfig& model, const Topology& topo, const PlannerOptions& opts,
                                    const RankedPlan& p, bool with_placement = true);

std::string plan_to_json(const tessera::plan::Plan& plan);
// Throws FormatError naming `source` for malformed JSON, unknown fields, or a
// plan that contradicts itself (stages not pp long, tp*pp*dp not the cores...).
tessera::plan::Plan plan_from_json(const std::string& text, const std::string& source);

// The device mesh a plan describes (tp, pp, dp and rank_order), for training
// to build its groups with Mesh::tp_group(rank) and friends.
Mesh plan_mesh(const tessera::plan::Plan& plan);

// The model a plan records (name and sizes, as make_plan_proto writes them);
// nullopt for a plan written before plans recorded the sizes.
std::optional<ModelConfig> plan_model(const tessera::plan::Plan& plan);

// Written with write_file_atomic (runtime/files.h): a reader sees the old plan
// or the new one. InvalidArgument when the file cannot be created (bad path),
// IoError naming the failed step otherwise.
void write_plan_json(const std::string& path, const tessera::plan::Plan& plan);
tessera::plan::Plan read_plan_json(const std::string& path);

}  // namespace tessera::parallel
