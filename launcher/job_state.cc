#include "launcher/job_state.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "runtime/error.h"

namespace tessera::launcher {

using Code = JobStatus::Code;
using Clock = JobState::Clock;

namespace {

// Blocking calls re-check cancellation this often.
constexpr std::chrono::milliseconds kPollSlice{200};

std::string join_ints(const std::vector<int>& v, size_t max = 16) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < max; ++i) s += (i ? "," : "") + std::to_string(v[i]);
  if (v.size() > max) s += ",...";
  return s;
}

std::chrono::milliseconds bounded_timeout(std::chrono::milliseconds ms) {
  if (ms.count() <= 0) return std::chrono::milliseconds(0);
  return std::min(ms, kMaxWait);
}

template <typename... Args>
JobStatus invalid(Args&&... args) {
  return {Code::kInvalidArgument, detail::concat(std::forward<Args>(args)...)};
}

JobStatus check_key(const std::string& key) {
  if (key.empty()) return invalid("empty key");
  if (key.size() > kMaxKeyBytes) return invalid("key longer than ", kMaxKeyBytes, " bytes");
  return JobStatus::success();
}

JobStatus check_cause(const RootCause& c) {
  if (c.host.size() > kMaxHostBytes || c.reason.size() > kMaxReasonBytes || c.log_tail.size() > kMaxLogTailLines)
    return invalid("root cause report too large");
  return JobStatus::success();
}

std::string describe(const RootCause& c) {
  std::string who =
      c.rank >= 0 ? detail::concat("rank ", c.rank, " on node ", c.node_rank) : detail::concat("node ", c.node_rank);
  return detail::concat(who, " (", c.host, "): ", c.reason);
}

}  // namespace

JobState::JobState(JobStateOptions o) : opt_(o) {
  TESSERA_ARG_CHECK(opt_.num_nodes >= 0 && opt_.num_nodes <= kMaxRanks, "coordinator: bad node count ", opt_.num_nodes);
  TESSERA_ARG_CHECK(opt_.num_nodes > 0 || opt_.world_size > 0,
                    "coordinator: without rendezvous (0 nodes) the world size must be given");
  TESSERA_ARG_CHECK(opt_.heartbeat_timeout.count() > 0, "coordinator: heartbeat timeout must be positive");
  if (opt_.num_nodes == 0) {
    world_size_ = opt_.world_size;
    started_ = true;
  }
}

void JobState::shutdown() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
}

JobStatus JobState::admit(int round) const {
  if (round < 0) return JobStatus::success();
  std::lock_guard<std::mutex> l(mu_);
  if (round != round_)
    return {Code::kFailedPrecondition,
            detail::concat("stale call from round ", round, " (the job is in round ", round_, ")")};
  return JobStatus::success();
}

// Sleeps until pred() (OK), the deadline (DeadlineExceeded), an abort of
// `round` or a newer round (Aborted), shutdown (Unavailable) or the caller
// cancelling (Cancelled).
template <typename Pred>
JobStatus JobState::block(std::unique_lock<std::mutex>& l, const Cancelled& cancelled, int round,
                          Clock::time_point deadline, Pred pred) {
  for (;;) {
    if (stopping_) return {Code::kUnavailable, "coordinator is shutting down"};
    if (round >= 0 && (round != round_ || aborted_)) return aborted_status_locked(round);
    if (round < 0 && aborted_) return aborted_status_locked(round_);
    if (pred()) return JobStatus::success();
    if (cancelled && cancelled()) return {Code::kCancelled, "caller cancelled"};
    auto now = Clock::now();
    if (now >= deadline) return {Code::kDeadlineExceeded, "timed out"};
    cv_.wait_until(l, std::min(deadline, now + kPollSlice));
  }
}

JobStatus JobState::aborted_status_locked(int round) const {
  if (round < 0) round = round_;
  auto it = causes_.find(round);
  std::string why = it == causes_.end() ? std::string("a newer round started") : describe(it->second);
  return {Code::kAborted, detail::concat("job aborted (round ", round, "): ", why)};
}

bool JobState::abort_locked(int round, const RootCause& cause) {
  if (round != round_ || aborted_) return false;
  aborted_ = true;
  causes_[round] = cause;
  while (causes_.size() > 64) causes_.erase(causes_.begin());
  spdlog::debug("coordinator: aborting round {}: {}", round, describe(cause));
  cv_.notify_all();
  return true;
}

