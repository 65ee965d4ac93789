// How a model's transformer layers split into pipeline stages: the one rule
// the planner, the cost model, the runtime and `tessera ckpt shard --pp` use.
//
// stage_layers follows NxD's auto_partition: split evenly, and the leftover
// layers go to the later stages (10 layers over 4 stages: [2, 2, 3, 3]). A
// partition given explicitly (a plan's, or `--stages 3,3,2,2`) overrides it
// once check_stages accepts it. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::parallel::pipeline {

// Layers per stage, stage 0 first. Throws InvalidArgument unless
// 1 <= pp <= layers (each stage needs a whole layer).
std::vector<int> stage_layers(int64_t layers, int pp);

// Throws InvalidArgument, naming the problem, unless `stages` has pp entries,
// each positive, summing to `layers`.
void check_stages(const std::vector<int>& stages, int64_t layers, int pp);

// `stages` when given (checked), else stage_layers(layers, pp).
std::vector<int> resolve_stages(const std::vector<int>& stages, int64_t layers, int pp);

// First layer of stage s (s in [0, stages.size()]; the last gives the layer count).
int64_t stage_first_layer(const std::vector<int>& stages, int s);
// Stage holding `layer`. Throws InvalidArgument when out of range.
int stage_of_layer(const std::vector<int>& stages, int64_t layer);

// "3,3,2,2" -> {3, 3, 2, 2}. Throws InvalidArgument naming the text when it
// is not a comma-separated list of integers (the values are checked by
// check_stages).
std::vector<int> parse_stages(const std::string& text);
// {3, 3, 2, 2} -> "3,3,2,2".
std::string stages_str(const std::vector<int>& stages);

}  // namespace tessera::parallel::pipeline
