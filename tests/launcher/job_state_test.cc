// The coordinator's state machine (launcher/job_state.h) alone, without gRPC:
// store waits and timeouts, rendezvous and rounds, barriers, heartbeat
// expiry, abort propagation and shutdown. Each failure is checked by its
// code and message, so a wait that merely times out cannot pass for a
// rejection.
#include "launcher/job_state.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <thread>

#include "runtime/error.h"

using namespace tessera::launcher;
using namespace std::chrono_literals;
using Code = JobStatus::Code;
using Clock = JobState::Clock;

namespace {

JobStateOptions mpirun_mode(int world, std::chrono::milliseconds hb = 10s) {
  JobStateOptions o;
  o.num_nodes = 0;
  o.world_size = world;
  o.heartbeat_timeout = hb;
  return o;
}

JobStateOptions nodes(int n, std::chrono::milliseconds hb = 10s) {
  JobStateOptions o;
  o.num_nodes = n;
  o.heartbeat_timeout = hb;
  return o;
}

const JobState::Cancelled kNever;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Waits (bounded) until node_rank's join is registered.
void wait_joined(const JobState& st, int count) {
  auto until = Clock::now() + 20s;
  while (st.snapshot(-1).joined < count && Clock::now() < until) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(st.snapshot(-1).joined, count) << "the first join never registered";
}

RootCause cause_of(int rank, const std::string& reason) {
  RootCause c;
  c.rank = rank;
  c.node_rank = 0;
  c.host = "h";
  c.reason = reason;
  return c;
}

}  // namespace

TEST(JobStateStore, GetOfAMissingKeyTimesOutNamingIt) {
  JobState st(mpirun_mode(1));
  std::string v;
  auto t0 = Clock::now();
  JobStatus s = st.get("nope", 0, 300ms, kNever, &v);
  auto dt = Clock::now() - t0;
  EXPECT_EQ(s.code(), Code::kDeadlineExceeded) << s.message();
  EXPECT_EQ(s.message(), "store: key 'nope' not set within 300 ms");
  EXPECT_GE(dt, 300ms);
  EXPECT_LT(dt, 10s);
}

TEST(JobStateStore, WaitTimeoutNamesOnlyTheMissingKeys) {
  JobState st(mpirun_mode(1));
  ASSERT_TRUE(st.set("k1", "v").ok());
  JobStatus s = st.wait({"k1", "k2", "k3"}, 0, 100ms, kNever);
  EXPECT_EQ(s.code(), Code::kDeadlineExceeded);
  EXPECT_EQ(s.message(), "store: keys not set within 100 ms: 'k2', 'k3'");
  ASSERT_TRUE(st.set("k2", "v").ok());
  ASSERT_TRUE(st.set("k3", "v").ok());
  EXPECT_TRUE(st.wait({"k1", "k2", "k3"}, 0, 100ms, kNever).ok());
}

TEST(JobStateStore, GetBlocksUntilTheKeyIsSet) {
  JobState st(mpirun_mode(2));
  std::atomic<bool> setting{false};
  auto getter = std::async(std::launch::async, [&] {
    std::string v;
    JobStatus s = st.get("b", 0, 30s, kNever, &v);
    EXPECT_TRUE(setting.load()) << "get returned before anyone set the key";
    return std::make_pair(s, v);
  });
  std::this_thread::sleep_for(20ms);  // usually lets the getter block first; correct either way
  setting = true;
  ASSERT_TRUE(st.set("b", std::string("4\0002", 3)).ok());
  auto [s, v] = getter.get();
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(v, std::string("4\0002", 3));
}

