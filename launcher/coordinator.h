// Coordinator: the job's gRPC service (launcher/proto/coordinator.proto).
//
// One per job. `tessera run` on node 0 hosts it; under plain mpirun, rank 0
// hosts it in-process. It does rendezvous (Join), a key-value store, named
// barriers, liveness (Heartbeat, with a monitor thread that aborts the round
// when a participant is silent for longer than the heartbeat timeout) and
// pushes aborts with their root cause to every Watch stream.
//
// Security: every RPC must carry the job token (metadata "x-tessera-token");
// refusals are PERMISSION_DENIED and logged. Keys, values, host names and
// message sizes are bounded; a request that breaks a bound gets
// INVALID_ARGUMENT or RESOURCE_EXHAUSTED, never a crash.
//
// Threads: gRPC's sync server runs each call on a pool thread; blocking calls
// (Join, Get, Wait, Barrier, Watch) sleep on one condition variable and wake
// on change, timeout, abort or shutdown. The monitor thread is owned here.
// Handlers never throw: errors become grpc::Status at the boundary.
// Lifetime: the constructor starts serving; the destructor (or shutdown())
// wakes every blocked call and stops the server.
#pragma once

#include <chrono>
#include <memory>
#include <string>

namespace tessera::launcher {

// Metadata key of the job token.
inline constexpr const char* kTokenKey = "x-tessera-token";

// Bounds on what one request may carry.
inline constexpr size_t kMaxKeyBytes = 1024;
inline constexpr size_t kMaxValueBytes = 1 << 20;
inline constexpr size_t kMaxMessageBytes = 4 << 20;
inline constexpr size_t kMaxStoreBytes = 256u << 20;
inline constexpr size_t kMaxWaitKeys = 16384;
inline constexpr size_t kMaxHostBytes = 255;
inline constexpr int kMaxRanks = 1 << 16;
inline constexpr std::chrono::milliseconds kMaxWait{24LL * 3600 * 1000};

struct CoordinatorOptions {
  // host:port to listen on; port 0 picks a free one (see Coordinator::port()).
  std::string address = "127.0.0.1:0";
  std::string token;  // required, non-empty
  // Nodes per rendezvous round; 0: no rendezvous (mpirun mode, world_size set).
  int num_nodes = 1;
  // Known world size (mpirun mode); 0: set by Join.
  int world_size = 0;
  std::chrono::milliseconds heartbeat_timeout{10000};
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
  // Wakes every blocked call and stops serving. Idempotent.
  void shutdown();

 private:
  std::unique_ptr<CoordinatorImpl> impl_;
};

// A fresh random job token (hex, 128 bits from the kernel's CSPRNG).
std::string make_job_token();

}  // namespace tessera::launcher
