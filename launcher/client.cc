#include "launcher/client.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "launcher/coordinator.h"
#include "runtime/error.h"

namespace tessera::launcher {

namespace pb = tessera::launcher::proto;

namespace {
// Slack on top of a server-side wait so the server answers before the client gives up.
constexpr std::chrono::milliseconds kSlack{5000};
constexpr std::chrono::milliseconds kQuickCall{10000};
// How long one connection attempt may take before gRPC gives up on it and
// tries again: TCP's first SYN retransmission comes after 1 s (RFC 6298's
// initial RTO), so a lost SYN is still retried by the kernel within it.
constexpr std::chrono::milliseconds kConnectAttemptTimeout{5000};
}  // namespace

void throw_if_error(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return;
  std::string msg = what + ": " + s.error_message();
  switch (s.error_code()) {
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      throw TimeoutError(msg);
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::FAILED_PRECONDITION:
      throw AbortedError(msg);
    case grpc::StatusCode::INVALID_ARGUMENT:
      throw InvalidArgument(msg);
    case grpc::StatusCode::PERMISSION_DENIED:
      throw Error(msg + " (is TESSERA_JOB_TOKEN the job's token?)");
    case grpc::StatusCode::UNAVAILABLE:
      throw Error(msg + " (coordinator unreachable or gone)");
    default:
      throw Error(msg);
  }
}

CoordinatorClient::CoordinatorClient(std::string address, std::string token)
    : address_(std::move(address)), token_(std::move(token)) {
  skip_lock_order_graph();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(kMaxMessageBytes));
  args.SetMaxSendMessageSize(static_cast<int>(kMaxMessageBytes));
  // Retry a refused connect quickly (a coordinator that is starting up is
  // found within ~100 ms): the first retry after 50 ms, growing to 500 ms.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  // But give each attempt time to finish. gRPC gives a connection attempt
  // (TCP connect plus the HTTP/2 settings exchange) max(backoff,
  // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS) to complete (doc/connection-backoff.md,
  // MIN_CONNECT_TIMEOUT); at 50 ms, a coordinator busy answering many
  // workers' handshakes on a loaded machine had its connections cut and
  // redone (strace: up to 3 attempts per worker, 128 workers took 4.8 s).
  // A refused connect still fails at once and is retried after the backoff.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, static_cast<int>(kConnectAttemptTimeout.count()));
  route_grpc_logs();
  channel_ = grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), args);
  stub_ = pb::Coordinator::NewStub(channel_);
}

void CoordinatorClient::prepare(grpc::ClientContext& ctx, std::chrono::milliseconds timeout) const {
  ctx.AddMetadata(kTokenKey, token_);
  int r = round_.load();
  if (r >= 0) ctx.AddMetadata("x-tessera-round", std::to_string(r));
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  // A connection that is still being set up (or a handshake lost under load)
  // is retried until the deadline instead of failing the call at once; a
  // coordinator that is really gone is noticed by the heartbeat's give-up and
  // by the watch stream breaking.
  ctx.set_wait_for_ready(true);
}

pb::JoinReply CoordinatorClient::join(int node_rank, const std::string& host, int nproc, int round,
                                      std::chrono::milliseconds timeout) {
  grpc::ClientContext ctx;
  prepare(ctx, timeout + std::chrono::milliseconds(500));  // waits for node 0 to come up, too
  pb::JoinRequest req;
  req.set_node_rank(node_rank);
  req.set_host(host);
  req.set_nproc(nproc);
  req.set_round(round);
  req.set_timeout_ms(timeout.count());
  pb::JoinReply rep;
  auto s = stub_->Join(&ctx, req, &rep);
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && s.error_message() == "Deadline Exceeded")
    throw TimeoutError(
        detail::concat("rendezvous: no coordinator answered at ", address_));  // the caller says for how long
  throw_if_error(s, "rendezvous (Join) at " + address_);
  return rep;
}

void CoordinatorClient::set(const std::string& key, const std::string& value) {
  grpc::ClientContext ctx;
  prepare(ctx, kQuickCall);
  pb::SetRequest req;
  req.set_key(key);
  req.set_value(value);
  pb::SetReply rep;
  throw_if_error(stub_->Set(&ctx, req, &rep), "store set '" + key + "'");
}

