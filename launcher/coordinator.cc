#include "launcher/coordinator.h"

#include <absl/synchronization/mutex.h>
#include <grpc/support/log.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <sys/random.h>

#include <mutex>
#include <thread>
#include <vector>

#include "launcher/proto/coordinator.grpc.pb.h"
#include "runtime/error.h"
#include "runtime/log_throttle.h"

namespace tessera::launcher {

namespace pb = tessera::launcher::proto;
using grpc::ServerContext;
using grpc::Status;
using grpc::StatusCode;

namespace {

constexpr const char* kRoundKey = "x-tessera-round";

bool same_token(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;  // constant time: no early exit on the first mismatch
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

Status to_grpc(const JobStatus& s) {
  using C = JobStatus::Code;
  switch (s.code()) {
    case C::kOk:
      return Status::OK;
    case C::kInvalidArgument:
      return {StatusCode::INVALID_ARGUMENT, s.message()};
    case C::kFailedPrecondition:
      return {StatusCode::FAILED_PRECONDITION, s.message()};
    case C::kAlreadyExists:
      return {StatusCode::ALREADY_EXISTS, s.message()};
    case C::kResourceExhausted:
      return {StatusCode::RESOURCE_EXHAUSTED, s.message()};
    case C::kOutOfRange:
      return {StatusCode::OUT_OF_RANGE, s.message()};
    case C::kDeadlineExceeded:
      return {StatusCode::DEADLINE_EXCEEDED, s.message()};
    case C::kAborted:
      return {StatusCode::ABORTED, s.message()};
    case C::kUnavailable:
      return {StatusCode::UNAVAILABLE, s.message()};
    case C::kCancelled:
      return {StatusCode::CANCELLED, s.message()};
  }
  return {StatusCode::INTERNAL, s.message()};
}

RootCause from_proto(const pb::RootCause& c) {
  RootCause r;
  r.rank = c.rank();
  r.node_rank = c.node_rank();
  r.host = c.host();
  r.has_exit = c.has_exit();
  r.exit_code = c.exit_code();
  r.signal = c.signal();
  r.reason = c.reason();
  r.log_tail.assign(c.log_tail().begin(), c.log_tail().end());
  return r;
}

void to_proto(const RootCause& r, pb::RootCause* c) {
  c->set_rank(r.rank);
  c->set_node_rank(r.node_rank);
  c->set_host(r.host);
  c->set_has_exit(r.has_exit);
  c->set_exit_code(r.exit_code);
  c->set_signal(r.signal);
  c->set_reason(r.reason);
  for (const auto& line : r.log_tail) c->add_log_tail(line);
}

void to_proto(const NodeInfo& n, pb::NodeInfo* p) {
  p->set_node_rank(n.node_rank);
  p->set_host(n.host);
  p->set_nproc(n.nproc);
  p->set_first_rank(n.first_rank);
}

JobStateOptions state_options(const CoordinatorOptions& o) {
  TESSERA_ARG_CHECK(!o.token.empty(), "coordinator: the job token must not be empty");
  JobStateOptions s;
  s.num_nodes = o.num_nodes;
  s.world_size = o.world_size;
  s.heartbeat_timeout = o.heartbeat_timeout;
  return s;
}

}  // namespace

class CoordinatorImpl final : public pb::Coordinator::Service {
 public:
  // refused_log_ is declared (so initialised) before opt_, which takes `o` over.
  explicit CoordinatorImpl(CoordinatorOptions o)
      : refused_log_(o.refused_log_interval), opt_(std::move(o)), state_(state_options(opt_)) {
    // spdlog builds its registry on first use. Build it before gRPC's threads
    // exist, so the handlers that log find it through thread creation, an
    // ordering ThreadSanitizer can see (gRPC's own hand-over it cannot).
    spdlog::default_logger_raw();
    route_grpc_logs();
    skip_lock_order_graph();
    local_address_ = opt_.local_address;
    server_ = build();
    if (!server_ && !local_address_.empty()) {  // gRPC refuses to start when any address fails
      spdlog::debug("coordinator: cannot listen on {}; serving {} alone", local_address_, opt_.address);
      local_address_.clear();
      server_ = build();
    }
    if (!server_ || port_ == 0) {
      throw Error(detail::concat("coordinator: cannot listen on ", opt_.address,
                                 " (address in use, or not an address of this host)"));
    }
    monitor_ = std::thread([this] { state_.run_monitor(); });
    spdlog::debug("coordinator listening on {} (port {})", opt_.address, port_);
  }

  ~CoordinatorImpl() override { shutdown(); }

  int port() const { return port_; }
  const std::string& local_address() const { return local_address_; }