void JobState::advance_round_locked(int round) {
  round_ = round;
  started_ = false;
  aborted_ = false;
  joined_.clear();
  layout_.clear();
  kv_.clear();
  kv_bytes_ = 0;
  barriers_.clear();
  rank_beats_.clear();
  exited_ranks_.clear();
  nodes_done_.clear();
  cv_.notify_all();
}

// ---- rendezvous ------------------------------------------------------------------

JobStatus JobState::join(int node_rank, const std::string& host, int nproc, int round,
                         std::chrono::milliseconds timeout, const Cancelled& cancelled, JoinResult* result) {
  if (opt_.num_nodes == 0) return {Code::kFailedPrecondition, "this job has no rendezvous (mpirun mode)"};
  if (node_rank < 0 || node_rank >= opt_.num_nodes)
    return invalid("node_rank ", node_rank, " is outside [0, ", opt_.num_nodes, ")");
  if (nproc < 1 || nproc > kMaxRanks) return invalid("nproc ", nproc, " out of range");
  if (host.size() > kMaxHostBytes) return invalid("host name longer than ", kMaxHostBytes, " bytes");
  if (round < 0) return invalid("negative round");
  std::unique_lock<std::mutex> l(mu_);
  if (round < round_)
    return {Code::kFailedPrecondition, detail::concat("round ", round, " is over (now ", round_, ")")};
  if (round > round_) {
    if (round != round_ + 1) return invalid("round ", round, " skips ahead of round ", round_);
    if (started_ && !aborted_)
      return {Code::kFailedPrecondition, detail::concat("round ", round_, " is still running")};
    advance_round_locked(round);
  }
  if (!dead_nodes_.empty()) {
    return {Code::kFailedPrecondition, detail::concat("node(s) ", join_ints({dead_nodes_.begin(), dead_nodes_.end()}),
                                                      " stopped sending heartbeats; no new round can start")};
  }
  if (auto it = joined_.find(node_rank); it != joined_.end()) {
    return {Code::kAlreadyExists,
            detail::concat("node ", node_rank, " already joined round ", round_, " (host ", it->second.host, ")")};
  }
  joined_[node_rank] = NodeInfo{node_rank, host, nproc, 0};
  node_beats_[node_rank] = Beat{node_rank, host, Clock::now()};
  const int my_round = round_;
  if (static_cast<int>(joined_.size()) == opt_.num_nodes) {
    int next = 0;
    layout_.clear();
    for (auto& [k, n] : joined_) {
      n.first_rank = next;
      next += n.nproc;
      layout_.push_back(n);
    }
    if (next > kMaxRanks) return invalid("world of ", next, " ranks is too large");
    world_size_ = next;
    started_ = true;
    spdlog::debug("coordinator: round {} started: {} nodes, {} workers", round_, opt_.num_nodes, world_size_);
    cv_.notify_all();
  }
  auto deadline = Clock::now() + bounded_timeout(timeout);
  JobStatus s = block(l, cancelled, my_round, deadline, [&] { return started_; });
  if (!s.ok()) {
    if (s.code() == Code::kDeadlineExceeded) {
      std::vector<int> missing;
      for (int k = 0; k < opt_.num_nodes; ++k)
        if (!joined_.count(k)) missing.push_back(k);
      s = JobStatus(Code::kDeadlineExceeded,
                    detail::concat("rendezvous timed out: ", joined_.size(), " of ", opt_.num_nodes,
                                   " nodes joined round ", my_round, "; missing node rank(s) ", join_ints(missing)));
    }
    // A node that gave up must not count in the rendezvous any more.
    if (round_ == my_round && !started_) joined_.erase(node_rank);
    return s;
  }
  result->round = round_;
  result->world_size = world_size_;
  result->first_rank = joined_[node_rank].first_rank;
  result->nodes = layout_;
  return JobStatus::success();
}

// ---- store -----------------------------------------------------------------------

