// The MPI bootstrap (mpi_env.h). With mpi_comm.cc, the only code that
// includes mpi.h (library tessera_coll_mpi, and the module tessera_mpi_boot).
#include "collectives/mpi/mpi_env.h"

#include <mpi.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "collectives/mpi/mpi_boot.h"
#include "runtime/error.h"
#include "runtime/log.h"

namespace tessera::collectives::mpi {
namespace {

enum class State { Fresh, Ours, Adopted, Finalized };

struct Env {
  std::mutex mu;
  State state = State::Fresh;
  ThreadLevel level = ThreadLevel::Single;
  std::thread::id init_thread;
};

// Never destroyed: abort() may run on a thread while static destructors do.
Env& env() {
  static Env* e = new Env;
  return *e;
}

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(detail::concat("MPI ", what, " failed: ", std::string(msg, static_cast<size_t>(len))));
}

void require_init(const char* what) {
  if (!initialized()) throw InternalError(detail::concat("mpi::", what, " before mpi::init() (or after finalize())"));
}

ThreadLevel from_mpi(int provided) {
  if (provided >= MPI_THREAD_MULTIPLE) return ThreadLevel::Multiple;
  if (provided >= MPI_THREAD_SERIALIZED) return ThreadLevel::Serialized;
  if (provided >= MPI_THREAD_FUNNELED) return ThreadLevel::Funneled;
  return ThreadLevel::Single;
}

}  // namespace

const char* thread_level_name(ThreadLevel level) {
  switch (level) {
    case ThreadLevel::Single:
      return "MPI_THREAD_SINGLE";
    case ThreadLevel::Funneled:
      return "MPI_THREAD_FUNNELED";
    case ThreadLevel::Serialized:
      return "MPI_THREAD_SERIALIZED";
    case ThreadLevel::Multiple:
      return "MPI_THREAD_MULTIPLE";
  }
  return "?";
}

ThreadLevel init() {
  Env& e = env();
  std::lock_guard<std::mutex> lk(e.mu);
  if (e.state == State::Ours || e.state == State::Adopted) return e.level;
  if (e.state == State::Finalized) throw Error("MPI cannot be initialised again after MPI_Finalize");
  int already = 0, provided = MPI_THREAD_SINGLE;
  MPI_Initialized(&already);
  if (already) {
    MPI_Query_thread(&provided);
    e.state = State::Adopted;
  } else {
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "Init_thread");
    e.state = State::Ours;
  }
  e.level = from_mpi(provided);
  e.init_thread = std::this_thread::get_id();
  if (e.level != ThreadLevel::Multiple)
    spdlog::warn("MPI provides {} only: an abort from a watch thread ends the process without MPI_Abort",
                 thread_level_name(e.level));
  return e.level;
}

bool initialized() {
  Env& e = env();
  std::lock_guard<std::mutex> lk(e.mu);
  return e.state == State::Ours || e.state == State::Adopted;
}

ThreadLevel thread_level() {
  require_init("thread_level");
  Env& e = env();
  std::lock_guard<std::mutex> lk(e.mu);
  return e.level;
}

bool under_mpirun() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"})
    if (const char* s = std::getenv(v); s && *s) return true;
  return false;
}

int world_rank() {
  require_init("world_rank");
  int r = 0;
  check(MPI_Comm_rank(MPI_COMM_WORLD, &r), "Comm_rank");
  return r;
}

int world_size() {
  require_init("world_size");
  int n = 1;
  check(MPI_Comm_size(MPI_COMM_WORLD, &n), "Comm_size");
  return n;
}

int node_index() {
  require_init("node_index");
  const int rank = world_rank();
  // Ranks sharing memory form a node; its lowest world rank (local rank 0,
  // the key orders by world rank) leads it; leaders are numbered in world
  // rank order and each tells its node.
  MPI_Comm node_comm = MPI_COMM_NULL, leaders = MPI_COMM_NULL;
  check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node_comm), "Comm_split_type");
  int local = 0;
  check(MPI_Comm_rank(node_comm, &local), "Comm_rank");
  check(MPI_Comm_split(MPI_COMM_WORLD, local == 0 ? 0 : MPI_UNDEFINED, rank, &leaders), "Comm_split");
  int node = 0;
  if (leaders != MPI_COMM_NULL) {
    check(MPI_Comm_rank(leaders, &node), "Comm_rank");
    MPI_Comm_free(&leaders);
  }
  check(MPI_Bcast(&node, 1, MPI_INT, 0, node_comm), "Bcast");
  MPI_Comm_free(&node_comm);
  return node;
}

std::string broadcast_string(const std::string& value, int root) {
  require_init("broadcast_string");
  if (value.size() > static_cast<size_t>(INT_MAX))
    throw InvalidArgument(detail::concat("mpi::broadcast_string: ", value.size(), " bytes exceed MPI's int count"));
  int len = static_cast<int>(value.size());
  check(MPI_Bcast(&len, 1, MPI_INT, root, MPI_COMM_WORLD), "Bcast");
  std::string out = value;
  out.resize(static_cast<size_t>(len));
  if (len > 0) check(MPI_Bcast(out.data(), len, MPI_CHAR, root, MPI_COMM_WORLD), "Bcast");
  return out;
}

void barrier() {
  require_init("barrier");
  check(MPI_Barrier(MPI_COMM_WORLD), "Barrier");
}

void abort(int code) {
  spdlog::default_logger()->flush();
  std::fflush(stdout);
  std::fflush(stderr);
  Env& e = env();
  bool mpi_abort = false;
  {
    // try_lock: abort() must not wait behind an init() or finalize() in progress.
    std::unique_lock<std::mutex> lk(e.mu, std::try_to_lock);
    mpi_abort = lk.owns_lock() && (e.state == State::Ours || e.state == State::Adopted) &&
                (e.level == ThreadLevel::Multiple || std::this_thread::get_id() == e.init_thread);
  }
  if (mpi_abort) MPI_Abort(MPI_COMM_WORLD, code);
  ::_exit(code);  // mpirun ends the job when a rank exits without MPI_Finalize
}

void finalize() {
  Env& e = env();
  std::lock_guard<std::mutex> lk(e.mu);
  if (e.state == State::Ours) {
    int done = 0;
    MPI_Finalized(&done);
    if (!done) MPI_Finalize();
  }
  if (e.state == State::Ours) e.state = State::Finalized;  // an adopted MPI stays its owner's
}

}  // namespace tessera::collectives::mpi

// The table of mpi_boot.h (exported from the module libtessera_mpi_boot.so,
// which is built with hidden visibility otherwise).
extern "C" __attribute__((visibility("default"))) const tessera::collectives::mpi::BootApi* tessera_mpi_boot_api() {
  namespace mpi = tessera::collectives::mpi;
  static const mpi::BootApi api{mpi::kBootApiVersion,  mpi::init,    mpi::world_rank, mpi::world_size, mpi::node_index,
                                mpi::broadcast_string, mpi::barrier, mpi::abort,      mpi::finalize};
  return &api;
}
