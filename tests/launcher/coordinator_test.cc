// The coordinator in-process: rendezvous, store and barrier semantics, token
// refusal, bounds, malformed requests, heartbeat aborts and rounds.
#include "launcher/coordinator.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <set>
#include <sstream>
#include <thread>
#include <typeinfo>

#include "launcher/client.h"
#include "runtime/error.h"
#include "tests/test_timeouts.h"

using namespace tessera;
using namespace tessera::launcher;
using namespace std::chrono_literals;
namespace pb = tessera::launcher::proto;

namespace {

struct Job {
  explicit Job(int nodes, int world = 0, std::chrono::milliseconds hb = 10s) {
    CoordinatorOptions o;
    o.token = "secret-token";
    o.num_nodes = nodes;
    o.world_size = world;
    o.heartbeat_timeout = hb;
    coord = std::make_unique<Coordinator>(o);
    address = "127.0.0.1:" + std::to_string(coord->port());
  }
  std::shared_ptr<CoordinatorClient> client(const std::string& token = "secret-token") const {
    return std::make_shared<CoordinatorClient>(address, token);
  }
  std::unique_ptr<Coordinator> coord;
  std::string address;
};

}  // namespace

class Rendezvous : public ::testing::TestWithParam<int> {};

TEST_P(Rendezvous, AssignsRanksOnceAllNodesJoined) {
  const int m = GetParam();
  Job job(m);
  // Node k brings k+1 workers, so every node's first rank is a triangular number.
  std::vector<std::future<pb::JoinReply>> replies;
  std::atomic<int> returned{0};
  for (int k = m - 1; k >= 0; --k) {  // join out of order
    replies.push_back(std::async(std::launch::async, [&, k] {
      auto r = job.client()->join(k, "host" + std::to_string(k), k + 1, 0, 20s);
      returned++;
      return r;
    }));
    if (k == 1) {
      std::this_thread::sleep_for(50ms);
      EXPECT_EQ(returned.load(), 0) << "a node returned before every node joined";
    }
  }
  const int world = m * (m + 1) / 2;
  for (int i = 0; i < m; ++i) {
    int k = m - 1 - i;
    auto r = replies[static_cast<size_t>(i)].get();
    EXPECT_EQ(r.world_size(), world);
    EXPECT_EQ(r.first_rank(), k * (k + 1) / 2);
    ASSERT_EQ(r.nodes_size(), m);
    for (int j = 0; j < m; ++j) {
      EXPECT_EQ(r.nodes(j).node_rank(), j);
      EXPECT_EQ(r.nodes(j).host(), "host" + std::to_string(j));
      EXPECT_EQ(r.nodes(j).nproc(), j + 1);
      EXPECT_EQ(r.nodes(j).first_rank(), j * (j + 1) / 2);
    }
  }
}
INSTANTIATE_TEST_SUITE_P(Nodes, Rendezvous, ::testing::Values(1, 2, 3, 5, 8));

TEST(Rendezvous, TimesOutNamingMissingNodes) {
  Job job(3);
  // Long enough for the first connection on a loaded machine (the timeout also
  // covers connecting), short enough to keep the test quick.
  try {
    job.client()->join(1, "h", 1, 0, 1500ms);
    FAIL() << "join returned without the other nodes";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("missing node rank(s) 0,2"), std::string::npos) << e.what();
  }
}

// A raw Join with the job token, so a test sees the gRPC status itself.
grpc::Status raw_join(const std::string& address, int node, const std::string& host, std::chrono::milliseconds t,
                      pb::JoinReply* rep) {
  auto stub = pb::Coordinator::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.AddMetadata(kTokenKey, "secret-token");
  ctx.set_deadline(std::chrono::system_clock::now() + t + 2s);
  pb::JoinRequest req;
  req.set_node_rank(node);
  req.set_host(host);
  req.set_nproc(1);
  req.set_round(0);
  req.set_timeout_ms(t.count());
  return stub->Join(&ctx, req, rep);
}