JobStatus JobState::set(const std::string& key, const std::string& value) {
  if (JobStatus s = check_key(key); !s.ok()) return s;
  if (value.size() > kMaxValueBytes) return invalid("value larger than ", kMaxValueBytes, " bytes");
  std::lock_guard<std::mutex> l(mu_);
  if (aborted_) return aborted_status_locked();
  auto it = kv_.find(key);
  size_t old = it == kv_.end() ? 0 : it->first.size() + it->second.size();
  size_t add = key.size() + value.size();
  if (kv_bytes_ - old + add > kMaxStoreBytes)
    return {Code::kResourceExhausted, detail::concat("store is full (", kMaxStoreBytes, " bytes)")};
  kv_bytes_ = kv_bytes_ - old + add;
  kv_[key] = value;
  cv_.notify_all();
  return JobStatus::success();
}

JobStatus JobState::get(const std::string& key, int round, std::chrono::milliseconds timeout,
                        const Cancelled& cancelled, std::string* value) {
  if (JobStatus s = check_key(key); !s.ok()) return s;
  std::unique_lock<std::mutex> l(mu_);
  auto deadline = Clock::now() + bounded_timeout(timeout);
  JobStatus s = block(l, cancelled, round, deadline, [&] { return kv_.count(key) > 0; });
  if (s.code() == Code::kDeadlineExceeded)
    return {Code::kDeadlineExceeded, detail::concat("store: key '", key, "' not set within ", timeout.count(), " ms")};
  if (!s.ok()) return s;
  *value = kv_[key];
  return JobStatus::success();
}

JobStatus JobState::wait(const std::vector<std::string>& keys, int round, std::chrono::milliseconds timeout,
                         const Cancelled& cancelled) {
  if (keys.size() > kMaxWaitKeys) return invalid("more than ", kMaxWaitKeys, " keys");
  for (const auto& k : keys)
    if (JobStatus s = check_key(k); !s.ok()) return s;
  std::unique_lock<std::mutex> l(mu_);
  auto all_there = [&] {
    for (const auto& k : keys)
      if (!kv_.count(k)) return false;
    return true;
  };
  auto deadline = Clock::now() + bounded_timeout(timeout);
  JobStatus s = block(l, cancelled, round, deadline, all_there);
  if (s.code() == Code::kDeadlineExceeded) {
    std::string missing;
    int n = 0;
    for (const auto& k : keys) {
      if (kv_.count(k)) continue;
      if (n++ < 8) missing += (missing.empty() ? "'" : ", '") + k + "'";
    }
    if (n > 8) missing += detail::concat(" and ", n - 8, " more");
    return {Code::kDeadlineExceeded, detail::concat("store: keys not set within ", timeout.count(), " ms: ", missing)};
  }
  return s;
}

JobStatus JobState::add(const std::string& key, int64_t delta, int64_t* value) {
  if (JobStatus s = check_key(key); !s.ok()) return s;
  std::lock_guard<std::mutex> l(mu_);
  if (aborted_) return aborted_status_locked();
  int64_t v = 0;
  auto it = kv_.find(key);
  if (it != kv_.end()) {
    size_t pos = 0;
    try {
      v = std::stoll(it->second, &pos);
    } catch (const std::exception&) {
      pos = 0;
    }
    if (pos == 0 || pos != it->second.size())
      return invalid("store: key '", key, "' holds a value that is not an integer");
  }
  if ((delta > 0 && v > INT64_MAX - delta) || (delta < 0 && v < INT64_MIN - delta))
    return {Code::kOutOfRange, detail::concat("store: add on '", key, "' overflows")};
  v += delta;
  std::string s = std::to_string(v);
  size_t old = it == kv_.end() ? 0 : it->first.size() + it->second.size();
  kv_bytes_ = kv_bytes_ - old + key.size() + s.size();
  kv_[key] = std::move(s);
  *value = v;
  cv_.notify_all();
  return JobStatus::success();
}

// ---- barriers --------------------------------------------------------------------

