// JobState: the state machine of one job, as the coordinator serves it, with
// no gRPC in it (launcher/coordinator.cc exposes it as the gRPC service).
//
// It holds the rendezvous rounds (join, layout, advancing to a new round),
// the key-value store with blocking waits, named reusable barriers, the
// heartbeat deadlines of workers and node agents, and the root cause of each
// aborted round. A job runs in rounds 0, 1, ...; a new round starts when all
// nodes join it after the previous one was aborted, and clears the store,
// barriers and worker liveness.
//
// Errors are values (JobStatus, LevelDB style): no method throws for a bad
// request or a failed wait, so a caller can map every outcome to its own
// error type. Methods may still throw std::bad_alloc.
//
// Threads: every method is thread-safe. All state is under one mutex; one
// condition variable is notified on every change (key set, barrier passed,
// join, abort, round change, shutdown). Blocking methods (join, get, wait,
// barrier, watch) sleep on it in slices of at most 200 ms, so they also
// notice their `cancelled` callback (polled, may be empty), and return at
// the deadline. run_monitor() is the liveness loop; the owner runs it on a
// thread of its own. shutdown() wakes every blocked call (Unavailable) and
// ends run_monitor(); it is idempotent and the object stays usable for
// non-blocking calls.
//
// Rounds in calls: `round` is the caller's round, or -1 for none (a node
// agent between rounds). A blocking call carrying round r ends with Aborted
// when round r is aborted or a newer round begins; admit() tells a call from
// an older round (FailedPrecondition) before it touches the state.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace tessera::launcher {

// Bounds on what one request may carry.
inline constexpr size_t kMaxKeyBytes = 1024;
inline constexpr size_t kMaxValueBytes = 1 << 20;
inline constexpr size_t kMaxStoreBytes = 256u << 20;
inline constexpr size_t kMaxWaitKeys = 16384;
inline constexpr size_t kMaxHostBytes = 255;
inline constexpr size_t kMaxReasonBytes = 64 << 10;  // RootCause::reason
inline constexpr size_t kMaxLogTailLines = 64;       // RootCause::log_tail
inline constexpr int kMaxRanks = 1 << 16;
inline constexpr std::chrono::milliseconds kMaxWait{24LL * 3600 * 1000};

