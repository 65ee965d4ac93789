#include "parallel/pipeline/schedule.h"

#include <algorithm>

#include "runtime/error.h"

namespace tessera::parallel::pipeline {

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::kGpipe:
      return "gpipe";
    case Schedule::k1F1B:
      return "1f1b";
    case Schedule::kInterleaved:
      return "interleaved";
  }
  return "?";
}

Schedule parse_schedule(const std::string& text) {
  if (text == "gpipe") return Schedule::kGpipe;
  if (text == "1f1b") return Schedule::k1F1B;
  if (text == "interleaved") return Schedule::kInterleaved;
  throw InvalidArgument("unknown pipeline schedule '" + text + "' (expected gpipe, 1f1b or interleaved)");
}

void check_schedule(Schedule s, int p, int m, int v) {
  TESSERA_ARG_CHECK(p >= 1, "--pp must be >= 1 (got ", p, ")");
  TESSERA_ARG_CHECK(m >= 1, "a pipeline step needs at least one micro-batch (got ", m, ")");
  if (s != Schedule::kInterleaved) {
    TESSERA_ARG_CHECK(v == 1, "--virtual-stages ", v, " needs --schedule interleaved");
    return;
  }
  TESSERA_ARG_CHECK(p >= 2, "the interleaved schedule needs --pp >= 2 (got ", p, ")");
  TESSERA_ARG_CHECK(v >= 2, "the interleaved schedule needs --virtual-stages >= 2 (got ", v, ")");
  TESSERA_ARG_CHECK(m % p == 0, "the interleaved schedule needs the micro-batches per step (", m,
                    ") to be a multiple of --pp ", p, " (as Megatron-LM)");
}

std::vector<PipeOp> schedule_ops(Schedule s, int p, int m, int stage, int v) {
  TESSERA_ARG_CHECK(p >= 1 && stage >= 0 && stage < p, "pipeline stage ", stage, " out of range for ", p, " stages");
  check_schedule(s, p, m, v);
  std::vector<PipeOp> ops;
  auto f = [&](int i) { ops.push_back({PipeOp::kForward, i, 0}); };
  auto b = [&](int i) { ops.push_back({PipeOp::kBackward, i, 0}); };
  if (s == Schedule::kInterleaved) {
    const int total = m * v, group = p * v;
    auto op = [&](PipeOp::Kind kind, int k) {
      int chunk = k % group / p;
      if (kind == PipeOp::kBackward) chunk = v - 1 - chunk;
      ops.push_back({kind, k / group * p + k % p, chunk});
    };
    const int warmup = m == p ? total : std::min(2 * (p - stage - 1) + (v - 1) * p, total);
    for (int k = 0; k < warmup; ++k) op(PipeOp::kForward, k);
    for (int k = 0; k < total - warmup; ++k) {
      op(PipeOp::kForward, warmup + k);
      op(PipeOp::kBackward, k);
    }
    for (int k = total - warmup; k < total; ++k) op(PipeOp::kBackward, k);
    return ops;
  }
  if (s == Schedule::kGpipe) {
    for (int i = 0; i < m; ++i) f(i);
    for (int i = 0; i < m; ++i) b(i);
    return ops;
  }
  const int warmup = std::min(p - stage - 1, m);
  for (int i = 0; i < warmup; ++i) f(i);
  for (int i = 0; i < m - warmup; ++i) {
    f(warmup + i);
    b(i);
  }
  for (int i = m - warmup; i < m; ++i) b(i);
  return ops;
}

std::string ops_str(const std::vector<PipeOp>& ops) {
  const bool chunks = std::any_of(ops.begin(), ops.end(), [](const PipeOp& o) { return o.chunk != 0; });
  std::string s;
  for (const PipeOp& o : ops) {
    if (!s.empty()) s += ' ';
    s += o.kind == PipeOp::kForward ? 'F' : 'B';
    s += std::to_string(o.micro);
    if (chunks) s += "." + std::to_string(o.chunk);
  }
  return s;
}

// Activations in flight, counted over every chunk.
int max_in_flight(const std::vector<PipeOp>& ops) {
  int now = 0, peak = 0;
  for (const PipeOp& o : ops) {
    now += o.kind == PipeOp::kForward ? 1 : -1;
    peak = std::max(peak, now);
  }
  return peak;
}

double bubble_fraction(int p, int m, int v) { return static_cast<double>(p - 1) / static_cast<double>(v * m + p - 1); }

}  // namespace tessera::parallel::pipeline
