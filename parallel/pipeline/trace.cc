#include "parallel/pipeline/trace.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "runtime/error.h"

namespace tessera::parallel::pipeline {

const char* trace_clock_name(TraceClock c) { return c == TraceClock::kWall ? "wall" : "emulated"; }

TraceClock parse_trace_clock(const std::string& text) {
  if (text == "emulated") return TraceClock::kEmulated;
  if (text == "wall") return TraceClock::kWall;
  throw InvalidArgument("trace clock '" + text + "': choose emulated or wall");
}

namespace {

nlohmann::json spans_json(const std::vector<TraceSpan>& spans) {
  nlohmann::json a = nlohmann::json::array();
  for (const TraceSpan& s : spans) {
    nlohmann::json args = nlohmann::json::object();
    for (const auto& [k, v] : s.args) args[k] = v;
    a.push_back(
        {{"n", s.name}, {"c", s.cat}, {"p", s.phase}, {"s", s.start}, {"d", s.dur}, {"i", s.instant}, {"a", args}});
  }
  return a;
}

// Every rank's text on rank 0 (collective over world): sizes, then the texts padded to the longest.
std::vector<std::string> gather_texts(collectives::Communicator* world, const std::string& mine) {
  if (world == nullptr) return {mine};
  const int n = world->size();
  int64_t len = static_cast<int64_t>(mine.size());
  std::vector<int64_t> lens(static_cast<size_t>(n));
  world->all_gather(&len, lens.data(), 1, DType::I64);
  const int64_t longest = *std::max_element(lens.begin(), lens.end());
  // As int64 words (the collectives move typed elements).
  const size_t words = static_cast<size_t>((longest + 7) / 8);
  std::vector<int64_t> send(words, 0), recv(words * static_cast<size_t>(n), 0);
  std::memcpy(send.data(), mine.data(), mine.size());
  world->all_gather(send.data(), recv.data(), words, DType::I64);
  std::vector<std::string> out(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    out[static_cast<size_t>(r)].assign(reinterpret_cast<const char*>(recv.data() + static_cast<size_t>(r) * words),
                                       static_cast<size_t>(lens[static_cast<size_t>(r)]));
  return out;
}

}  // namespace

std::string gather_trace(collectives::Communicator* world, int rank, const std::vector<TraceSpan>& mine,
                         TraceClock clock, const std::vector<std::string>& track_names, const std::string& other) {
  std::vector<std::string> texts = gather_texts(world, spans_json(mine).dump());
  if (rank != 0) return "";
  const int n = static_cast<int>(texts.size());
  std::vector<nlohmann::json> ranks;
  ranks.reserve(texts.size());
  for (const std::string& t : texts) ranks.push_back(nlohmann::json::parse(t));
  auto end_of = [](const nlohmann::json& s) { return s.at("s").get<double>() + s.at("d").get<double>(); };
  // Emulated clock: phase 1 starts when the slowest pipeline ends; the step when the slowest rank is done.
  double phase0 = 0, step = 0;
  std::vector<double> len0(static_cast<size_t>(n), 0), len1(static_cast<size_t>(n), 0);
  double origin = 0;
  if (clock == TraceClock::kEmulated) {
    for (int r = 0; r < n; ++r)
      for (const auto& s : ranks[static_cast<size_t>(r)])
        (s.at("p").get<int>() == 0 ? len0 : len1)[static_cast<size_t>(r)] =
            std::max((s.at("p").get<int>() == 0 ? len0 : len1)[static_cast<size_t>(r)], end_of(s));
    phase0 = *std::max_element(len0.begin(), len0.end());
    for (int r = 0; r < n; ++r) step = std::max(step, phase0 + len1[static_cast<size_t>(r)]);
  } else {
    origin = std::numeric_limits<double>::infinity();
    for (const auto& spans : ranks)
      for (const auto& s : spans) origin = std::min(origin, s.at("s").get<double>());
    if (!std::isfinite(origin)) origin = 0;
  }
  nlohmann::json events = nlohmann::json::array();
  auto us = [](double s) { return s * 1e6; };
  for (int r = 0; r < n; ++r) {
    const std::string name =
        r < static_cast<int>(track_names.size()) ? track_names[static_cast<size_t>(r)] : "rank " + std::to_string(r);
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", r}, {"args", {{"name", name}}}});
    events.push_back(
        {{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", 0}, {"tid", r}, {"args", {{"sort_index", r}}}});
    auto emit = [&](const std::string& nm, const std::string& cat, double start, double dur, bool instant,
                    const nlohmann::json& args) {
      nlohmann::json e{{"name", nm}, {"cat", cat}, {"pid", 0}, {"tid", r}, {"ts", us(start)}, {"args", args}};
      if (instant) {
        e["ph"] = "i";
        e["s"] = "t";
      } else {
        e["ph"] = "X";
        e["dur"] = us(dur);
      }
      events.push_back(std::move(e));
    };
    for (const auto& s : ranks[static_cast<size_t>(r)]) {
      double start = s.at("s").get<double>() - origin;
      if (clock == TraceClock::kEmulated && s.at("p").get<int>() == 1) start += phase0;
      emit(s.at("n"), s.at("c"), start, s.at("d").get<double>(), s.at("i").get<bool>(), s.at("a"));
    }
    if (clock == TraceClock::kEmulated) {
      const double drain = phase0 - len0[static_cast<size_t>(r)];
      if (drain > 0)
        emit("wait (pipeline drains)", "bubble", len0[static_cast<size_t>(r)], drain, false, nlohmann::json::object());
      const double done = phase0 + len1[static_cast<size_t>(r)];
      if (step - done > 0) emit("idle", "idle", done, step - done, false, nlohmann::json::object());
    }
  }
  nlohmann::json od = other.empty() ? nlohmann::json::object() : nlohmann::json::parse(other);
  od["clock"] = trace_clock_name(clock);
  if (clock == TraceClock::kEmulated) {
    od["pipeline_us"] = us(phase0);
    od["step_us"] = us(step);
  }
  nlohmann::json doc{{"traceEvents", events}, {"displayTimeUnit", "ns"}, {"otherData", od}};
  return doc.dump();
}

std::vector<RankBubble> trace_bubbles(const std::string& json, const std::string& source) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError("trace '" + source + "': " + e.what());
  }
  if (!doc.is_object() || !doc.contains("traceEvents") || !doc["traceEvents"].is_array())
    throw FormatError("trace '" + source + "': no traceEvents array");
  std::map<int, RankBubble> by;
  try {
    for (const auto& e : doc["traceEvents"]) {
      if (e.at("ph") != "X") continue;
      const int tid = e.at("tid").get<int>();
      const std::string cat = e.value("cat", "");
      RankBubble& b = by[tid];
      b.rank = tid;
      const double dur = e.at("dur").get<double>();
      if (cat == "bubble") b.bubble_us += dur;
      if (cat == "forward" || cat == "backward") b.busy_us += dur;
      if (cat == "p2p") b.p2p_us += dur;  // the pipeline's link transfers
    }
  } catch (const nlohmann::json::exception& e) {
    throw FormatError("trace '" + source + "': " + e.what());
  }
  std::vector<RankBubble> out;
  out.reserve(by.size());
  for (const auto& [tid, b] : by) out.push_back(b);
  return out;
}

}  // namespace tessera::parallel::pipeline