// Outcome of a call; the codes are the subset of gRPC's that the coordinator
// answers with, so the service maps them one to one.
class JobStatus {
 public:
  enum class Code {
    kOk,
    kInvalidArgument,     // a bad request (bounds, ranges, wrong barrier size)
    kFailedPrecondition,  // not now: stale round, round still running, no rendezvous
    kAlreadyExists,       // a node joined the same round twice
    kResourceExhausted,   // store or barrier table full
    kOutOfRange,          // an add that overflows
    kDeadlineExceeded,    // a wait timed out; the message names what is missing
    kAborted,             // the round was aborted; the message has the root cause
    kUnavailable,         // shutdown() was called
    kCancelled,           // the caller's `cancelled` returned true
  };
  JobStatus() = default;
  JobStatus(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  static JobStatus success() { return {}; }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

// Why a round was aborted. rank is -1 when the cause is a node, not a worker.
struct RootCause {
  int rank = -1;
  int node_rank = -1;
  std::string host;
  bool has_exit = false;  // exit_code or signal are meaningful
  int exit_code = 0;
  int signal = 0;
  std::string reason;
  std::vector<std::string> log_tail;
};

struct NodeInfo {
  int node_rank = 0;
  std::string host;
  int nproc = 0;
  int first_rank = 0;  // global rank of this node's local rank 0
};

struct JoinResult {
  int round = 0;
  int world_size = 0;
  int first_rank = 0;
  std::vector<NodeInfo> nodes;  // by node rank
};

// A node agent's report of one worker's exit.
struct ExitReport {
  int rank = 0;
  int node_rank = 0;
  std::string host;
  int exit_code = 0;
  int signal = 0;  // non-zero: killed by this signal
  std::vector<std::string> log_tail;
  bool after_stop = false;  // the agent was already stopping its workers
};

struct Heartbeat {
  enum class Role { kWorker, kNode };
  Role role = Role::kWorker;
  int id = 0;  // rank for a worker, node rank for a node agent
  int node_rank = 0;
  std::string host;
  bool leaving = false;  // the last beat: stop watching this participant
};

struct HeartbeatAnswer {
  int round = 0;
  bool aborted = false;
};

struct JobSnapshot {
  int round = 0;
  bool started = false;  // every node of the round joined
  int joined = 0;        // nodes that joined the current round so far
  bool aborted = false;  // the asked round is aborted or over
  bool has_cause = false;
  RootCause cause;  // of the asked round, when has_cause
  int nodes_done = 0;
  int num_nodes = 0;
  int nodes_left = 0;
};

// An abort pushed to a watcher.
struct AbortEvent {
  int round = 0;
  bool has_cause = false;
  RootCause cause;
};

struct JobStateOptions {
  // Nodes per rendezvous round; 0: no rendezvous (mpirun mode, world_size set).
  int num_nodes = 1;
  // Known world size (mpirun mode); 0: set by join.
  int world_size = 0;
  std::chrono::milliseconds heartbeat_timeout{10000};
};

class JobState {
 public:
  using Clock = std::chrono::steady_clock;
  // Polled while blocked; true ends the wait with Cancelled. May be empty.
  using Cancelled = std::function<bool()>;

  // Throws InvalidArgument on inconsistent options.
  explicit JobState(JobStateOptions options);
  JobState(const JobState&) = delete;
  JobState& operator=(const JobState&) = delete;

  const JobStateOptions& options() const { return opt_; }

  // FailedPrecondition when `round` (>= 0) is not the current round.
  JobStatus admit(int round) const;

  // Rendezvous: registers node `node_rank` with `nproc` workers for `round`
  // and blocks until all nodes joined; `round` may be the current one or,
  // after an abort, the next (which starts it). On a timeout the node is
  // withdrawn and the message names the missing node ranks.
  JobStatus join(int node_rank, const std::string& host, int nproc, int round, std::chrono::milliseconds timeout,
                 const Cancelled& cancelled, JoinResult* result);

  // Key-value store of the current round.
  JobStatus set(const std::string& key, const std::string& value);
  JobStatus get(const std::string& key, int round, std::chrono::milliseconds timeout, const Cancelled& cancelled,
                std::string* value);
  JobStatus wait(const std::vector<std::string>& keys, int round, std::chrono::milliseconds timeout,
                 const Cancelled& cancelled);
  // Atomic add on a decimal integer value (a missing key is 0).
  JobStatus add(const std::string& key, int64_t delta, int64_t* value);

  // Named barrier over `size` ranks, reusable (generations). A rank that
  // times out is withdrawn and the message names the missing ranks.
  JobStatus barrier(const std::string& name, int rank, int size, int round, std::chrono::milliseconds timeout,
                    const Cancelled& cancelled);

  // Records a beat at `now`.
  JobStatus heartbeat(const Heartbeat& beat, HeartbeatAnswer* answer, Clock::time_point now = Clock::now());
  // One liveness sweep: a node silent for longer than the heartbeat timeout
  // is marked dead (no new round can start) and aborts the round; so does a
  // silent worker of a started round. Returns true when it aborted a round.
  bool check_heartbeats(Clock::time_point now = Clock::now());
  // Calls check_heartbeats every timeout/10 (20-500 ms) until shutdown().
  void run_monitor();

  // Blocks until `round` (-1: the current one) is aborted: Aborted with the
  // event filled in; or Unavailable/Cancelled. No deadline.
  JobStatus watch(int round, const Cancelled& cancelled, AbortEvent* event);

  // Aborts `round` (-1: the current one). *root is true when `cause` became
  // the root cause (first abort of the current round).
  JobStatus abort(int round, const RootCause& cause, bool* root);
  // A worker's exit: non-zero aborts the round with it as the root cause
  // (unless it is a consequence of stopping), and completes a root cause the
  // same worker reported itself. Reports of an older round are ignored.
  JobStatus report_exit(int round, const ExitReport& report);
  JobStatus node_done(int node_rank, bool success);
  // State of `round` (-1: the current one).
  JobSnapshot snapshot(int round) const;

  // Wakes every blocked call (Unavailable) and ends run_monitor(). Idempotent.
  void shutdown();

 private:
  struct Beat {
    int node_rank;
    std::string host;
    Clock::time_point last;
  };
  struct BarrierState {
    int size;
    uint64_t generation;
    std::set<int> arrived;
  };

  template <typename Pred>
  JobStatus block(std::unique_lock<std::mutex>& l, const Cancelled& cancelled, int round, Clock::time_point deadline,
                  Pred pred);
  JobStatus aborted_status_locked(int round = -1) const;
  bool abort_locked(int round, const RootCause& cause);
  void advance_round_locked(int round);
  bool check_heartbeats_locked(Clock::time_point now);

  const JobStateOptions opt_;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // any state change below
  bool stopping_ = false;
  int round_ = 0;
  bool started_ = false;
  bool aborted_ = false;
  int world_size_ = 0;
  std::map<int, NodeInfo> joined_;
  std::vector<NodeInfo> layout_;
  std::map<int, RootCause> causes_;  // by round
  std::unordered_map<std::string, std::string> kv_;
  size_t kv_bytes_ = 0;
  std::map<std::string, BarrierState> barriers_;
  std::map<int, Beat> rank_beats_;
  std::set<int> exited_ranks_;  // of the current round, as reported by the agents
  std::map<int, Beat> node_beats_;
  std::set<int> nodes_done_;  // finished the current round successfully
  std::set<int> nodes_left_;
  std::set<int> dead_nodes_;
};

}  // namespace tessera::launcher
