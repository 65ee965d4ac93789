// Clients of the coordinator: CoordinatorClient (typed calls that throw
// tessera errors), GrpcStore (collectives::Store over it), and two background
// helpers every worker and node agent runs: Heartbeater and EventWatcher.
//
// Errors: a failed RPC throws at the caller: DEADLINE_EXCEEDED ->
// TimeoutError, ABORTED or a stale round -> AbortedError, INVALID_ARGUMENT ->
// InvalidArgument, anything else (refused token, unreachable) -> Error, with
// the coordinator's message.
//
// Threads: CoordinatorClient and GrpcStore are thread-safe (one gRPC channel,
// one context per call). Heartbeater and EventWatcher own one thread each;
// their callbacks run on that thread, at most once, and must not block long.
// stop() joins the thread and may be called from any other thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "collectives/store.h"
#include "launcher/proto/coordinator.grpc.pb.h"

namespace tessera::launcher {

class CoordinatorClient {
 public:
  // address: host:port. Connects lazily; the first call fails if nobody listens.
  CoordinatorClient(std::string address, std::string token);

  const std::string& address() const { return address_; }
  // Round sent with every call (-1: none, as node agents between rounds).
  void set_round(int round) { round_.store(round); }
  int round() const { return round_.load(); }

  // Blocks until all nodes joined (waits for the coordinator to come up too).
  proto::JoinReply join(int node_rank, const std::string& host, int nproc, int round,
                        std::chrono::milliseconds timeout);
  void set(const std::string& key, const std::string& value);
  std::string get(const std::string& key, std::chrono::milliseconds timeout);
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  int64_t add(const std::string& key, int64_t delta);
  void barrier(const std::string& name, int rank, int size, std::chrono::milliseconds timeout);
  proto::HeartbeatReply heartbeat(const proto::HeartbeatRequest& req, std::chrono::milliseconds timeout);
  // Returns true when this report became the root cause.
  bool abort(const proto::RootCause& cause);
  void report_exit(const proto::ExitReport& report);
  void node_done(int node_rank, bool success);
  proto::JobState job_state(std::chrono::milliseconds timeout = std::chrono::seconds(5));

  proto::Coordinator::Stub& stub() { return *stub_; }
  // Adds the token and round to a context.
  void prepare(grpc::ClientContext& ctx, std::chrono::milliseconds timeout) const;

 private:
  std::string address_;
  std::string token_;
  std::atomic<int> round_{-1};
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<proto::Coordinator::Stub> stub_;
};

// Throws the tessera error matching a failed status (no-op on OK).
void throw_if_error(const grpc::Status& s, const std::string& what);

// collectives::Store over the coordinator's key-value service.
class GrpcStore : public collectives::Store {
 public:
  explicit GrpcStore(std::shared_ptr<CoordinatorClient> client) : client_(std::move(client)) {}
  void set(const std::string& key, const std::string& value) override { client_->set(key, value); }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    return client_->get(key, timeout);
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    client_->wait(keys, timeout);
  }
  int64_t add(const std::string& key, int64_t delta) override { return client_->add(key, delta); }

 private:
  std::shared_ptr<CoordinatorClient> client_;
};

// Sends a heartbeat every `interval`. Calls on_lost(reason) once when no
// beat got through for `give_up` (the coordinator is gone), or, with
// stop_on_abort, when the coordinator says the round was aborted (a fallback
// to Watch for workers; node agents outlive rounds and pass false).
class Heartbeater {
 public:
  Heartbeater(std::shared_ptr<CoordinatorClient> client, proto::HeartbeatRequest beat,
              std::chrono::milliseconds interval, std::chrono::milliseconds give_up, bool stop_on_abort,
              std::function<void(const std::string&)> on_lost, bool first_beat_sent = false);
  // first_beat_sent: the owner's own beat got through just now (a worker's
  // check of its coordinator), so the loop waits one interval before its
  // first beat instead of repeating it at once.
  ~Heartbeater() { stop(); }
  // Stops beating; with leaving, sends a last beat telling the coordinator to stop watching.
  void stop(bool leaving = false);

 private:
  void loop(bool first_beat_sent);
  std::shared_ptr<CoordinatorClient> client_;
  proto::HeartbeatRequest beat_;
  std::chrono::milliseconds interval_, give_up_;
  bool stop_on_abort_;
  std::atomic<bool> ever_ok_{false};
  std::function<void(const std::string&)> on_lost_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// Holds a Watch stream. on_event(event) runs once with the abort event, or
// with a synthesized one when the stream breaks without stop() (coordinator
// gone).
class EventWatcher {
 public:
  EventWatcher(std::shared_ptr<CoordinatorClient> client, proto::WatchRequest req,
               std::function<void(const proto::JobEvent&)> on_event);
  ~EventWatcher() { stop(); }
  void stop();

 private:
  void loop();
  std::shared_ptr<CoordinatorClient> client_;
  proto::WatchRequest req_;
  std::function<void(const proto::JobEvent&)> on_event_;
  std::mutex mu_;
  grpc::ClientContext* ctx_ = nullptr;  // live while the stream is open
  bool stop_ = false;
  std::thread thread_;
};

// "rank 3 on node 0 (host): exited with code 3" and similar.
std::string describe_cause(const proto::RootCause& c);

}  // namespace tessera::launcher
