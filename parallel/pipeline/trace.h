// Step timelines as Chrome/Perfetto trace-event JSON (the "JSON Object
// Format" of the Trace Event Format: {"traceEvents": [...]}, complete events
// "ph": "X" with "ts"/"dur" in microseconds, "M" metadata events naming the
// tracks), which ui.perfetto.dev and chrome://tracing open.
//
// One track (pid 0, tid = global rank) per rank. A rank's spans come in two
// phases on the emulated clock: 0, the pipeline (forward/backward ops with
// their aggregated TP collectives, the waits for a neighbour to send: the
// bubble, the rest of the link transfers: "p2p", and instants for each send
// and receive), from the step's start; 1, what follows it (the tied
// embedding's sum, the DP gradient buckets, the optimizer, the ZeRO-1
// all-gathers, the loss sum), from the end of phase 0. write_trace lines the
// ranks up: phase 0 runs until the slowest rank's pipeline ends (the others
// idle until then, a "bubble" span: the pipeline drains), phase 1 starts
// there on every rank, and a rank done before the slowest idles ("idle").
// On the wall clock the spans keep their measured times (seconds since the
// Unix epoch, shown from the earliest) and are not lined up.
//
// The bubble fraction of a rank read back from a trace is its "bubble" time
// over its forward + backward + bubble + p2p time: the idle share of its
// pipeline phase not spent on a link transfer, (p - 1) / (v m + p - 1) for a
// balanced schedule (the formula counts no transfer time).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "collectives/communicator.h"

namespace tessera::parallel::pipeline {

struct TraceSpan {
  std::string name;  // "F3", "B3.1", "DP reduce-scatter bucket 2", ...
  // forward, backward, tp_comm (nested in an op), bubble, idle, dp_comm,
  // collective, optimizer.
  std::string cat;
  int phase = 0;              // 0: pipeline, 1: after it (emulated clock)
  double start = 0, dur = 0;  // seconds: from the phase's start (emulated) or the epoch (wall)
  bool instant = false;       // a point in time ("ph": "i"), dur unused
  std::vector<std::pair<std::string, double>> args;
};

enum class TraceClock { kEmulated, kWall };
const char* trace_clock_name(TraceClock c);
// "emulated" or "wall"; throws InvalidArgument otherwise.
TraceClock parse_trace_clock(const std::string& text);

// Gathers every rank's spans on rank 0 of `world` (collective over it; null
// for a single process) and, there, returns the trace document (elsewhere
// ""). track_names[r] names rank r's track; `other` is a JSON object text
// for "otherData" (clock added).
std::string gather_trace(collectives::Communicator* world, int rank, const std::vector<TraceSpan>& mine,
                         TraceClock clock, const std::vector<std::string>& track_names, const std::string& other);

// Per rank (tid) of a trace document: its pipeline phase's busy and bubble
// time and its bubble fraction. Throws FormatError naming `source` for a
// document that is not a trace.
struct RankBubble {
  int rank = 0;
  double busy_us = 0, bubble_us = 0, p2p_us = 0;
  double fraction() const {
    const double total = busy_us + bubble_us + p2p_us;
    return total > 0 ? bubble_us / total : 0;
  }
};
std::vector<RankBubble> trace_bubbles(const std::string& json, const std::string& source);

}  // namespace tessera::parallel::pipeline
