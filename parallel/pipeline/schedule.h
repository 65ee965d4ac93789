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
// - Interleaved 1F1B (Megatron's forward_backward_pipelining_with_interleaving):
//   each rank holds v model chunks (rank i: virtual stages i, i + p, ...,
//   i + (v - 1) p) and runs the m x v chunk passes in groups of p
//   micro-batches per chunk: forward k is chunk (k mod pv) / p of micro-batch
//   (k / pv) p + k mod p, backward k the same with the chunks reversed.
//   Warm-up: 2 (p - stage - 1) + (v - 1) p forwards (all m v when m == p).
//   Needs p >= 2, v >= 2 and m a multiple of p (as Megatron). Bubble
//   (p - 1) / (v m + p - 1).
//
// Micro-batches are numbered 0..m-1 and pass every stage in that order, both
// ways. Pure functions; thread-safe.
#pragma once

#include <string>
#include <vector>

namespace tessera::parallel::pipeline {

enum class Schedule { kGpipe, k1F1B, kInterleaved };

// "gpipe", "1f1b", "interleaved".
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

// The ops stage `stage` of `p` runs for `m` micro-batches, in order, with v
// chunks per rank (interleaved only; 1 otherwise). Throws InvalidArgument
// unless p >= 1, 0 <= stage < p, m >= 1 and check_schedule accepts.
std::vector<PipeOp> schedule_ops(Schedule s, int p, int m, int stage, int v = 1);

// Throws InvalidArgument, naming the flag and the rule, unless `s` can run
// p stages, m micro-batches and v chunks per rank (v == 1 unless
// interleaved; interleaved: p >= 2, v >= 2, m % p == 0).
void check_schedule(Schedule s, int p, int m, int v);

// "F0 F1 B0 ..." (chunks, when any is non-zero, as "F0.1": micro 0 of chunk 1).
std::string ops_str(const std::vector<PipeOp>& ops);

// Largest number of micro-batches whose activations the ops hold at once.
int max_in_flight(const std::vector<PipeOp>& ops);

// The bubble fraction of a step: (p - 1) / (v m + p - 1).
double bubble_fraction(int p, int m, int v = 1);

}  // namespace tessera::parallel::pipeline
