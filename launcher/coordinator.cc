#include "launcher/coordinator.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <sys/random.h>

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

#include "launcher/proto/coordinator.grpc.pb.h"
#include "runtime/error.h"

namespace tessera::launcher {

namespace pb = tessera::launcher::proto;
using Clock = std::chrono::steady_clock;
using grpc::ServerContext;
using grpc::Status;
using grpc::StatusCode;

namespace {

constexpr const char* kRoundKey = "x-tessera-round";
// Blocking calls re-check cancellation this often (gRPC has no wake-up hook
// for a cancelled sync call).
constexpr std::chrono::milliseconds kPollSlice{200};

std::string join_ints(const std::vector<int>& v, size_t max = 16) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < max; ++i) s += (i ? "," : "") + std::to_string(v[i]);
  if (v.size() > max) s += ",...";
  return s;
}

bool same_token(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;  // constant time: no early exit on the first mismatch
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::chrono::milliseconds bounded_timeout(int64_t ms) {
  if (ms <= 0) return std::chrono::milliseconds(0);
  return std::min(std::chrono::milliseconds(ms), kMaxWait);
}

}  // namespace

class CoordinatorImpl final : public pb::Coordinator::Service {
 public:
  explicit CoordinatorImpl(CoordinatorOptions o) : opt_(std::move(o)) {
    TESSERA_ARG_CHECK(!opt_.token.empty(), "coordinator: the job token must not be empty");
    TESSERA_ARG_CHECK(opt_.num_nodes >= 0 && opt_.num_nodes <= kMaxRanks, "coordinator: bad node count ",
                      opt_.num_nodes);
    TESSERA_ARG_CHECK(opt_.num_nodes > 0 || opt_.world_size > 0,
                      "coordinator: without rendezvous (0 nodes) the world size must be given");
    TESSERA_ARG_CHECK(opt_.heartbeat_timeout.count() > 0, "coordinator: heartbeat timeout must be positive");
    if (opt_.num_nodes == 0) {
      world_size_ = opt_.world_size;
      started_ = true;
    }
    grpc::ServerBuilder b;
    // gRPC sets SO_REUSEPORT by default, which would let two jobs share a port silently.
    b.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    b.SetMaxReceiveMessageSize(static_cast<int>(kMaxMessageBytes));
    b.SetMaxSendMessageSize(static_cast<int>(kMaxMessageBytes));
    b.AddListeningPort(opt_.address, grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
    if (!server_ || port_ == 0) {
      throw Error(detail::concat("coordinator: cannot listen on ", opt_.address,
                                 " (address in use, or not an address of this host)"));
    }
    monitor_ = std::thread([this] { monitor_loop(); });
    spdlog::debug("coordinator listening on {} (port {})", opt_.address, port_);
  }

  ~CoordinatorImpl() override { shutdown(); }

  int port() const { return port_; }

  void shutdown() {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_all();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_->Wait();
    if (monitor_.joinable()) monitor_.join();
  }

  // ---- RPCs ------------------------------------------------------------------

  Status Join(ServerContext* ctx, const pb::JoinRequest* req, pb::JoinReply* rep) override {
    return guarded(ctx, "Join", [&](int) -> Status {
      if (opt_.num_nodes == 0) return {StatusCode::FAILED_PRECONDITION, "this job has no rendezvous (mpirun mode)"};
      if (req->node_rank() < 0 || req->node_rank() >= opt_.num_nodes)
        return invalid("node_rank ", req->node_rank(), " is outside [0, ", opt_.num_nodes, ")");
      if (req->nproc() < 1 || req->nproc() > kMaxRanks) return invalid("nproc ", req->nproc(), " out of range");
      if (req->host().size() > kMaxHostBytes) return invalid("host name longer than ", kMaxHostBytes, " bytes");
      if (req->round() < 0) return invalid("negative round");
      std::unique_lock<std::mutex> l(mu_);
      if (req->round() < round_)
        return {StatusCode::FAILED_PRECONDITION, detail::concat("round ", req->round(), " is over (now ", round_, ")")};
      if (req->round() > round_) {
        if (req->round() != round_ + 1) return invalid("round ", req->round(), " skips ahead of round ", round_);
        if (started_ && !aborted_)
          return {StatusCode::FAILED_PRECONDITION, detail::concat("round ", round_, " is still running")};
        advance_round_locked(req->round());
      }
      if (!dead_nodes_.empty()) {
        return {StatusCode::FAILED_PRECONDITION,
                detail::concat("node(s) ", join_ints({dead_nodes_.begin(), dead_nodes_.end()}),
                               " stopped sending heartbeats; no new round can start")};
      }
      if (joined_.count(req->node_rank())) {
        return {StatusCode::ALREADY_EXISTS, detail::concat("node ", req->node_rank(), " already joined round ",
                                                            round_, " (host ", joined_[req->node_rank()].host(), ")")};
      }
      pb::NodeInfo info;
      info.set_node_rank(req->node_rank());
      info.set_host(req->host());
      info.set_nproc(req->nproc());
      joined_[req->node_rank()] = info;
      node_beats_[req->node_rank()] = Beat{req->node_rank(), req->host(), Clock::now()};
      const int my_round = round_;
      if (static_cast<int>(joined_.size()) == opt_.num_nodes) {
        int next = 0;
        layout_.clear();
        for (auto& [k, n] : joined_) {
          n.set_first_rank(next);
          next += n.nproc();
          layout_.push_back(n);
        }
        if (next > kMaxRanks) return invalid("world of ", next, " ranks is too large");
        world_size_ = next;
        started_ = true;
        spdlog::debug("coordinator: round {} started: {} nodes, {} workers", round_, opt_.num_nodes, world_size_);
        cv_.notify_all();
      }
      auto deadline = Clock::now() + bounded_timeout(req->timeout_ms());
      Status s = block(l, ctx, my_round, deadline, [&] { return started_; });
      if (!s.ok()) {
        if (s.error_code() == StatusCode::DEADLINE_EXCEEDED) {
          std::vector<int> missing;
          for (int k = 0; k < opt_.num_nodes; ++k)
            if (!joined_.count(k)) missing.push_back(k);
          s = Status(StatusCode::DEADLINE_EXCEEDED,
                     detail::concat("rendezvous timed out: ", joined_.size(), " of ", opt_.num_nodes,
                                    " nodes joined round ", my_round, "; missing node rank(s) ", join_ints(missing)));
        }
        // A node that gave up must not count in the rendezvous any more.
        if (round_ == my_round && !started_) joined_.erase(req->node_rank());
        return s;
      }
      rep->set_round(round_);
      rep->set_world_size(world_size_);
      rep->set_first_rank(joined_[req->node_rank()].first_rank());
      for (const auto& n : layout_) *rep->add_nodes() = n;
      return Status::OK;
    });
  }

  Status Set(ServerContext* ctx, const pb::SetRequest* req, pb::SetReply*) override {
    return guarded(ctx, "Set", [&](int) -> Status {
      if (Status s = check_key(req->key()); !s.ok()) return s;
      if (req->value().size() > kMaxValueBytes) return invalid("value larger than ", kMaxValueBytes, " bytes");
      std::lock_guard<std::mutex> l(mu_);
      if (aborted_) return aborted_status_locked();
      auto it = kv_.find(req->key());
      size_t old = it == kv_.end() ? 0 : it->first.size() + it->second.size();
      size_t add = req->key().size() + req->value().size();
      if (kv_bytes_ - old + add > kMaxStoreBytes)
        return {StatusCode::RESOURCE_EXHAUSTED, detail::concat("store is full (", kMaxStoreBytes, " bytes)")};
      kv_bytes_ = kv_bytes_ - old + add;
      kv_[req->key()] = req->value();
      cv_.notify_all();
      return Status::OK;
    });
  }

  Status Get(ServerContext* ctx, const pb::GetRequest* req, pb::GetReply* rep) override {
    return guarded(ctx, "Get", [&](int round) -> Status {
      if (Status s = check_key(req->key()); !s.ok()) return s;
      std::unique_lock<std::mutex> l(mu_);
      auto deadline = Clock::now() + bounded_timeout(req->timeout_ms());
      Status s = block(l, ctx, round, deadline, [&] { return kv_.count(req->key()) > 0; });
      if (s.error_code() == StatusCode::DEADLINE_EXCEEDED)
        return {StatusCode::DEADLINE_EXCEEDED,
                detail::concat("store: key '", req->key(), "' not set within ", req->timeout_ms(), " ms")};
      if (!s.ok()) return s;
      rep->set_value(kv_[req->key()]);
      return Status::OK;
    });
  }

  Status Wait(ServerContext* ctx, const pb::WaitRequest* req, pb::WaitReply*) override {
    return guarded(ctx, "Wait", [&](int round) -> Status {
      if (static_cast<size_t>(req->keys_size()) > kMaxWaitKeys) return invalid("more than ", kMaxWaitKeys, " keys");
      for (const auto& k : req->keys())
        if (Status s = check_key(k); !s.ok()) return s;
      std::unique_lock<std::mutex> l(mu_);
      auto all_there = [&] {
        for (const auto& k : req->keys())
          if (!kv_.count(k)) return false;
        return true;
      };
      auto deadline = Clock::now() + bounded_timeout(req->timeout_ms());
      Status s = block(l, ctx, round, deadline, all_there);
      if (s.error_code() == StatusCode::DEADLINE_EXCEEDED) {
        std::string missing;
        int n = 0;
        for (const auto& k : req->keys()) {
          if (kv_.count(k)) continue;
          if (n++ < 8) missing += (missing.empty() ? "'" : ", '") + k + "'";
        }
        if (n > 8) missing += detail::concat(" and ", n - 8, " more");
        return {StatusCode::DEADLINE_EXCEEDED,
                detail::concat("store: keys not set within ", req->timeout_ms(), " ms: ", missing)};
      }
      return s;
    });
  }

  Status Add(ServerContext* ctx, const pb::AddRequest* req, pb::AddReply* rep) override {
    return guarded(ctx, "Add", [&](int) -> Status {
      if (Status s = check_key(req->key()); !s.ok()) return s;
      std::lock_guard<std::mutex> l(mu_);
      if (aborted_) return aborted_status_locked();
      int64_t v = 0;
      auto it = kv_.find(req->key());
      if (it != kv_.end()) {
        size_t pos = 0;
        try {
          v = std::stoll(it->second, &pos);
        } catch (const std::exception&) {
          pos = 0;
        }
        if (pos == 0 || pos != it->second.size())
          return invalid("store: key '", req->key(), "' holds a value that is not an integer");
      }
      if ((req->delta() > 0 && v > INT64_MAX - req->delta()) || (req->delta() < 0 && v < INT64_MIN - req->delta()))
        return {StatusCode::OUT_OF_RANGE, detail::concat("store: add on '", req->key(), "' overflows")};
      v += req->delta();
      std::string s = std::to_string(v);
      size_t old = it == kv_.end() ? 0 : it->first.size() + it->second.size();
      kv_bytes_ = kv_bytes_ - old + req->key().size() + s.size();
      kv_[req->key()] = std::move(s);
      rep->set_value(v);
      cv_.notify_all();
      return Status::OK;
    });
  }

  Status Barrier(ServerContext* ctx, const pb::BarrierRequest* req, pb::BarrierReply*) override {
    return guarded(ctx, "Barrier", [&](int round) -> Status {
      if (Status s = check_key(req->name()); !s.ok()) return s;
      if (req->size() < 1 || req->size() > kMaxRanks) return invalid("barrier size ", req->size(), " out of range");
      if (req->rank() < 0 || req->rank() >= req->size())
        return invalid("barrier rank ", req->rank(), " outside [0, ", req->size(), ")");
      std::unique_lock<std::mutex> l(mu_);
      if (aborted_) return aborted_status_locked();
      auto it = barriers_.find(req->name());
      if (it == barriers_.end()) {
        if (barriers_.size() >= kMaxWaitKeys) return {StatusCode::RESOURCE_EXHAUSTED, "too many barriers"};
        it = barriers_.emplace(req->name(), BarrierState{req->size(), 0, {}}).first;
      }
      BarrierState& b = it->second;
      if (b.size != req->size())
        return invalid("barrier '", req->name(), "' has ", b.size, " participants, not ", req->size());
      if (!b.arrived.insert(req->rank()).second)
        return invalid("barrier '", req->name(), "': rank ", req->rank(), " arrived twice");
      if (static_cast<int>(b.arrived.size()) == b.size) {
        ++b.generation;
        b.arrived.clear();
        cv_.notify_all();
        return Status::OK;
      }
      const uint64_t gen = b.generation;
      const std::string name = req->name();
      auto passed = [&] {
        auto i = barriers_.find(name);
        return i != barriers_.end() && i->second.generation != gen;
      };
      auto deadline = Clock::now() + bounded_timeout(req->timeout_ms());
      Status s = block(l, ctx, round, deadline, passed);
      if (!s.ok()) {
        auto i = barriers_.find(name);
        std::vector<int> missing;
        if (i != barriers_.end() && i->second.generation == gen) {
          i->second.arrived.erase(req->rank());  // a timed-out rank must not count in the next attempt
          for (int r = 0; r < i->second.size; ++r)
            if (!i->second.arrived.count(r) && r != req->rank()) missing.push_back(r);
        }
        if (s.error_code() == StatusCode::DEADLINE_EXCEEDED)
          return {StatusCode::DEADLINE_EXCEEDED, detail::concat("barrier '", name, "' timed out after ",
                                                                req->timeout_ms(), " ms; missing rank(s) ",
                                                                join_ints(missing))};
      }
      return s;
    });
  }

  Status Heartbeat(ServerContext* ctx, const pb::HeartbeatRequest* req, pb::HeartbeatReply* rep) override {
    return guarded(ctx, "Heartbeat", [&](int) -> Status {
      if (req->host().size() > kMaxHostBytes) return invalid("host name too long");
      std::lock_guard<std::mutex> l(mu_);
      if (req->role() == pb::WORKER) {
        if (req->id() < 0 || req->id() >= std::max(world_size_, 1) || (world_size_ == 0))
          return invalid("heartbeat from rank ", req->id(), " outside the world of ", world_size_);
        if (req->leaving()) {
          rank_beats_.erase(req->id());
        } else if (!aborted_) {
          rank_beats_[req->id()] = Beat{req->node_rank(), req->host(), Clock::now()};
        }
      } else {
        if (req->id() < 0 || req->id() >= opt_.num_nodes) return invalid("heartbeat from unknown node ", req->id());
        if (req->leaving()) {
          node_beats_.erase(req->id());
          nodes_left_.insert(req->id());
        } else {
          node_beats_[req->id()] = Beat{req->id(), req->host(), Clock::now()};
        }
      }
      rep->set_round(round_);
      rep->set_aborted(aborted_);
      return Status::OK;
    });
  }

  Status Watch(ServerContext* ctx, const pb::WatchRequest*, grpc::ServerWriter<pb::JobEvent>* writer) override {
    return guarded(
        ctx, "Watch",
        [&](int round) -> Status {
          pb::JobEvent ev;
          {
            std::unique_lock<std::mutex> l(mu_);
            if (round < 0) round = round_;
            // No deadline: a watch lasts as long as the caller keeps it.
            auto forever = Clock::now() + kMaxWait;
            Status s = block(l, ctx, round, forever, [] { return false; });
            if (s.error_code() != StatusCode::ABORTED) return s;
            ev.set_type(pb::JobEvent::ABORT);
            ev.set_round(round);
            auto it = causes_.find(round);
            if (it != causes_.end()) *ev.mutable_cause() = it->second;
          }
          if (!writer->Write(ev)) return {StatusCode::CANCELLED, "watcher went away"};
          return Status::OK;
        },
        /*stale_is_error=*/false);
  }

  Status Abort(ServerContext* ctx, const pb::AbortRequest* req, pb::AbortReply* rep) override {
    return guarded(ctx, "Abort", [&](int round) -> Status {
      if (Status s = check_cause(req->cause()); !s.ok()) return s;
      std::lock_guard<std::mutex> l(mu_);
      rep->set_root(abort_locked(round < 0 ? round_ : round, req->cause()));
      return Status::OK;
    });
  }

  Status ReportExit(ServerContext* ctx, const pb::ExitReport* req, pb::ExitReply*) override {
    return guarded(ctx, "ReportExit", [&](int round) -> Status {
      if (req->host().size() > kMaxHostBytes || req->log_tail_size() > 64) return invalid("exit report too large");
      std::lock_guard<std::mutex> l(mu_);
      if (round >= 0 && round != round_) return Status::OK;  // a straggler of an old round
      if (req->exit_code() == 0 && req->signal() == 0) {
        rank_beats_.erase(req->rank());
        return Status::OK;
      }
      rank_beats_.erase(req->rank());
      pb::RootCause c;
      if (req->after_stop() && !aborted_) return Status::OK;  // a consequence, never a cause
      c.set_rank(req->rank());
      c.set_node_rank(req->node_rank());
      c.set_host(req->host());
      c.set_has_exit(true);
      c.set_exit_code(req->exit_code());
      c.set_signal(req->signal());
      c.set_reason(req->signal() ? detail::concat("killed by signal ", req->signal(), " (", strsignal(req->signal()), ")")
                                 : detail::concat("exited with code ", req->exit_code()));
      *c.mutable_log_tail() = req->log_tail();
      if (!abort_locked(round_, c)) {
        // The worker may have reported its own error first; complete that root cause.
        auto it = causes_.find(round_);
        if (it != causes_.end() && it->second.rank() == req->rank() && !it->second.has_exit()) {
          if (!req->after_stop()) {
            it->second.set_has_exit(true);
            it->second.set_exit_code(req->exit_code());
            it->second.set_signal(req->signal());
          }
          if (it->second.log_tail_size() == 0) *it->second.mutable_log_tail() = req->log_tail();
        }
      }
      return Status::OK;
    });
  }

  Status NodeDone(ServerContext* ctx, const pb::NodeDoneRequest* req, pb::NodeDoneReply*) override {
    return guarded(ctx, "NodeDone", [&](int) -> Status {
      if (req->node_rank() < 0 || req->node_rank() >= std::max(opt_.num_nodes, 1)) return invalid("unknown node");
      std::lock_guard<std::mutex> l(mu_);
      if (req->success()) nodes_done_.insert(req->node_rank());
      cv_.notify_all();
      return Status::OK;
    });
  }

  Status GetJobState(ServerContext* ctx, const pb::JobStateRequest*, pb::JobState* rep) override {
    return guarded(
        ctx, "GetJobState",
        [&](int round) -> Status {
          std::lock_guard<std::mutex> l(mu_);
          if (round < 0) round = round_;
          rep->set_round(round_);
          rep->set_started(started_);
          rep->set_aborted(round != round_ || aborted_);
          auto it = causes_.find(round);
          if (it != causes_.end()) *rep->mutable_cause() = it->second;
          rep->set_nodes_done(static_cast<int>(nodes_done_.size()));
          rep->set_num_nodes(opt_.num_nodes);
          rep->set_nodes_left(static_cast<int>(nodes_left_.size()));
          return Status::OK;
        },
        /*stale_is_error=*/false);
  }

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

  template <typename... Args>
  static Status invalid(Args&&... args) {
    return {StatusCode::INVALID_ARGUMENT, detail::concat(std::forward<Args>(args)...)};
  }

  static Status check_key(const std::string& key) {
    if (key.empty()) return invalid("empty key");
    if (key.size() > kMaxKeyBytes) return invalid("key longer than ", kMaxKeyBytes, " bytes");
    return Status::OK;
  }

  static Status check_cause(const pb::RootCause& c) {
    if (c.host().size() > kMaxHostBytes || c.reason().size() > 64 * 1024 || c.log_tail_size() > 64)
      return invalid("root cause report too large");
    return Status::OK;
  }

  // Token and round admission, then the handler, with every exception turned
  // into a Status: nothing may escape into gRPC's threads.
  template <typename F>
  Status guarded(ServerContext* ctx, const char* method, F&& body, bool stale_is_error = true) {
    try {
      const auto& md = ctx->client_metadata();
      auto it = md.find(kTokenKey);
      if (it == md.end() || !same_token(std::string(it->second.data(), it->second.size()), opt_.token)) {
        spdlog::warn("coordinator: refused {} from {}: {} job token", method, ctx->peer(),
                     it == md.end() ? "no" : "wrong");
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
        if (pos == 0 || pos != s.size() || round < 0) return invalid("bad ", kRoundKey, " '", s, "'");
        if (stale_is_error) {
          std::lock_guard<std::mutex> l(mu_);
          if (round != round_)
            return {StatusCode::FAILED_PRECONDITION,
                    detail::concat("stale call from round ", round, " (the job is in round ", round_, ")")};
        }
      }
      return body(round);
    } catch (const std::exception& e) {
      spdlog::error("coordinator: {} failed: {}", method, e.what());
      return {StatusCode::INTERNAL, e.what()};
    } catch (...) {
      return {StatusCode::INTERNAL, "unknown error"};
    }
  }

  // Sleeps until pred() (OK), the deadline (DEADLINE_EXCEEDED), an abort of
  // `round` or a newer round (ABORTED), shutdown (UNAVAILABLE) or the caller
  // cancelling (CANCELLED).
  template <typename Pred>
  Status block(std::unique_lock<std::mutex>& l, ServerContext* ctx, int round, Clock::time_point deadline,
               Pred pred) {
    for (;;) {
      if (stopping_) return {StatusCode::UNAVAILABLE, "coordinator is shutting down"};
      if (round >= 0 && (round != round_ || aborted_)) return aborted_status_locked(round);
      if (round < 0 && aborted_) return aborted_status_locked(round_);
      if (pred()) return Status::OK;
      if (ctx->IsCancelled()) return {StatusCode::CANCELLED, "caller cancelled"};
      auto now = Clock::now();
      if (now >= deadline) return {StatusCode::DEADLINE_EXCEEDED, "timed out"};
      cv_.wait_until(l, std::min(deadline, now + kPollSlice));
    }
  }

  Status aborted_status_locked(int round = -1) const {
    if (round < 0) round = round_;
    auto it = causes_.find(round);
    std::string why = it == causes_.end() ? std::string("a newer round started") : describe(it->second);
    return {StatusCode::ABORTED, detail::concat("job aborted (round ", round, "): ", why)};
  }

  static std::string describe(const pb::RootCause& c) {
    std::string who = c.rank() >= 0 ? detail::concat("rank ", c.rank(), " on node ", c.node_rank())
                                    : detail::concat("node ", c.node_rank());
    return detail::concat(who, " (", c.host(), "): ", c.reason());
  }

  bool abort_locked(int round, const pb::RootCause& cause) {
    if (round != round_ || aborted_) return false;
    aborted_ = true;
    causes_[round] = cause;
    while (causes_.size() > 64) causes_.erase(causes_.begin());
    spdlog::debug("coordinator: aborting round {}: {}", round, describe(cause));
    cv_.notify_all();
    return true;
  }

  void advance_round_locked(int round) {
    round_ = round;
    started_ = false;
    aborted_ = false;
    joined_.clear();
    layout_.clear();
    kv_.clear();
    kv_bytes_ = 0;
    barriers_.clear();
    rank_beats_.clear();
    nodes_done_.clear();
    cv_.notify_all();
  }

  void monitor_loop() {
    const auto timeout = opt_.heartbeat_timeout;
    const auto slice = std::clamp(timeout / 10, std::chrono::milliseconds(20), std::chrono::milliseconds(500));
    std::unique_lock<std::mutex> l(mu_);
    while (!stopping_) {
      cv_.wait_for(l, slice);
      if (stopping_) break;
      const auto now = Clock::now();
      auto late = [&](const Beat& b) { return now - b.last > timeout; };
      for (auto it = node_beats_.begin(); it != node_beats_.end();) {
        if (!late(it->second)) {
          ++it;
          continue;
        }
        pb::RootCause c;
        c.set_rank(-1);
        c.set_node_rank(it->first);
        c.set_host(it->second.host);
        c.set_reason(detail::concat("the node agent sent no heartbeat for ", timeout.count(),
                                    " ms (host down, agent killed or network lost)"));
        dead_nodes_.insert(it->first);
        it = node_beats_.erase(it);
        if (!abort_locked(round_, c)) spdlog::error("coordinator: {}", describe(c));
      }
      if (aborted_ || !started_) continue;
      for (auto& [rank, b] : rank_beats_) {
        if (!late(b)) continue;
        pb::RootCause c;
        c.set_rank(rank);
        c.set_node_rank(b.node_rank);
        c.set_host(b.host);
        c.set_reason(detail::concat("no heartbeat for ", timeout.count(),
                                    " ms (the worker is stopped, hung in a way that blocks its heartbeat "
                                    "thread, or cut off)"));
        abort_locked(round_, c);
        break;
      }
    }
  }

  const CoordinatorOptions opt_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::thread monitor_;

  std::mutex mu_;
  std::condition_variable cv_;  // any state change below
  bool stopping_ = false;
  int round_ = 0;
  bool started_ = false;
  bool aborted_ = false;
  int world_size_ = 0;
  std::map<int, pb::NodeInfo> joined_;
  std::vector<pb::NodeInfo> layout_;
  std::map<int, pb::RootCause> causes_;  // by round
  std::unordered_map<std::string, std::string> kv_;
  size_t kv_bytes_ = 0;
  std::map<std::string, BarrierState> barriers_;
  std::map<int, Beat> rank_beats_;
  std::map<int, Beat> node_beats_;
  std::set<int> nodes_done_;  // finished the current round successfully
  std::set<int> nodes_left_;
  std::set<int> dead_nodes_;
};

Coordinator::Coordinator(CoordinatorOptions options) : impl_(std::make_unique<CoordinatorImpl>(std::move(options))) {}
Coordinator::~Coordinator() { impl_->shutdown(); }
int Coordinator::port() const { return impl_->port(); }
void Coordinator::shutdown() { impl_->shutdown(); }

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

}  // namespace tessera::launcher