std::string CoordinatorClient::get(const std::string& key, std::chrono::milliseconds timeout) {
  grpc::ClientContext ctx;
  prepare(ctx, timeout + kSlack);
  pb::GetRequest req;
  req.set_key(key);
  req.set_timeout_ms(timeout.count());
  pb::GetReply rep;
  throw_if_error(stub_->Get(&ctx, req, &rep), "store get '" + key + "'");
  return rep.value();
}

void CoordinatorClient::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  grpc::ClientContext ctx;
  prepare(ctx, timeout + kSlack);
  pb::WaitRequest req;
  for (const auto& k : keys) req.add_keys(k);
  req.set_timeout_ms(timeout.count());
  pb::WaitReply rep;
  throw_if_error(stub_->Wait(&ctx, req, &rep), "store wait");
}

int64_t CoordinatorClient::add(const std::string& key, int64_t delta) {
  grpc::ClientContext ctx;
  prepare(ctx, kQuickCall);
  pb::AddRequest req;
  req.set_key(key);
  req.set_delta(delta);
  pb::AddReply rep;
  throw_if_error(stub_->Add(&ctx, req, &rep), "store add '" + key + "'");
  return rep.value();
}

void CoordinatorClient::barrier(const std::string& name, int rank, int size, std::chrono::milliseconds timeout) {
  grpc::ClientContext ctx;
  prepare(ctx, timeout + kSlack);
  pb::BarrierRequest req;
  req.set_name(name);
  req.set_rank(rank);
  req.set_size(size);
  req.set_timeout_ms(timeout.count());
  pb::BarrierReply rep;
  throw_if_error(stub_->Barrier(&ctx, req, &rep), "barrier '" + name + "'");
}

pb::HeartbeatReply CoordinatorClient::heartbeat(const pb::HeartbeatRequest& req, std::chrono::milliseconds timeout) {
  grpc::ClientContext ctx;
  prepare(ctx, timeout);
  pb::HeartbeatReply rep;
  throw_if_error(stub_->Heartbeat(&ctx, req, &rep), "heartbeat");
  return rep;
}

bool CoordinatorClient::abort(const pb::RootCause& cause) {
  grpc::ClientContext ctx;
  prepare(ctx, kQuickCall);
  pb::AbortRequest req;
  *req.mutable_cause() = cause;
  pb::AbortReply rep;
  throw_if_error(stub_->Abort(&ctx, req, &rep), "abort");
  return rep.root();
}

void CoordinatorClient::report_exit(const pb::ExitReport& report) {
  grpc::ClientContext ctx;
  prepare(ctx, kQuickCall);
  pb::ExitReply rep;
  throw_if_error(stub_->ReportExit(&ctx, report, &rep), "report exit");
}

void CoordinatorClient::node_done(int node_rank, bool success) {
  grpc::ClientContext ctx;
  prepare(ctx, kQuickCall);
  pb::NodeDoneRequest req;
  req.set_node_rank(node_rank);
  req.set_success(success);
  pb::NodeDoneReply rep;
  throw_if_error(stub_->NodeDone(&ctx, req, &rep), "node done");
}

pb::JobState CoordinatorClient::job_state(std::chrono::milliseconds timeout) {
  grpc::ClientContext ctx;
  prepare(ctx, timeout);
  pb::JobStateRequest req;
  pb::JobState rep;
  throw_if_error(stub_->GetJobState(&ctx, req, &rep), "job state");
  return rep;
}

// ---- Heartbeater ----------------------------------------------------------------

Heartbeater::Heartbeater(std::shared_ptr<CoordinatorClient> client, pb::HeartbeatRequest beat,
                         std::chrono::milliseconds interval, std::chrono::milliseconds give_up, bool stop_on_abort,
                         std::function<void(const std::string&)> on_lost, bool first_beat_sent)
    : client_(std::move(client)),
      beat_(std::move(beat)),
      interval_(interval),
      give_up_(give_up),
      stop_on_abort_(stop_on_abort),
      on_lost_(std::move(on_lost)) {
  if (first_beat_sent) ever_ok_ = true;
  thread_ = std::thread([this, first_beat_sent] { loop(first_beat_sent); });
}