JobStatus JobState::barrier(const std::string& name, int rank, int size, int round, std::chrono::milliseconds timeout,
                            const Cancelled& cancelled) {
  if (JobStatus s = check_key(name); !s.ok()) return s;
  if (size < 1 || size > kMaxRanks) return invalid("barrier size ", size, " out of range");
  if (rank < 0 || rank >= size) return invalid("barrier rank ", rank, " outside [0, ", size, ")");
  std::unique_lock<std::mutex> l(mu_);
  if (aborted_) return aborted_status_locked();
  auto it = barriers_.find(name);
  if (it == barriers_.end()) {
    if (barriers_.size() >= kMaxWaitKeys) return {Code::kResourceExhausted, "too many barriers"};
    it = barriers_.emplace(name, BarrierState{size, 0, {}}).first;
  }
  BarrierState& b = it->second;
  if (b.size != size) return invalid("barrier '", name, "' has ", b.size, " participants, not ", size);
  if (!b.arrived.insert(rank).second) return invalid("barrier '", name, "': rank ", rank, " arrived twice");
  if (static_cast<int>(b.arrived.size()) == b.size) {
    ++b.generation;
    b.arrived.clear();
    cv_.notify_all();
    return JobStatus::success();
  }
  const uint64_t gen = b.generation;
  auto passed = [&] {
    auto i = barriers_.find(name);
    return i != barriers_.end() && i->second.generation != gen;
  };
  auto deadline = Clock::now() + bounded_timeout(timeout);
  JobStatus s = block(l, cancelled, round, deadline, passed);
  if (!s.ok()) {
    auto i = barriers_.find(name);
    std::vector<int> missing;
    if (i != barriers_.end() && i->second.generation == gen) {
      i->second.arrived.erase(rank);  // a timed-out rank must not count in the next attempt
      for (int r = 0; r < i->second.size; ++r)
        if (!i->second.arrived.count(r) && r != rank) missing.push_back(r);
    }
    if (s.code() == Code::kDeadlineExceeded)
      return {Code::kDeadlineExceeded, detail::concat("barrier '", name, "' timed out after ", timeout.count(),
                                                      " ms; missing rank(s) ", join_ints(missing))};
  }
  return s;
}

// ---- liveness --------------------------------------------------------------------

JobStatus JobState::heartbeat(const Heartbeat& beat, HeartbeatAnswer* answer, Clock::time_point now) {
  if (beat.host.size() > kMaxHostBytes) return invalid("host name too long");
  std::lock_guard<std::mutex> l(mu_);
  if (beat.role == Heartbeat::Role::kWorker) {
    if (beat.id < 0 || beat.id >= std::max(world_size_, 1) || (world_size_ == 0))
      return invalid("heartbeat from rank ", beat.id, " outside the world of ", world_size_);
    if (beat.leaving) {
      rank_beats_.erase(beat.id);
    } else if (!aborted_ && !exited_ranks_.count(beat.id)) {  // a beat racing its rank's exit report
      rank_beats_[beat.id] = Beat{beat.node_rank, beat.host, now};
    }
  } else {
    if (beat.id < 0 || beat.id >= opt_.num_nodes) return invalid("heartbeat from unknown node ", beat.id);
    if (beat.leaving) {
      node_beats_.erase(beat.id);
      nodes_left_.insert(beat.id);
    } else {
      node_beats_[beat.id] = Beat{beat.id, beat.host, now};
    }
  }
  answer->round = round_;
  answer->aborted = aborted_;
  return JobStatus::success();
}

bool JobState::check_heartbeats(Clock::time_point now) {
  std::lock_guard<std::mutex> l(mu_);
  return check_heartbeats_locked(now);
}

bool JobState::check_heartbeats_locked(Clock::time_point now) {
  const auto timeout = opt_.heartbeat_timeout;
  auto late = [&](const Beat& b) { return now - b.last > timeout; };
  bool aborted = false;
  for (auto it = node_beats_.begin(); it != node_beats_.end();) {
    if (!late(it->second)) {
      ++it;
      continue;
    }
    RootCause c;
    c.rank = -1;
    c.node_rank = it->first;
    c.host = it->second.host;
    c.reason = detail::concat("the node agent sent no heartbeat for ", timeout.count(),
                              " ms (host down, agent killed or network lost)");
    dead_nodes_.insert(it->first);
    it = node_beats_.erase(it);
    if (abort_locked(round_, c))
      aborted = true;
    else
      spdlog::error("coordinator: {}", describe(c));
  }
  if (aborted_ || !started_) return aborted;
  for (auto& [rank, b] : rank_beats_) {
    if (!late(b)) continue;
    RootCause c;
    c.rank = rank;
    c.node_rank = b.node_rank;
    c.host = b.host;
    c.reason = detail::concat("no heartbeat for ", timeout.count(),
                              " ms (the worker is stopped, hung in a way that blocks its heartbeat "
                              "thread, or cut off)");
    return abort_locked(round_, c);
  }
  return aborted;
}

