// Pipeline schedules: the order in which one stage runs the forward (F) and
// backward (B) passes of a step's micro-batches (Megatron-core
// pipeline_parallel/schedules.py, Narayanan et al. 2021).
//
// - GPipe: every forward, then every backward (a stage holds m micro-batches
//   of activations).
// - 1F1B: stage s warms up with min(p - s - 1, m) forwards, then alternates
//   one forward and one backward, then cools down with the remaining
//   backwards (at most p micro-batches in flight).
// Both leave a bubble of (p - 1) / (m + p - 1) of the step on every stage.
//
// Micro-batches are numbered 0..m-1 and pass every stage in that order, both
// ways. Pure functions; thread-safe.
#pragma once

#include <string>
#include <vector>

namespace tessera::parallel::pipeline {

enum class Schedule { kGpipe, k1F1B };

// "gpipe", "1f1b".
const char* schedule_name(Schedule s);
// Throws InvalidArgument naming the text and the choices.
Schedule parse_schedule(const std::string& text);

struct PipeOp {
  enum Kind { kForward, kBackward };
  Kind kind;
  int micro;      // micro-batch, 0..m-1
  int chunk = 0;  // model chunk of this rank (0 without virtual stages)
  bool operator==(const PipeOp& o) const { return kind == o.kind && micro == o.micro && chunk == o.chunk; }
};

// The ops stage `stage` of `p` runs for `m` micro-batches, in order. Throws
// InvalidArgument unless p >= 1, 0 <= stage < p and m >= 1.
std::vector<PipeOp> schedule_ops(Schedule s, int p, int m, int stage);

// "F0 F1 B0 ..." (chunks, when any is non-zero, as "F0.1": micro 0 of chunk 1).
std::string ops_str(const std::vector<PipeOp>& ops);

// Largest number of micro-batches whose activations the ops hold at once.
int max_in_flight(const std::vector<PipeOp>& ops);

// The bubble fraction of a step: (p - 1) / (m + p - 1).
double bubble_fraction(int p, int m);

}  // namespace tessera::parallel::pipeline