  void shutdown() {
    {
      std::lock_guard<std::mutex> l(shutdown_mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    state_.shutdown();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_->Wait();
    if (monitor_.joinable()) monitor_.join();
  }

  // ---- RPCs ------------------------------------------------------------------

  Status Join(ServerContext* ctx, const pb::JoinRequest* req, pb::JoinReply* rep) override {
    return guarded(ctx, "Join", [&](int) {
      JoinResult r;
      JobStatus s = state_.join(req->node_rank(), req->host(), req->nproc(), req->round(), ms(req->timeout_ms()),
                                cancelled(ctx), &r);
      if (!s.ok()) return s;
      rep->set_round(r.round);
      rep->set_world_size(r.world_size);
      rep->set_first_rank(r.first_rank);
      for (const auto& n : r.nodes) to_proto(n, rep->add_nodes());
      return s;
    });
  }

  Status Set(ServerContext* ctx, const pb::SetRequest* req, pb::SetReply*) override {
    return guarded(ctx, "Set", [&](int) { return state_.set(req->key(), req->value()); });
  }

  Status Get(ServerContext* ctx, const pb::GetRequest* req, pb::GetReply* rep) override {
    return guarded(ctx, "Get", [&](int round) {
      std::string value;
      JobStatus s = state_.get(req->key(), round, ms(req->timeout_ms()), cancelled(ctx), &value);
      if (s.ok()) rep->set_value(std::move(value));
      return s;
    });
  }

  Status Wait(ServerContext* ctx, const pb::WaitRequest* req, pb::WaitReply*) override {
    return guarded(ctx, "Wait", [&](int round) {
      if (static_cast<size_t>(req->keys_size()) > kMaxWaitKeys)
        return JobStatus(JobStatus::Code::kInvalidArgument, detail::concat("more than ", kMaxWaitKeys, " keys"));
      std::vector<std::string> keys(req->keys().begin(), req->keys().end());
      return state_.wait(keys, round, ms(req->timeout_ms()), cancelled(ctx));
    });
  }

  Status Add(ServerContext* ctx, const pb::AddRequest* req, pb::AddReply* rep) override {
    return guarded(ctx, "Add", [&](int) {
      int64_t v = 0;
      JobStatus s = state_.add(req->key(), req->delta(), &v);
      if (s.ok()) rep->set_value(v);
      return s;
    });
  }

  Status Barrier(ServerContext* ctx, const pb::BarrierRequest* req, pb::BarrierReply*) override {
    return guarded(ctx, "Barrier", [&](int round) {
      return state_.barrier(req->name(), req->rank(), req->size(), round, ms(req->timeout_ms()), cancelled(ctx));
    });
  }

  Status Heartbeat(ServerContext* ctx, const pb::HeartbeatRequest* req, pb::HeartbeatReply* rep) override {
    return guarded(ctx, "Heartbeat", [&](int) {
      launcher::Heartbeat beat;
      beat.role = req->role() == pb::WORKER ? launcher::Heartbeat::Role::kWorker : launcher::Heartbeat::Role::kNode;
      beat.id = req->id();
      beat.node_rank = req->node_rank();
      beat.host = req->host();
      beat.leaving = req->leaving();
      HeartbeatAnswer a;
      JobStatus s = state_.heartbeat(beat, &a);
      rep->set_round(a.round);
      rep->set_aborted(a.aborted);
      return s;
    });
  }

  Status Watch(ServerContext* ctx, const pb::WatchRequest*, grpc::ServerWriter<pb::JobEvent>* writer) override {
    return guarded(
        ctx, "Watch",
        [&](int round) {
          AbortEvent e;
          JobStatus s = state_.watch(round, cancelled(ctx), &e);
          if (s.code() != JobStatus::Code::kAborted) return s;
          pb::JobEvent ev;
          ev.set_type(pb::JobEvent::ABORT);
          ev.set_round(e.round);
          if (e.has_cause) to_proto(e.cause, ev.mutable_cause());
          if (!writer->Write(ev)) return JobStatus(JobStatus::Code::kCancelled, "watcher went away");
          return JobStatus::success();
        },
        /*stale_is_error=*/false);
  }

  Status Abort(ServerContext* ctx, const pb::AbortRequest* req, pb::AbortReply* rep) override {
    return guarded(ctx, "Abort", [&](int round) {
      bool root = false;
      JobStatus s = state_.abort(round, from_proto(req->cause()), &root);
      rep->set_root(root);
      return s;
    });
  }

  Status ReportExit(ServerContext* ctx, const pb::ExitReport* req, pb::ExitReply*) override {
    return guarded(ctx, "ReportExit", [&](int round) {
      if (req->log_tail_size() > 64)  // before copying it
        return JobStatus(JobStatus::Code::kInvalidArgument, "exit report too large");
      ExitReport r;
      r.rank = req->rank();
      r.node_rank = req->node_rank();
      r.host = req->host();
      r.exit_code = req->exit_code();
      r.signal = req->signal();
      r.log_tail.assign(req->log_tail().begin(), req->log_tail().end());
      r.after_stop = req->after_stop();
      return state_.report_exit(round, r);
    });
  }

  Status NodeDone(ServerContext* ctx, const pb::NodeDoneRequest* req, pb::NodeDoneReply*) override {
    return guarded(ctx, "NodeDone", [&](int) { return state_.node_done(req->node_rank(), req->success()); });
  }

  Status GetJobState(ServerContext* ctx, const pb::JobStateRequest*, pb::JobState* rep) override {
    return guarded(
        ctx, "GetJobState",
        [&](int round) {
          JobSnapshot s = state_.snapshot(round);
          rep->set_round(s.round);
          rep->set_started(s.started);
          rep->set_aborted(s.aborted);
          if (s.has_cause) to_proto(s.cause, rep->mutable_cause());
          rep->set_nodes_done(s.nodes_done);
          rep->set_num_nodes(s.num_nodes);
          rep->set_nodes_left(s.nodes_left);
          return JobStatus::success();
        },
        /*stale_is_error=*/false);
  }

 private:
  std::unique_ptr<grpc::Server> build() {
    port_ = 0;
    grpc::ServerBuilder b;
    // gRPC sets SO_REUSEPORT by default, which would let two jobs share a port silently.
    b.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    b.SetMaxReceiveMessageSize(static_cast<int>(kMaxMessageBytes));
    b.SetMaxSendMessageSize(static_cast<int>(kMaxMessageBytes));
    b.AddListeningPort(opt_.address, grpc::InsecureServerCredentials(), &port_);
    if (!local_address_.empty()) b.AddListeningPort(local_address_, grpc::InsecureServerCredentials());
    b.RegisterService(this);
    return b.BuildAndStart();
  }

  static std::chrono::milliseconds ms(int64_t v) { return std::chrono::milliseconds(v); }
  LogThrottle refused_log_;  // refused calls: 5 lines per refused_log_interval (10 s) at most

  // gRPC has no wake-up hook for a cancelled sync call: JobState polls this.
  static JobState::Cancelled cancelled(ServerContext* ctx) {
    return [ctx] { return ctx->IsCancelled(); };
  }

  // Token and round admission, then the handler, with every exception turned
  // into a Status: nothing may escape into gRPC's threads.
  template <typename F>
  Status guarded(ServerContext* ctx, const char* method, F&& body, bool stale_is_error = true) {
    try {
      const auto& md = ctx->client_metadata();
      auto it = md.find(kTokenKey);
      if (it == md.end() || !same_token(std::string(it->second.data(), it->second.size()), opt_.token)) {
        // Throttled: anyone who can reach the port can trigger this line.
        if (uint64_t dropped = 0; refused_log_.allow(&dropped))
          spdlog::warn("coordinator: refused {} from {}: {} job token{}", method, ctx->peer(),
                       it == md.end() ? "no" : "wrong",
                       dropped ? detail::concat(" (", dropped, " more refused calls not logged)") : std::string());
        return {StatusCode::PERMISSION_DENIED, "missing or wrong job token"};
      }
      int round = -1;
      auto r = md.find(kRoundKey);
      if (r != md.end()) {
        std::string s(r->second.data(), r->second.size());
        size_t pos = 0;
        try {
          round = std::stoi(s, &pos);
        } catch (const std::exception&) {
          pos = 0;
        }
        if (pos == 0 || pos != s.size() || round < 0)
          return {StatusCode::INVALID_ARGUMENT, detail::concat("bad ", kRoundKey, " '", s, "'")};
        if (stale_is_error) {
          if (JobStatus st = state_.admit(round); !st.ok()) return to_grpc(st);
        }
      }
      return to_grpc(body(round));
    } catch (const std::exception& e) {
      spdlog::error("coordinator: {} failed: {}", method, e.what());
      return {StatusCode::INTERNAL, e.what()};
    } catch (...) {
      return {StatusCode::INTERNAL, "unknown error"};
    }
  }

  const CoordinatorOptions opt_;
  JobState state_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string local_address_;
  std::thread monitor_;
  std::mutex shutdown_mu_;
  bool stopped_ = false;
};

Coordinator::Coordinator(CoordinatorOptions options) : impl_(std::make_unique<CoordinatorImpl>(std::move(options))) {}
Coordinator::~Coordinator() { impl_->shutdown(); }
int Coordinator::port() const { return impl_->port(); }
const std::string& Coordinator::local_address() const { return impl_->local_address(); }
void Coordinator::shutdown() { impl_->shutdown(); }

void skip_lock_order_graph() { absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore); }

std::string make_job_token() {
  unsigned char b[16];
  size_t got = 0;
  while (got < sizeof b) {
    ssize_t n = getrandom(b + got, sizeof b - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error("getrandom failed: cannot make a job token");
    }
    got += static_cast<size_t>(n);
  }
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned char c : b) {
    s += hex[c >> 4];
    s += hex[c & 15];
  }
  return s;
}

void route_grpc_logs() {
  static std::once_flag once;
  std::call_once(once, [] {
    spdlog::default_logger_raw();  // built before gRPC's threads log through it
    gpr_set_log_function([](gpr_log_func_args* a) {
      spdlog::debug("grpc {} {}:{}: {}", gpr_log_severity_string(a->severity), a->file ? a->file : "?", a->line,
                    a->message ? a->message : "");
    });
  });
}

}  // namespace tessera::launcher