void JobState::run_monitor() {
  const auto timeout = opt_.heartbeat_timeout;
  const auto slice = std::clamp(timeout / 10, std::chrono::milliseconds(20), std::chrono::milliseconds(500));
  std::unique_lock<std::mutex> l(mu_);
  while (!stopping_) {
    cv_.wait_for(l, slice);
    if (stopping_) break;
    check_heartbeats_locked(Clock::now());
  }
}

// ---- aborts and exits ------------------------------------------------------------

JobStatus JobState::watch(int round, const Cancelled& cancelled, AbortEvent* event) {
  std::unique_lock<std::mutex> l(mu_);
  if (round < 0) round = round_;
  // No deadline: a watch lasts as long as the caller keeps it.
  JobStatus s = block(l, cancelled, round, Clock::now() + kMaxWait, [] { return false; });
  if (s.code() != Code::kAborted) return s;
  event->round = round;
  auto it = causes_.find(round);
  event->has_cause = it != causes_.end();
  if (event->has_cause) event->cause = it->second;
  return s;
}

JobStatus JobState::abort(int round, const RootCause& cause, bool* root) {
  if (JobStatus s = check_cause(cause); !s.ok()) return s;
  std::lock_guard<std::mutex> l(mu_);
  *root = abort_locked(round < 0 ? round_ : round, cause);
  return JobStatus::success();
}

JobStatus JobState::report_exit(int round, const ExitReport& r) {
  if (r.host.size() > kMaxHostBytes || r.log_tail.size() > 64) return invalid("exit report too large");
  std::lock_guard<std::mutex> l(mu_);
  if (round >= 0 && round != round_) return JobStatus::success();  // a straggler of an old round
  if (exited_ranks_.size() < static_cast<size_t>(kMaxRanks)) exited_ranks_.insert(r.rank);
  rank_beats_.erase(r.rank);
  if (r.exit_code == 0 && r.signal == 0) return JobStatus::success();
  if (r.after_stop && !aborted_) return JobStatus::success();  // a consequence, never a cause
  RootCause c;
  c.rank = r.rank;
  c.node_rank = r.node_rank;
  c.host = r.host;
  c.has_exit = true;
  c.exit_code = r.exit_code;
  c.signal = r.signal;
  c.reason = r.signal ? detail::concat("killed by signal ", r.signal, " (", strsignal(r.signal), ")")
                      : detail::concat("exited with code ", r.exit_code);
  c.log_tail = r.log_tail;
  if (!abort_locked(round_, c)) {
    // The worker may have reported its own error first; complete that root cause.
    auto it = causes_.find(round_);
    if (it != causes_.end() && it->second.rank == r.rank && !it->second.has_exit) {
      if (!r.after_stop) {
        it->second.has_exit = true;
        it->second.exit_code = r.exit_code;
        it->second.signal = r.signal;
      }
      if (it->second.log_tail.empty()) it->second.log_tail = r.log_tail;
    }
  }
  return JobStatus::success();
}

JobStatus JobState::node_done(int node_rank, bool success) {
  if (node_rank < 0 || node_rank >= std::max(opt_.num_nodes, 1)) return invalid("unknown node");
  std::lock_guard<std::mutex> l(mu_);
  if (success) nodes_done_.insert(node_rank);
  cv_.notify_all();
  return JobStatus::success();
}

JobSnapshot JobState::snapshot(int round) const {
  std::lock_guard<std::mutex> l(mu_);
  if (round < 0) round = round_;
  JobSnapshot s;
  s.round = round_;
  s.started = started_;
  s.joined = static_cast<int>(joined_.size());
  s.aborted = round != round_ || aborted_;
  auto it = causes_.find(round);
  s.has_cause = it != causes_.end();
  if (s.has_cause) s.cause = it->second;
  s.nodes_done = static_cast<int>(nodes_done_.size());
  s.num_nodes = opt_.num_nodes;
  s.nodes_left = static_cast<int>(nodes_left_.size());
  return s;
}

}  // namespace tessera::launcher