TEST(JobStateStore, AddIsAtomicAndChecked) {
  JobState st(mpirun_mode(4));
  constexpr int kThreads = 4, kAdds = 500;
  std::vector<std::vector<int64_t>> seen(kThreads);
  std::vector<std::thread> ts;
  ts.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < kAdds; ++i) {
        int64_t v = 0;
        ASSERT_TRUE(st.add("ctr", 1, &v).ok());
        seen[static_cast<size_t>(t)].push_back(v);
      }
    });
  for (auto& t : ts) t.join();
  std::vector<int64_t> all;
  for (auto& v : seen) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i], static_cast<int64_t>(i + 1));
  std::string text;
  ASSERT_TRUE(st.get("ctr", 0, 0ms, kNever, &text).ok());
  EXPECT_EQ(text, std::to_string(kThreads * kAdds));

  int64_t v = 0;
  ASSERT_TRUE(st.set("text", "12a").ok());
  EXPECT_EQ(st.add("text", 1, &v).code(), Code::kInvalidArgument);
  ASSERT_TRUE(st.add("big", INT64_MAX, &v).ok());
  JobStatus over = st.add("big", 1, &v);
  EXPECT_EQ(over.code(), Code::kOutOfRange);
  EXPECT_EQ(over.message(), "store: add on 'big' overflows");
}

TEST(JobStateStore, BoundsAreInvalidArguments) {
  JobState st(mpirun_mode(1));
  EXPECT_EQ(st.set("", "v").code(), Code::kInvalidArgument);
  EXPECT_EQ(st.set(std::string(kMaxKeyBytes + 1, 'k'), "v").code(), Code::kInvalidArgument);
  EXPECT_EQ(st.set("k", std::string(kMaxValueBytes + 1, 'v')).code(), Code::kInvalidArgument);
  EXPECT_TRUE(st.set(std::string(kMaxKeyBytes, 'k'), std::string(kMaxValueBytes, 'v')).ok());
  std::vector<std::string> many(kMaxWaitKeys + 1, "k");
  EXPECT_EQ(st.wait(many, 0, 0ms, kNever).code(), Code::kInvalidArgument);
}

TEST(JobStateRendezvous, AssignsRanksInNodeOrderOnceAllJoined) {
  JobState st(nodes(3));
  std::vector<std::future<std::pair<JobStatus, JoinResult>>> f(3);
  for (int k : {2, 0, 1})  // out of order
    f[static_cast<size_t>(k)] = std::async(std::launch::async, [&st, k] {
      JoinResult r;
      JobStatus s = st.join(k, "host" + std::to_string(k), k + 2, 0, 30s, kNever, &r);
      return std::make_pair(s, r);
    });
  const int first[] = {0, 2, 5};  // nproc 2, 3, 4
  for (int k = 0; k < 3; ++k) {
    auto [s, r] = f[static_cast<size_t>(k)].get();
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(r.round, 0);
    EXPECT_EQ(r.world_size, 9);
    ASSERT_EQ(r.nodes.size(), 3u);
    for (int j = 0; j < 3; ++j) {
      EXPECT_EQ(r.nodes[static_cast<size_t>(j)].node_rank, j);
      EXPECT_EQ(r.nodes[static_cast<size_t>(j)].host, "host" + std::to_string(j));
      EXPECT_EQ(r.nodes[static_cast<size_t>(j)].first_rank, first[j]);
    }
    EXPECT_EQ(r.first_rank, first[k]);
  }
  EXPECT_TRUE(st.snapshot(-1).started);
}

TEST(JobStateRendezvous, TimeoutNamesMissingNodesAndWithdrawsTheNode) {
  JobState st(nodes(3));
  JoinResult r;
  JobStatus s = st.join(1, "h", 1, 0, 100ms, kNever, &r);
  EXPECT_EQ(s.code(), Code::kDeadlineExceeded);
  EXPECT_EQ(s.message(), "rendezvous timed out: 1 of 3 nodes joined round 0; missing node rank(s) 0,2");
  EXPECT_EQ(st.snapshot(-1).joined, 0) << "a node that gave up still counts";
}