void Heartbeater::stop(bool leaving) {
  bool first;
  {
    std::lock_guard<std::mutex> l(mu_);
    first = !stop_;
    stop_ = true;
  }
  cv_.notify_all();
  // Joined even when the loop ended on its own (it gave up and reported a
  // loss): a joinable thread left to the destructor would terminate the process.
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  if (!first) return;
  if (leaving && ever_ok_.load()) {  // nobody to say goodbye to otherwise
    try {
      pb::HeartbeatRequest last = beat_;
      last.set_leaving(true);
      client_->heartbeat(last, std::chrono::seconds(1));
    } catch (const std::exception& e) {
      spdlog::debug("last heartbeat not delivered: {}", e.what());
    }
  }
}

void Heartbeater::loop(bool first_beat_sent) {
  // The give-up window starts at the first beat that got through: an agent
  // may start long before node 0's coordinator is up.
  std::optional<std::chrono::steady_clock::time_point> last_ok;
  std::unique_lock<std::mutex> l(mu_);
  if (first_beat_sent) {
    last_ok = std::chrono::steady_clock::now();
    cv_.wait_for(l, interval_, [this] { return stop_; });
  }
  while (!stop_) {
    l.unlock();
    std::string lost;
    try {
      auto rep = client_->heartbeat(beat_, std::chrono::milliseconds(1000));
      last_ok = std::chrono::steady_clock::now();
      ever_ok_ = true;
      if (rep.aborted() && stop_on_abort_) lost = "the coordinator reports the job aborted";
    } catch (const AbortedError& e) {
      last_ok = std::chrono::steady_clock::now();  // it answered: still alive
      ever_ok_ = true;
      if (stop_on_abort_) lost = e.what();
    } catch (const std::exception& e) {
      if (last_ok && std::chrono::steady_clock::now() - *last_ok > give_up_)
        lost = detail::concat("no heartbeat reached the coordinator for ", give_up_.count(), " ms: ", e.what());
    }
    l.lock();
    if (!lost.empty() && !stop_) {
      stop_ = true;  // one report; the owner decides what to do
      l.unlock();
      on_lost_(lost);
      return;
    }
    cv_.wait_for(l, interval_, [this] { return stop_; });
  }
}

// ---- EventWatcher ---------------------------------------------------------------

EventWatcher::EventWatcher(std::shared_ptr<CoordinatorClient> client, pb::WatchRequest req,
                           std::function<void(const pb::JobEvent&)> on_event)
    : client_(std::move(client)), req_(std::move(req)), on_event_(std::move(on_event)) {
  thread_ = std::thread([this] { loop(); });
}

void EventWatcher::stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    if (ctx_) ctx_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
}

void EventWatcher::loop() {
  grpc::ClientContext ctx;
  client_->prepare(ctx, std::chrono::hours(24 * 365));
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_) return;
    ctx_ = &ctx;
  }
  pb::JobEvent ev;
  auto reader = client_->stub().Watch(&ctx, req_);
  bool got = reader->Read(&ev);
  grpc::Status s = reader->Finish();
  bool stopped;
  {
    std::lock_guard<std::mutex> l(mu_);
    ctx_ = nullptr;
    stopped = stop_;
  }
  if (stopped) return;
  if (!got) {
    ev.set_type(pb::JobEvent::ABORT);
    ev.set_round(client_->round());
    auto* c = ev.mutable_cause();
    c->set_rank(-1);
    c->set_node_rank(-1);
    c->set_host(client_->address());
    c->set_reason("lost the coordinator's event stream: " + s.error_message());
  }
  on_event_(ev);
}

std::string describe_cause(const pb::RootCause& c) {
  std::string who;
  if (c.rank() >= 0)
    who = detail::concat("rank ", c.rank(), " on node ", c.node_rank(), " (", c.host(), ")");
  else if (c.node_rank() >= 0)
    who = detail::concat("node ", c.node_rank(), " (", c.host(), ")");
  else
    who = detail::concat("coordinator ", c.host());
  return who + ": " + c.reason();
}

}  // namespace tessera::launcher