// Two joins for node 0 race: exactly one is refused at once with
// ALREADY_EXISTS naming the other's host (not by timing out); the other
// completes the rendezvous with node 1. A third, through the client, is an
// Error that is neither a timeout nor an abort, and comes back at once.
TEST(Rendezvous, RejectsDuplicateAndOutOfRangeNodes) {
  Job job(2);
  const auto t = test_time::scaled(5s);
  pb::JoinReply ra, rb;
  auto a = std::async(std::launch::async, [&] { return raw_join(job.address, 0, "a", t, &ra); });
  auto b = std::async(std::launch::async, [&] { return raw_join(job.address, 0, "b", t, &rb); });
  // Wait (bounded) for the refused one: it must not wait for the rendezvous.
  const auto t0 = std::chrono::steady_clock::now();
  std::future<grpc::Status>* refused = nullptr;
  std::future<grpc::Status>* waiting = nullptr;
  while (!refused && std::chrono::steady_clock::now() - t0 < t) {
    if (a.wait_for(5ms) == std::future_status::ready)
      refused = &a, waiting = &b;
    else if (b.wait_for(5ms) == std::future_status::ready)
      refused = &b, waiting = &a;
  }
  ASSERT_NE(refused, nullptr) << "neither duplicate join was refused";
  const grpc::Status st = refused->get();
  const std::string other = refused == &a ? "b" : "a";
  EXPECT_EQ(st.error_code(), grpc::StatusCode::ALREADY_EXISTS) << st.error_message();
  EXPECT_NE(st.error_message().find("node 0 already joined round 0 (host " + other + ")"), std::string::npos)
      << st.error_message();
  EXPECT_EQ(waiting->wait_for(0ms), std::future_status::timeout) << "the registered join returned early";
  // Through the client: a plain Error (no subclass), at once, with the message.
  const auto t1 = std::chrono::steady_clock::now();
  try {
    job.client()->join(0, "c", 1, 0, 30s);
    ADD_FAILURE() << "a duplicate join was accepted";
  } catch (const TimeoutError& e) {
    ADD_FAILURE() << "a duplicate join timed out instead of being refused: " << e.what();
  } catch (const AbortedError& e) {
    ADD_FAILURE() << "a duplicate join was reported as aborted: " << e.what();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("node 0 already joined round 0 (host " + other + ")"), std::string::npos)
        << e.what();
  }
  // A refusal that waited would take the 30 s join timeout; a loaded machine delays the answer, not by 10 s.
  EXPECT_LT(std::chrono::steady_clock::now() - t1, 10s) << "the refusal waited for the join timeout";
  // Out of range: INVALID_ARGUMENT, i.e. InvalidArgument, naming the range.
  try {
    job.client()->join(2, "c", 1, 0, 1s);
    ADD_FAILURE() << "node rank 2 of 2 was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("node_rank 2 is outside [0, 2)"), std::string::npos) << e.what();
  }
  job.client()->join(1, "d", 1, 0, t);
  const grpc::Status ok = waiting->get();
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ((waiting == &a ? ra : rb).world_size(), 2);
}

TEST(Store, SetGetAndBlockingGet) {
  Job job(0, 2);
  auto c = job.client();
  c->set("a", std::string("x\0y", 3));
  EXPECT_EQ(c->get("a", 1s), std::string("x\0y", 3));
  auto later = std::async(std::launch::async, [&] { return job.client()->get("b", 5s); });
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(later.wait_for(0ms), std::future_status::timeout) << "get returned before the key was set";
  c->set("b", "42");
  EXPECT_EQ(later.get(), "42");
}

TEST(Store, WaitTimeoutNamesMissingKeys) {
  Job job(0, 1);
  auto c = job.client();
  c->set("k1", "v");
  auto t0 = std::chrono::steady_clock::now();
  try {
    c->wait({"k1", "k2", "k3"}, 300ms);
    FAIL() << "wait returned with keys missing";
  } catch (const TimeoutError& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("'k2', 'k3'"), std::string::npos) << w;
    EXPECT_EQ(w.find("'k1'"), std::string::npos) << w;
  }
  auto dt = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(dt, 290ms);
  EXPECT_LT(dt, test_time::scaled(3s));
  EXPECT_THROW(c->get("nope", 100ms), TimeoutError);
  c->set("k2", "v");
  c->set("k3", "v");
  c->wait({"k1", "k2", "k3"}, 1s);
}

TEST(Store, AddIsAtomic) {
  Job job(0, 8);
  constexpr int kThreads = 8, kAdds = 150;
  std::vector<std::vector<int64_t>> seen(kThreads);
  std::vector<std::thread> ts;
  ts.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      auto c = job.client();
      for (int i = 0; i < kAdds; ++i) seen[static_cast<size_t>(t)].push_back(c->add("ctr", 1));
    });
  for (auto& t : ts) t.join();
  std::vector<int64_t> all;
  for (auto& v : seen) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  // Every add saw a distinct value: exactly 1..N.
  for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i], static_cast<int64_t>(i + 1));
  auto c = job.client();
  EXPECT_EQ(c->add("ctr", -5), kThreads * kAdds - 5);
  EXPECT_EQ(c->get("ctr", 1s), std::to_string(kThreads * kAdds - 5));
  c->set("text", "abc");
  EXPECT_THROW(c->add("text", 1), InvalidArgument);
}

