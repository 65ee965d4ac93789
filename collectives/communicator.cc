#include "collectives/communicator.h"

#include <cmath>
#include <cstdlib>

#include "collectives/comm_impl.h"
#include "collectives/mpi/mpi_backend.h"
#include "collectives/routed_transport.h"
#include "collectives/transport.h"

namespace tessera::collectives {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Prod:
      return "prod";
    case ReduceOp::Min:
      return "min";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Avg:
      return "avg";
  }
  return "?";
}

ReduceOp parse_reduce_op(const std::string& s) {
  if (s == "sum") return ReduceOp::Sum;
  if (s == "prod") return ReduceOp::Prod;
  if (s == "min") return ReduceOp::Min;
  if (s == "max") return ReduceOp::Max;
  if (s == "avg" || s == "mean") return ReduceOp::Avg;
  throw InvalidArgument("unknown reduce op '" + s + "' (expected sum, prod, min, max or avg)");
}

const char* collective_error_kind_name(CollectiveError::Kind kind) {
  switch (kind) {
    case CollectiveError::Kind::Timeout:
      return "timed out";
    case CollectiveError::Kind::PeerDead:
      return "peer died";
    case CollectiveError::Kind::PeerFailed:
      return "peer failed";
    case CollectiveError::Kind::Aborted:
      return "aborted";
    case CollectiveError::Kind::Protocol:
      return "protocol mismatch";
    case CollectiveError::Kind::Backend:
      return "MPI error";
  }
  return "?";
}

const char* transport_name(TransportKind t) {
  switch (t) {
    case TransportKind::Auto:
      return "auto";
    case TransportKind::Shm:
      return "shm";
    case TransportKind::Tcp:
      return "tcp";
    case TransportKind::Mpi:
      return "mpi";
  }
  return "?";
}

TransportKind parse_transport(const std::string& s) {
  if (s == "auto") return TransportKind::Auto;
  if (s == "shm") return TransportKind::Shm;
  if (s == "tcp") return TransportKind::Tcp;
  if (s == "mpi") return TransportKind::Mpi;
  throw InvalidArgument("unknown transport '" + s + "' (expected auto, shm, tcp or mpi)");
}

CommOptions apply_env_overrides(CommOptions options) {
  if (const char* t = std::getenv("TESSERA_TIMEOUT_S"); t && *t) {
    char* end = nullptr;
    double s = std::strtod(t, &end);
    // A millisecond at least, and at most a year (inf or 1e17 overflowed the milliseconds to a negative timeout).
    TESSERA_ARG_CHECK(end && *end == '\0' && s >= 0.001 && s <= 365.0 * 86400, "TESSERA_TIMEOUT_S='", t,
                      "' is not a number of seconds from 0.001 to 31536000 (a year)");
    options.timeout = std::chrono::milliseconds(std::llround(s * 1000.0));
  }
  if (const char* a = std::getenv("TESSERA_ALGO"); a && *a) options.algo = a;
  if (const char* t = std::getenv("TESSERA_TRANSPORT"); t && *t) {
    try {
      options.transport = parse_transport(t);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(std::string("TESSERA_TRANSPORT: ") + e.what());
    }
  }
  return options;
}

std::unique_ptr<Transport> make_transport(TransportKind kind, std::shared_ptr<Store> store, int rank, int size,
                                          const CommOptions& options) {
  switch (kind) {
    case TransportKind::Auto:
    case TransportKind::Shm:
    case TransportKind::Tcp:
      return make_routed_transport(kind, std::move(store), rank, size, options);
    case TransportKind::Mpi:
      break;
  }
  throw InvalidArgument("the mpi backend has no Transport; use Communicator::create");
}

std::shared_ptr<Communicator> Communicator::create(std::shared_ptr<Store> store, int rank, int size,
                                                   CommOptions options) {
  TESSERA_ARG_CHECK(size >= 1, "communicator size must be >= 1, got ", size);
  TESSERA_ARG_CHECK(rank >= 0 && rank < size, "rank ", rank, " out of range for size ", size);
  TESSERA_ARG_CHECK(options.timeout.count() > 0, "communicator timeout must be positive");
  options = apply_env_overrides(std::move(options));
  if (options.world_ranks.empty()) {
    for (int i = 0; i < size; ++i) options.world_ranks.push_back(i);
  }
  TESSERA_ARG_CHECK(static_cast<int>(options.world_ranks.size()) == size, "world_ranks has ",
                    options.world_ranks.size(), " entries for a group of ", size);
  if (options.transport == TransportKind::Mpi) return mpi::create_communicator(rank, size, options);
  TESSERA_ARG_CHECK(store != nullptr, "Communicator::create needs a store for the ", transport_name(options.transport),
                    " transport");
  // Ranks agree on a store prefix without talking: the n-th communicator
  // named X that rank r creates on a store gets generation n (creation is
  // collective and ordered, so every member counts alike).
  const int64_t gen = store->add("tessera/comm/" + options.name + "/generation/" + std::to_string(rank), 1) - 1;
  auto prefixed =
      std::make_shared<PrefixStore>(std::move(store), "tessera/comm/" + options.name + "/" + std::to_string(gen) + "/");
  std::unique_ptr<Transport> transport;
  try {
    transport = make_transport(options.transport, prefixed, rank, size, options);
  } catch (const TransportError& e) {
    const auto kind = collective_error_kind(e.kind());
    throw CollectiveError(kind,
                          "creating communicator '" + options.name + "' (rank " + std::to_string(rank) + " of " +
                              std::to_string(size) + ") failed (" + collective_error_kind_name(kind) + "): " + e.what(),
                          "create", options.name, e.peer());
  }
  return make_transport_communicator(prefixed, std::move(transport), std::move(options));
}

}  // namespace tessera::collectives
