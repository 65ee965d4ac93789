// Coordinator: the job's gRPC service (launcher/proto/coordinator.proto).
//
// One per job. `tessera run` on node 0 hosts it; under plain mpirun, rank 0
// hosts it in-process. The job's state (rendezvous, key-value store, named
// barriers, liveness, root causes) is a JobState (launcher/job_state.h); this
// service only checks the token and the round of each call, converts the
// protos to JobState calls and their JobStatus to a grpc::Status. It owns the
// thread that runs JobState's heartbeat monitor, which aborts the round when
// a participant is silent for longer than the heartbeat timeout; every Watch
// stream then gets the abort with its root cause.
//
// Security: every RPC must carry the job token (metadata "x-tessera-token");
// refusals are PERMISSION_DENIED and logged. Keys, values, host names and
// message sizes are bounded; a request that breaks a bound gets
// INVALID_ARGUMENT or RESOURCE_EXHAUSTED, never a crash.
//
// Threads: gRPC's sync server runs each call on a pool thread; blocking calls
// (Join, Get, Wait, Barrier, Watch) block in JobState and notice a cancelled
// caller within 200 ms. Handlers never throw: every exception becomes a
// grpc::Status at the boundary.
// Lifetime: the constructor starts serving; the destructor (or shutdown())
// wakes every blocked call and stops the server.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "launcher/job_state.h"

namespace tessera::launcher {

// Metadata key of the job token.
inline constexpr const char* kTokenKey = "x-tessera-token";

// Largest gRPC message either side accepts (the other bounds are in job_state.h).
inline constexpr size_t kMaxMessageBytes = 4 << 20;

struct CoordinatorOptions {
  // host:port to listen on; port 0 picks a free one (see Coordinator::port()).
  std::string address = "127.0.0.1:0";
  // A second address for this host's own processes, e.g.
  // "unix-abstract:NAME": a Unix socket's connect and calls skip loopback
  // TCP (its handshake and stack: about 6% of an 8-worker job's CPU). Empty:
  // none. When it cannot be bound the coordinator serves `address` alone
  // (Coordinator::local_address() is then empty).
  std::string local_address;
  std::string token;  // required, non-empty
  // Nodes per rendezvous round; 0: no rendezvous (mpirun mode, world_size set).
  int num_nodes = 1;
  // Known world size (mpirun mode); 0: set by Join.
  int world_size = 0;
  std::chrono::milliseconds heartbeat_timeout{10000};
  // Refused calls (a missing or wrong token) are logged through a LogThrottle
  // (runtime/log_throttle.h): its burst of lines per this interval, then one
  // line that counts those not logged. Tests shorten it.
  std::chrono::milliseconds refused_log_interval{10000};
};

class CoordinatorImpl;

class Coordinator {
 public:
  // Starts listening; throws tessera::Error when the address cannot be bound.
  explicit Coordinator(CoordinatorOptions options);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  int port() const;
  // The local address it serves besides `address` ("" if none).
  const std::string& local_address() const;
  // Wakes every blocked call and stops serving. Idempotent.
  void shutdown();

 private:
  std::unique_ptr<CoordinatorImpl> impl_;
};

// A fresh random job token (hex, 128 bits from the kernel's CSPRNG).
std::string make_job_token();

// Debian builds abseil without NDEBUG, so every absl::Mutex lock (gRPC's
// locks) also updates a lock-order graph for its deadlock detector, a debug
// aid (absl/synchronization/mutex.h): about 4% of an 8-worker `tessera run`'s
// CPU (perf: absl GraphCycles). This turns it off, as abseil's optimized
// builds are; the coordinator and its clients call it before gRPC starts.
void skip_lock_order_graph();

// gRPC's own log lines (e.g. "E1206 ... chttp2_server.cc:1045] UNKNOWN:No
// address added out of total 1 resolved") go to spdlog at debug level, not
// to the user's terminal (docs/errors.md: no library's internal message
// reaches the user; tessera says what failed). Idempotent; the coordinator
// and the client call it before gRPC starts.
void route_grpc_logs();

}  // namespace tessera::launcher