TEST(JobStateRendezvous, DuplicateJoinIsRejectedAtOnceNotTimedOut) {
  JobState st(nodes(2));
  auto first = std::async(std::launch::async, [&] {
    JoinResult r;
    return st.join(0, "a", 1, 0, 30s, kNever, &r);
  });
  wait_joined(st, 1);
  JoinResult r;
  auto t0 = Clock::now();
  JobStatus dup = st.join(0, "b", 1, 0, 30s, kNever, &r);
  EXPECT_LT(Clock::now() - t0, 10s) << "the duplicate waited instead of being rejected";
  EXPECT_EQ(dup.code(), Code::kAlreadyExists) << dup.message();
  EXPECT_EQ(dup.message(), "node 0 already joined round 0 (host a)");
  JobStatus out = st.join(2, "c", 1, 0, 30s, kNever, &r);
  EXPECT_EQ(out.code(), Code::kInvalidArgument);
  EXPECT_EQ(out.message(), "node_rank 2 is outside [0, 2)");
  ASSERT_TRUE(st.join(1, "d", 1, 0, 30s, kNever, &r).ok());
  EXPECT_TRUE(first.get().ok());
  EXPECT_EQ(r.world_size, 2);
}

TEST(JobStateRendezvous, MpirunModeHasNoRendezvous) {
  JobState st(mpirun_mode(2));
  JoinResult r;
  EXPECT_EQ(st.join(0, "h", 1, 0, 1s, kNever, &r).code(), Code::kFailedPrecondition);
  EXPECT_THROW(JobState(mpirun_mode(0)), tessera::InvalidArgument);
}

TEST(JobStateRounds, NewRoundClearsTheStoreAndStaleCallsAreRefused) {
  JobState st(nodes(1));
  JoinResult r;
  ASSERT_TRUE(st.join(0, "a", 2, 0, 1s, kNever, &r).ok());
  ASSERT_TRUE(st.set("endpoint", "old").ok());
  JobStatus running = st.join(0, "a", 2, 1, 1s, kNever, &r);
  EXPECT_EQ(running.code(), Code::kFailedPrecondition);
  EXPECT_EQ(running.message(), "round 0 is still running");
  bool root = false;
  ASSERT_TRUE(st.abort(0, cause_of(1, "boom"), &root).ok());
  EXPECT_TRUE(root);
  EXPECT_EQ(st.join(0, "a", 2, 3, 1s, kNever, &r).code(), Code::kInvalidArgument);  // skips round 1
  ASSERT_TRUE(st.join(0, "a", 2, 1, 1s, kNever, &r).ok());
  EXPECT_EQ(r.round, 1);
  JobStatus stale = st.admit(0);
  EXPECT_EQ(stale.code(), Code::kFailedPrecondition);
  EXPECT_EQ(stale.message(), "stale call from round 0 (the job is in round 1)");
  EXPECT_TRUE(st.admit(1).ok());
  std::string v;
  EXPECT_EQ(st.get("endpoint", 1, 0ms, kNever, &v).code(), Code::kDeadlineExceeded) << "the store was not cleared";
  JobSnapshot now = st.snapshot(-1);
  EXPECT_EQ(now.round, 1);
  EXPECT_FALSE(now.aborted);
  JobSnapshot old = st.snapshot(0);
  EXPECT_TRUE(old.aborted);
  ASSERT_TRUE(old.has_cause);
  EXPECT_EQ(old.cause.reason, "boom");
  // A blocked call of an older round is aborted, not left waiting.
  EXPECT_EQ(st.get("endpoint", 0, 10s, kNever, &v).code(), Code::kAborted);
}