TEST(Barrier, NobodyPassesBeforeTheLastAndItIsReusable) {
  constexpr int kRanks = 6;
  Job job(0, kRanks);
  std::atomic<int> arrived{0};
  std::atomic<int> early{0};
  std::vector<std::thread> ts;
  ts.reserve(kRanks);
  for (int r = 0; r < kRanks; ++r)
    ts.emplace_back([&, r] {
      auto c = job.client();
      for (int gen = 0; gen < 3; ++gen) {
        if (r == kRanks - 1) std::this_thread::sleep_for(50ms);  // the late one
        arrived++;
        c->barrier("b", r, kRanks, 10s);
        if (arrived.load() < kRanks * (gen + 1)) early++;
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(early.load(), 0);
}

TEST(Barrier, TimeoutNamesMissingRanksAndDoesNotCountLater) {
  Job job(0, 3);
  auto c = job.client();
  try {
    c->barrier("b", 0, 3, 200ms);
    FAIL();
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("missing rank(s) 1,2"), std::string::npos) << e.what();
  }
  // Rank 0 timed out and left: ranks 1 and 2 alone must not pass.
  auto r1 = std::async(std::launch::async, [&] { job.client()->barrier("b", 1, 3, 3s); });
  auto r2 = std::async(std::launch::async, [&] { job.client()->barrier("b", 2, 3, 3s); });
  EXPECT_EQ(r1.wait_for(300ms), std::future_status::timeout);
  c->barrier("b", 0, 3, 3s);
  r1.get();
  r2.get();
  EXPECT_THROW(c->barrier("b", 0, 4, 100ms), InvalidArgument);  // size mismatch
  EXPECT_THROW(c->barrier("b", 3, 3, 100ms), InvalidArgument);  // rank out of range
}

TEST(Security, WrongOrMissingTokenIsRefused) {
  Job job(0, 1);
  auto bad = job.client("not-the-token");
  try {
    bad->set("k", "v");
    FAIL();
  } catch (const Error& e) {
    // PERMISSION_DENIED maps to a plain Error (not a timeout, an abort or a bad argument).
    EXPECT_EQ(typeid(e), typeid(Error)) << e.what();
    EXPECT_NE(std::string(e.what()).find("job token"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("store set 'k'"), std::string::npos) << e.what();
  }
  // No token at all: a raw stub.
  auto stub = pb::Coordinator::NewStub(grpc::CreateChannel(job.address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  pb::SetRequest req;
  req.set_key("k");
  pb::SetReply rep;
  const grpc::Status denied = stub->Set(&ctx, req, &rep);
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(denied.error_message().find("token"), std::string::npos) << denied.error_message();
  // Nothing was stored by the refused calls.
  EXPECT_THROW(job.client()->get("k", 100ms), TimeoutError);
}

// The local address (a Unix socket for the coordinator's own host) serves the
// same store as the TCP one; when it cannot be bound (here: a name another
// coordinator holds) the coordinator still starts, on TCP alone.
TEST(LocalAddress, ServesTheSameStoreAndFallsBackToTcpWhenTaken) {
  CoordinatorOptions o;
  o.token = "secret-token";
  o.num_nodes = 0;
  o.world_size = 1;
  o.local_address = "unix-abstract:tessera-coordinator-test-" + std::to_string(getpid());
  Coordinator first(o);
  ASSERT_EQ(first.local_address(), o.local_address);
  auto tcp = std::make_shared<CoordinatorClient>("127.0.0.1:" + std::to_string(first.port()), o.token);
  auto local = std::make_shared<CoordinatorClient>(o.local_address, o.token);
  tcp->set("k", "v");
  EXPECT_EQ(local->get("k", 5s), "v");
  EXPECT_EQ(local->add("n", 2), 2);
  EXPECT_EQ(tcp->add("n", 0), 2);
  Coordinator second(o);  // the same Unix socket name
  EXPECT_EQ(second.local_address(), "");
  auto other = std::make_shared<CoordinatorClient>("127.0.0.1:" + std::to_string(second.port()), o.token);
  other->set("k", "second");
  EXPECT_EQ(other->get("k", 5s), "second");
  EXPECT_EQ(local->get("k", 5s), "v") << "the first coordinator still owns its socket";
}

// The coordinator's own refused-call log goes through its LogThrottle
// (docs/errors.md, "Logging"): N refused calls give at most the throttle's
// burst of lines (5) per interval, and the first line after the interval
// counts the calls not logged, so that every refused call is a line or
// counted in one. spdlog's default logger is captured for the test.
TEST(Security, RefusedCallsAreLoggedThrottled) {
  std::ostringstream captured;
  const auto previous = spdlog::default_logger();
  spdlog::set_default_logger(
      std::make_shared<spdlog::logger>("capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(captured)));
  struct Restore {
    std::shared_ptr<spdlog::logger> l;
    ~Restore() { spdlog::set_default_logger(l); }
  } restore{previous};
  constexpr auto kInterval = 2s;
  constexpr int kBurst = 5, kCalls = 50;
  CoordinatorOptions o;
  o.token = "secret-token";
  o.num_nodes = 0;
  o.world_size = 1;
  o.refused_log_interval = kInterval;
  Coordinator coord(o);
  auto stub = pb::Coordinator::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(coord.port()), grpc::InsecureChannelCredentials()));
  auto refused_call = [&] {
    grpc::ClientContext ctx;
    ctx.AddMetadata(kTokenKey, "not-the-token");
    ctx.set_deadline(std::chrono::system_clock::now() + test_time::scaled(10s));
    pb::SetRequest req;
    req.set_key("k");
    pb::SetReply rep;
    EXPECT_EQ(stub->Set(&ctx, req, &rep).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  };
  // The refused-call lines, and the calls they stand for (1 + the count each carries).
  auto lines = [&](uint64_t* calls) {
    std::vector<std::string> out;
    std::istringstream in(captured.str());
    *calls = 0;
    for (std::string l; std::getline(in, l);) {
      if (l.find("coordinator: refused Set from ") == std::string::npos) continue;
      out.push_back(l);
      *calls += 1;
      const size_t at = l.find(" (");
      if (const size_t more = l.find(" more refused calls not logged)"); more != std::string::npos && at < more)
        *calls += std::stoull(l.substr(at + 2, more - at - 2));
    }
    return out;
  };
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kCalls; ++i) refused_call();
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  uint64_t calls = 0;
  std::vector<std::string> got = lines(&calls);
  // Each interval the calls spanned may start a burst (one, unless the machine is very slow).
  const int64_t windows = 1 + elapsed / kInterval;
  EXPECT_GE(got.size(), 1u) << captured.str();
  EXPECT_LE(static_cast<int64_t>(got.size()), kBurst * windows) << captured.str();
  // A whole interval later, one more refused call logs and counts those not logged since.
  std::this_thread::sleep_for(kInterval + 100ms);
  refused_call();
  got = lines(&calls);
  EXPECT_EQ(calls, static_cast<uint64_t>(kCalls + 1)) << captured.str();
  if (windows == 1) {
    EXPECT_EQ(got.size(), static_cast<size_t>(kBurst + 1)) << captured.str();
    EXPECT_NE(got.back().find("wrong job token (45 more refused calls not logged)"), std::string::npos)
        << captured.str();
  }
}

TEST(Security, BoundsAndMalformedRequestsDoNotHurtTheCoordinator) {
  Job job(0, 1);
  auto c = job.client();
  EXPECT_THROW(c->set(std::string(kMaxKeyBytes + 1, 'k'), "v"), InvalidArgument);
  EXPECT_THROW(c->set("big", std::string(kMaxValueBytes + 1, 'v')), InvalidArgument);
  EXPECT_THROW(c->set("", "v"), InvalidArgument);
  // Larger than the message bound: refused by gRPC itself.
  try {
    c->set("huge", std::string(kMaxMessageBytes + 100, 'v'));
    ADD_FAILURE() << "a message over the bound was accepted";
  } catch (const Error& e) {
    // RESOURCE_EXHAUSTED from gRPC: a plain Error naming the call.
    EXPECT_EQ(typeid(e), typeid(Error)) << e.what();
    EXPECT_NE(std::string(e.what()).find("store set 'huge'"), std::string::npos) << e.what();
  }
  // Garbage bytes where a SetRequest should be.
  grpc::GenericStub generic(grpc::CreateChannel(job.address, grpc::InsecureChannelCredentials()));
  for (const std::string& junk : {std::string("\xff\xff\xff\xff\x0f", 5), std::string(64, '\x0a')}) {
    grpc::ClientContext ctx;
    ctx.AddMetadata(kTokenKey, "secret-token");
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    grpc::Slice s(junk);
    grpc::ByteBuffer req(&s, 1), rep;
    std::promise<grpc::Status> done;
    generic.UnaryCall(&ctx, "/tessera.launcher.proto.Coordinator/Set", grpc::StubOptions(), &req, &rep,
                      [&](grpc::Status st) { done.set_value(std::move(st)); });
    EXPECT_FALSE(done.get_future().get().ok());
  }
  // Still serving.
  c->set("after", "ok");
  EXPECT_EQ(c->get("after", 1s), "ok");
}

TEST(Failure, LostHeartbeatAbortsAndWatchersHearTheRootCause) {
  Job job(0, 2, 300ms);
  auto c = job.client();
  c->set_round(0);
  pb::HeartbeatRequest beat;
  beat.set_role(pb::WORKER);
  beat.set_id(1);
  beat.set_node_rank(0);
  beat.set_host("hostB");
  c->heartbeat(beat, 1s);  // rank 1 beats once, then goes silent
  std::promise<pb::JobEvent> got;
  pb::WatchRequest wr;
  EventWatcher watcher(c, wr, [&](const pb::JobEvent& ev) { got.set_value(ev); });
  auto fut = got.get_future();
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(fut.wait_for(test_time::scaled(5s)), std::future_status::ready);
  auto dt = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(dt, test_time::scaled(2s));
  auto ev = fut.get();
  EXPECT_EQ(ev.type(), pb::JobEvent::ABORT);
  EXPECT_EQ(ev.cause().rank(), 1);
  EXPECT_EQ(ev.cause().host(), "hostB");
  EXPECT_NE(ev.cause().reason().find("no heartbeat"), std::string::npos);
  // Blocked and later store calls fail as aborted.
  EXPECT_THROW(c->get("x", 1s), AbortedError);
  EXPECT_THROW(c->set("x", "1"), AbortedError);
}

TEST(Failure, LeavingWorkerIsNotALostOne) {
  Job job(0, 2, 200ms);
  auto c = job.client();
  pb::HeartbeatRequest beat;
  beat.set_role(pb::WORKER);
  beat.set_id(0);
  c->heartbeat(beat, 1s);
  beat.set_leaving(true);
  c->heartbeat(beat, 1s);
  std::this_thread::sleep_for(600ms);
  EXPECT_FALSE(c->job_state().aborted());
}

TEST(Failure, FirstAbortIsTheRootCauseAndExitReportsCompleteIt) {
  Job job(0, 4);
  auto c = job.client();
  pb::RootCause cause;
  cause.set_rank(2);
  cause.set_node_rank(0);
  cause.set_host("h");
  cause.set_reason("fatal error: boom");
  EXPECT_TRUE(c->abort(cause));
  cause.set_rank(3);
  EXPECT_FALSE(c->abort(cause));
  pb::ExitReport rep;
  rep.set_rank(2);
  rep.set_exit_code(7);
  rep.add_log_tail("last words");
  c->report_exit(rep);
  auto st = c->job_state();
  EXPECT_TRUE(st.aborted());
  EXPECT_EQ(st.cause().rank(), 2);
  EXPECT_TRUE(st.cause().has_exit());
  EXPECT_EQ(st.cause().exit_code(), 7);
  ASSERT_EQ(st.cause().log_tail_size(), 1);
  EXPECT_EQ(st.cause().log_tail(0), "last words");
}

TEST(Rounds, NewRoundClearsTheStoreAndRefusesStragglers) {
  Job job(2);
  auto a = job.client(), b = job.client();
  auto ja = std::async(std::launch::async, [&] { return a->join(0, "a", 1, 0, 5s); });
  b->join(1, "b", 1, 0, 5s);
  ja.get();
  auto worker = job.client();
  worker->set_round(0);
  worker->set("endpoint", "old");
  // A round that is still running cannot be replaced.
  EXPECT_THROW(a->join(0, "a", 1, 1, 1s), AbortedError);
  pb::RootCause cause;
  cause.set_rank(0);
  cause.set_reason("test");
  EXPECT_TRUE(worker->abort(cause));
  ja = std::async(std::launch::async, [&] { return a->join(0, "a", 1, 1, 5s); });
  auto r = b->join(1, "b", 1, 1, 5s);
  EXPECT_EQ(r.round(), 1);
  ja.get();
  // The old round's worker is refused; the new round sees an empty store.
  EXPECT_THROW(worker->set("endpoint", "stale"), AbortedError);
  auto fresh = job.client();
  fresh->set_round(1);
  EXPECT_THROW(fresh->get("endpoint", 100ms), TimeoutError);
  EXPECT_FALSE(fresh->job_state().aborted());
}
