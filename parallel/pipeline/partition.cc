#include "parallel/pipeline/partition.h"

#include <charconv>

#include "runtime/error.h"

namespace tessera::parallel::pipeline {

std::vector<int> stage_layers(int64_t layers, int pp) {
  TESSERA_ARG_CHECK(pp >= 1 && pp <= layers, "pp=", pp, " cannot split ", layers,
                    " layers (each stage needs a whole layer)");
  std::vector<int> v(static_cast<size_t>(pp), static_cast<int>(layers / pp));
  for (int64_t i = 0; i < layers % pp; ++i) v[static_cast<size_t>(pp - 1 - i)] += 1;
  return v;
}

void check_stages(const std::vector<int>& stages, int64_t layers, int pp) {
  TESSERA_ARG_CHECK(static_cast<int64_t>(stages.size()) == pp, "--stages ", stages_str(stages), " has ", stages.size(),
                    " entries, pp is ", pp);
  int64_t sum = 0;
  for (int n : stages) {
    TESSERA_ARG_CHECK(n > 0, "--stages ", stages_str(stages), ": every stage needs at least one layer");
    sum += n;
  }
  TESSERA_ARG_CHECK(sum == layers, "--stages ", stages_str(stages), " sums to ", sum, ", the model has ", layers,
                    " layers");
}

std::vector<int> resolve_stages(const std::vector<int>& stages, int64_t layers, int pp) {
  if (stages.empty()) return stage_layers(layers, pp);
  check_stages(stages, layers, pp);
  return stages;
}

int64_t stage_first_layer(const std::vector<int>& stages, int s) {
  TESSERA_ARG_CHECK(s >= 0 && s <= static_cast<int>(stages.size()), "stage ", s, " out of range");
  int64_t first = 0;
  for (int i = 0; i < s; ++i) first += stages[static_cast<size_t>(i)];
  return first;
}

int stage_of_layer(const std::vector<int>& stages, int64_t layer) {
  int64_t end = 0;
  for (size_t s = 0; s < stages.size(); ++s) {
    end += stages[s];
    if (layer >= 0 && layer < end) return static_cast<int>(s);
  }
  TESSERA_ARG_CHECK(false, "layer ", layer, " is not in the ", end, " layers of stages ", stages_str(stages));
  return -1;
}

std::vector<int> parse_stages(const std::string& text) {
  std::vector<int> v;
  size_t pos = 0;
  while (true) {
    const size_t comma = text.find(',', pos);
    const std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    int n = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), n);
    TESSERA_ARG_CHECK(!item.empty() && ec == std::errc() && end == item.data() + item.size(), "--stages '", text,
                      "' is not a comma-separated list of layer counts (e.g. 3,3,2,2)");
    v.push_back(n);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return v;
}

std::string stages_str(const std::vector<int>& stages) {
  std::string s;
  for (size_t i = 0; i < stages.size(); ++i) s += (i ? "," : "") + std::to_string(stages[i]);
  return s;
}

}  // namespace tessera::parallel::pipeline