TEST(JobStateBarrier, CompletesWhenAllArriveAndIsReusable) {
  constexpr int kRanks = 5;
  JobState st(mpirun_mode(kRanks));
  std::atomic<int> arrived{0};
  std::atomic<int> early{0};
  std::vector<std::thread> ts;
  ts.reserve(kRanks);
  for (int r = 0; r < kRanks; ++r)
    ts.emplace_back([&, r] {
      for (int gen = 0; gen < 3; ++gen) {
        arrived++;
        JobStatus s = st.barrier("b", r, kRanks, 0, 30s, kNever);
        EXPECT_TRUE(s.ok()) << s.message();
        if (arrived.load() < kRanks * (gen + 1)) early++;
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(early.load(), 0) << "a rank passed before the last arrived";
}

TEST(JobStateBarrier, FailsOnAbortWithTheRootCause) {
  JobState st(mpirun_mode(3));
  auto waiter = [&](int rank) {
    return std::async(std::launch::async, [&st, rank] { return st.barrier("b", rank, 3, 0, 60s, kNever); });
  };
  auto w0 = waiter(0), w1 = waiter(1);
  std::this_thread::sleep_for(20ms);  // usually both wait first; an abort before also fails them
  bool root = false;
  ASSERT_TRUE(st.abort(-1, cause_of(2, "fatal error: out of memory"), &root).ok());
  EXPECT_TRUE(root);
  for (auto* w : {&w0, &w1}) {
    ASSERT_EQ(w->wait_for(20s), std::future_status::ready) << "an abort did not wake the barrier";
    JobStatus s = w->get();
    EXPECT_EQ(s.code(), Code::kAborted);
    EXPECT_EQ(s.message(), "job aborted (round 0): rank 2 on node 0 (h): fatal error: out of memory");
  }
  EXPECT_EQ(st.barrier("b", 2, 3, 0, 1s, kNever).code(), Code::kAborted);
}

TEST(JobStateBarrier, TimeoutNamesMissingRanksAndWithdrawsTheRank) {
  JobState st(mpirun_mode(3));
  JobStatus s = st.barrier("b", 0, 3, 0, 100ms, kNever);
  EXPECT_EQ(s.code(), Code::kDeadlineExceeded);
  EXPECT_EQ(s.message(), "barrier 'b' timed out after 100 ms; missing rank(s) 1,2");
  // Rank 0 left: ranks 1 and 2 alone must not pass.
  auto r1 = std::async(std::launch::async, [&] { return st.barrier("b", 1, 3, 0, 30s, kNever); });
  JobStatus r2 = st.barrier("b", 2, 3, 0, 200ms, kNever);
  EXPECT_EQ(r2.code(), Code::kDeadlineExceeded);
  EXPECT_TRUE(contains(r2.message(), "missing rank(s) 0")) << r2.message();
  EXPECT_EQ(r1.wait_for(0ms), std::future_status::timeout);
  auto r2b = std::async(std::launch::async, [&] { return st.barrier("b", 2, 3, 0, 30s, kNever); });
  ASSERT_TRUE(st.barrier("b", 0, 3, 0, 30s, kNever).ok());
  EXPECT_TRUE(r1.get().ok());
  EXPECT_TRUE(r2b.get().ok());
  EXPECT_EQ(st.barrier("b", 0, 4, 0, 0ms, kNever).message(), "barrier 'b' has 3 participants, not 4");
  EXPECT_EQ(st.barrier("b", 3, 3, 0, 0ms, kNever).code(), Code::kInvalidArgument);
}

TEST(JobStateLiveness, HeartbeatExpiryMarksTheRankDead) {
  JobState st(mpirun_mode(2, 1000ms));
  const auto t0 = Clock::now();
  Heartbeat b;
  b.role = Heartbeat::Role::kWorker;
  b.id = 1;
  b.host = "hostB";
  HeartbeatAnswer a;
  ASSERT_TRUE(st.heartbeat(b, &a, t0).ok());
  EXPECT_FALSE(a.aborted);
  EXPECT_FALSE(st.check_heartbeats(t0 + 999ms));
  EXPECT_FALSE(st.snapshot(-1).aborted);
  EXPECT_TRUE(st.check_heartbeats(t0 + 1001ms));
  JobSnapshot s = st.snapshot(-1);
  EXPECT_TRUE(s.aborted);
  ASSERT_TRUE(s.has_cause);
  EXPECT_EQ(s.cause.rank, 1);
  EXPECT_EQ(s.cause.host, "hostB");
  EXPECT_TRUE(contains(s.cause.reason, "no heartbeat for 1000 ms")) << s.cause.reason;
  ASSERT_TRUE(st.heartbeat(b, &a, t0 + 1002ms).ok());
  EXPECT_TRUE(a.aborted);
  EXPECT_EQ(st.set("x", "1").code(), Code::kAborted);
}

TEST(JobStateLiveness, LeavingOrExitedWorkersAreNotLost) {
  JobState st(mpirun_mode(2, 100ms));
  const auto t0 = Clock::now();
  Heartbeat b;
  b.id = 0;
  HeartbeatAnswer a;
  ASSERT_TRUE(st.heartbeat(b, &a, t0).ok());
  b.leaving = true;
  ASSERT_TRUE(st.heartbeat(b, &a, t0).ok());
  b.id = 1;
  b.leaving = false;
  ASSERT_TRUE(st.heartbeat(b, &a, t0).ok());
  ExitReport done;
  done.rank = 1;
  ASSERT_TRUE(st.report_exit(0, done).ok());
  ASSERT_TRUE(st.heartbeat(b, &a, t0).ok());  // a beat racing the exit report
  EXPECT_FALSE(st.check_heartbeats(t0 + 1h));
  EXPECT_FALSE(st.snapshot(-1).aborted);
  b.id = 2;
  EXPECT_EQ(st.heartbeat(b, &a, t0).code(), Code::kInvalidArgument);
}

TEST(JobStateLiveness, ASilentNodeAbortsAndBlocksTheNextRound) {
  JobState st(nodes(1, 500ms));
  JoinResult r;
  ASSERT_TRUE(st.join(0, "a", 1, 0, 1s, kNever, &r).ok());
  EXPECT_TRUE(st.check_heartbeats(Clock::now() + 1h));
  JobSnapshot s = st.snapshot(-1);
  ASSERT_TRUE(s.has_cause);
  EXPECT_EQ(s.cause.rank, -1);
  EXPECT_EQ(s.cause.node_rank, 0);
  EXPECT_TRUE(contains(s.cause.reason, "node agent sent no heartbeat for 500 ms")) << s.cause.reason;
  JobStatus next = st.join(0, "a", 1, 1, 1s, kNever, &r);
  EXPECT_EQ(next.code(), Code::kFailedPrecondition);
  EXPECT_EQ(next.message(), "node(s) 0 stopped sending heartbeats; no new round can start");
}

TEST(JobStateLiveness, MonitorAbortsAndTheWatcherHearsTheRootCause) {
  JobState st(mpirun_mode(2, 200ms));
  std::thread monitor([&] { st.run_monitor(); });
  Heartbeat b;
  b.id = 1;
  b.node_rank = 0;
  b.host = "hostB";
  HeartbeatAnswer a;
  ASSERT_TRUE(st.heartbeat(b, &a).ok());  // rank 1 beats once, then goes silent
  auto watcher = std::async(std::launch::async, [&] {
    AbortEvent e;
    JobStatus s = st.watch(-1, kNever, &e);
    return std::make_pair(s, e);
  });
  ASSERT_EQ(watcher.wait_for(30s), std::future_status::ready) << "the monitor never aborted";
  auto [s, e] = watcher.get();
  EXPECT_EQ(s.code(), Code::kAborted);
  EXPECT_EQ(e.round, 0);
  ASSERT_TRUE(e.has_cause);
  EXPECT_EQ(e.cause.rank, 1);
  EXPECT_EQ(e.cause.host, "hostB");
  st.shutdown();
  monitor.join();
}

TEST(JobStateAbort, FirstAbortIsTheRootCauseAndTheExitReportCompletesIt) {
  JobState st(mpirun_mode(4));
  auto blocked = std::async(std::launch::async, [&] {
    std::string v;
    return st.get("never", 0, 60s, kNever, &v);
  });
  bool root = false;
  ASSERT_TRUE(st.abort(-1, cause_of(2, "fatal error: boom"), &root).ok());
  EXPECT_TRUE(root);
  ASSERT_TRUE(st.abort(-1, cause_of(3, "later"), &root).ok());
  EXPECT_FALSE(root);
  ASSERT_EQ(blocked.wait_for(20s), std::future_status::ready);
  JobStatus g = blocked.get();
  EXPECT_EQ(g.code(), Code::kAborted);
  EXPECT_TRUE(contains(g.message(), "rank 2 on node 0 (h): fatal error: boom")) << g.message();

  ExitReport rep;
  rep.rank = 2;
  rep.exit_code = 7;
  rep.log_tail = {"last words"};
  ASSERT_TRUE(st.report_exit(0, rep).ok());
  ExitReport other;  // another rank's exit after the abort does not replace the cause
  other.rank = 3;
  other.signal = 9;
  ASSERT_TRUE(st.report_exit(0, other).ok());
  JobSnapshot s = st.snapshot(-1);
  ASSERT_TRUE(s.has_cause);
  EXPECT_EQ(s.cause.rank, 2);
  EXPECT_EQ(s.cause.reason, "fatal error: boom");
  EXPECT_TRUE(s.cause.has_exit);
  EXPECT_EQ(s.cause.exit_code, 7);
  EXPECT_EQ(s.cause.log_tail, std::vector<std::string>{"last words"});

  RootCause huge = cause_of(0, std::string(64 * 1024 + 1, 'x'));
  EXPECT_EQ(st.abort(-1, huge, &root).code(), Code::kInvalidArgument);
}

TEST(JobStateAbort, ANonZeroExitIsTheRootCauseAndStopsAreNot) {
  JobState st(mpirun_mode(2));
  ExitReport stopped;
  stopped.rank = 0;
  stopped.signal = 15;
  stopped.after_stop = true;
  ASSERT_TRUE(st.report_exit(0, stopped).ok());
  EXPECT_FALSE(st.snapshot(-1).aborted) << "an exit caused by stopping became a root cause";
  ExitReport failed;
  failed.rank = 1;
  failed.node_rank = 0;
  failed.host = "h";
  failed.signal = 9;
  ASSERT_TRUE(st.report_exit(0, failed).ok());
  JobSnapshot s = st.snapshot(-1);
  EXPECT_TRUE(s.aborted);
  EXPECT_EQ(s.cause.rank, 1);
  EXPECT_TRUE(s.cause.has_exit);
  EXPECT_EQ(s.cause.signal, 9);
  EXPECT_EQ(s.cause.reason, "killed by signal 9 (Killed)");
}

TEST(JobStateShutdown, WakesBlockedCallsAndCancelIsHeard) {
  JobState st(mpirun_mode(2));
  std::atomic<bool> cancel{false};
  auto cancelled = std::async(std::launch::async, [&] {
    std::string v;
    return st.get(
        "k", 0, 60s, [&] { return cancel.load(); }, &v);
  });
  cancel = true;
  ASSERT_EQ(cancelled.wait_for(20s), std::future_status::ready);
  EXPECT_EQ(cancelled.get().code(), Code::kCancelled);

  auto blocked = std::async(std::launch::async, [&] { return st.barrier("b", 0, 2, 0, 60s, kNever); });
  auto watching = std::async(std::launch::async, [&] {
    AbortEvent e;
    return st.watch(-1, kNever, &e);
  });
  std::this_thread::sleep_for(20ms);
  st.shutdown();
  for (auto* f : {&blocked, &watching}) {
    ASSERT_EQ(f->wait_for(20s), std::future_status::ready) << "shutdown left a call blocked";
    EXPECT_EQ(f->get().code(), Code::kUnavailable);
  }
}
