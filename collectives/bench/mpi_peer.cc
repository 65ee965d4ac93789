// tessera_mpi_peer: the MPI side of `tessera bench --compare mpi`.
//
// A plain MPI program (no tessera communicator, no threads of tessera's):
// the front-end (launcher/bench_cli.cc) runs it under mpirun with the best
// settings for the rank count, before the tessera ranks, and hands its
// figures to them. It times MPI's own collective for each element count the
// way the bench times tessera's (collectives/bench/bench.cc): buffers
// allocated once at the largest size and pre-faulted, `warmup` untimed calls,
// a barrier, `iters` back-to-back calls; the time per call is averaged over
// the ranks (nccl-tests' convention).
//
//   mpirun -np N tessera_mpi_peer --out FILE [--budget S] OP DTYPE REDOP ROOT ITERS WARMUP COUNT...
//
// OP, DTYPE and REDOP take the names the bench prints (all_reduce, f32, sum,
// ...); COUNT is the row's element count (the gathered buffer for
// all_gather, the input for reduce_scatter and all_to_all). FILE gets, from
// rank 0, a line `# library <MPI library version>` and then `COUNT TIME_US
// iters=N warmup=M` per count (the calls timed and warmed up). --budget S
// caps the timed calls of a size at about S seconds (measured on the
// warm-up; at least 5 calls) and its warm-up at about S / 4 (measured on
// the first 5 calls). Bad arguments exit 2 with usage.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/bench/bench.h"  // kJobWarmupSmallCalls
#include "runtime/dtype.h"
#include "runtime/files.h"

namespace {

int usage(int rank, const std::string& why) {
  if (rank == 0)
    std::fprintf(stderr,
                 "tessera_mpi_peer: %s\nusage: mpirun -np N tessera_mpi_peer --out FILE [--budget S] OP DTYPE REDOP "
                 "ROOT ITERS WARMUP COUNT...\n",
                 why.c_str());
  MPI_Finalize();
  return 2;
}

bool parse_long(const char* s, long lo, long* out) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (!end || *end || end == s || v < lo) return false;
  *out = v;
  return true;
}

// bf16 and f16 have no MPI type: 16-bit words with a user-defined op that
// widens each pair to f32 (as tessera's MPI backend does).
template <float (*ToF)(uint16_t), uint16_t (*FromF)(float), int Kind>
void op16(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = ToF(a[i]), y = ToF(b[i]);
    const float z = Kind == 0 ? x + y : Kind == 1 ? x * y : Kind == 2 ? std::min(x, y) : std::max(x, y);
    b[i] = FromF(z);
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);  // MPI_THREAD_SINGLE: one thread, MPI's fastest level
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() < 2 || args[0] != "--out") return usage(rank, "--out FILE must come first");
  const std::string out_path = args[1];
  args.erase(args.begin(), args.begin() + 2);
  double budget = 0;  // seconds per size, 0: no cap
  if (args.size() >= 2 && args[0] == "--budget") {
    char* end = nullptr;
    budget = std::strtod(args[1].c_str(), &end);
    if (!end || *end || budget < 0) return usage(rank, "bad --budget '" + args[1] + "'");
    args.erase(args.begin(), args.begin() + 2);
  }
  if (args.size() < 7) return usage(rank, "missing arguments");
  const std::string op = args[0], dt = args[1], red = args[2];
  long root = 0, iters = 0, warmup = 0;
  if (!parse_long(args[3].c_str(), 0, &root) || root >= n) return usage(rank, "bad ROOT '" + args[3] + "'");
  if (!parse_long(args[4].c_str(), 1, &iters)) return usage(rank, "bad ITERS '" + args[4] + "'");
  if (!parse_long(args[5].c_str(), 0, &warmup)) return usage(rank, "bad WARMUP '" + args[5] + "'");
  std::vector<long> counts;
  for (size_t i = 6; i < args.size(); ++i) {
    long c = 0;
    if (!parse_long(args[i].c_str(), 0, &c) || c > (1L << 31) - 1) return usage(rank, "bad COUNT '" + args[i] + "'");
    counts.push_back(c);
  }

  MPI_Datatype type = MPI_FLOAT;
  size_t es = 4;
  bool is16 = false, is_bf16 = false;
  if (dt == "f32") {
  } else if (dt == "i32") {
    type = MPI_INT32_T;
  } else if (dt == "i64") {
    type = MPI_INT64_T, es = 8;
  } else if (dt == "bf16" || dt == "f16") {
    type = MPI_UINT16_T, es = 2, is16 = true, is_bf16 = dt == "bf16";
  } else {
    return usage(rank, "unknown DTYPE '" + dt + "' (f32, bf16, f16, i32, i64)");
  }
  MPI_Op mop = MPI_SUM;
  int kind = 0;
  if (red == "sum" || red == "avg" || red == "none") {  // avg: MPI has none; the sum is what moves
  } else if (red == "prod") {
    mop = MPI_PROD, kind = 1;
  } else if (red == "min") {
    mop = MPI_MIN, kind = 2;
  } else if (red == "max") {
    mop = MPI_MAX, kind = 3;
  } else {
    return usage(rank, "unknown REDOP '" + red + "' (sum, prod, min, max, avg)");
  }
  if (is16) {
    using namespace tessera;
    MPI_User_function* f = nullptr;
    if (is_bf16) {
      MPI_User_function* fs[4] = {
          op16<bf16_bits_to_float, float_to_bf16_bits, 0>, op16<bf16_bits_to_float, float_to_bf16_bits, 1>,
          op16<bf16_bits_to_float, float_to_bf16_bits, 2>, op16<bf16_bits_to_float, float_to_bf16_bits, 3>};
      f = fs[kind];
    } else {
      MPI_User_function* fs[4] = {
          op16<f16_bits_to_float, float_to_f16_bits, 0>, op16<f16_bits_to_float, float_to_f16_bits, 1>,
          op16<f16_bits_to_float, float_to_f16_bits, 2>, op16<f16_bits_to_float, float_to_f16_bits, 3>};
      f = fs[kind];
    }
    MPI_Op_create(f, 1, &mop);
  }

  long max_count = 0;
  for (long c : counts) max_count = std::max(max_count, c);
  const size_t bytes = std::max<size_t>(static_cast<size_t>(max_count) * es, 64);
  auto alloc = [&] {
    void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (!p) MPI_Abort(MPI_COMM_WORLD, 1);
    std::memset(p, 0, bytes);  // pre-fault; zeros reduce to zeros in every dtype and op
    return p;
  };
  void* send = alloc();
  void* recv = alloc();

  auto call = [&](long count) {
    const int c = static_cast<int>(count), blk = static_cast<int>(count / n);
    if (op == "all_reduce") return MPI_Allreduce(send, recv, c, type, mop, MPI_COMM_WORLD);
    if (op == "all_gather") return MPI_Allgather(send, blk, type, recv, blk, type, MPI_COMM_WORLD);
    if (op == "reduce_scatter") return MPI_Reduce_scatter_block(send, recv, blk, type, mop, MPI_COMM_WORLD);
    if (op == "all_to_all") return MPI_Alltoall(send, blk, type, recv, blk, type, MPI_COMM_WORLD);
    if (op == "broadcast") return MPI_Bcast(recv, c, type, static_cast<int>(root), MPI_COMM_WORLD);
    if (op == "reduce") return MPI_Reduce(send, recv, c, type, mop, static_cast<int>(root), MPI_COMM_WORLD);
    // sendrecv: to rank+1, from rank-1 (MPI_Sendrecv never deadlocks around the ring).
    return MPI_Sendrecv(send, c, type, (rank + 1) % n, 7, recv, c, type, (rank + n - 1) % n, 7, MPI_COMM_WORLD,
                        MPI_STATUS_IGNORE);
  };
  const char* ops[] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "sendrecv"};
  if (std::none_of(std::begin(ops), std::end(ops), [&](const char* o) { return op == o; }))
    return usage(rank, "unknown OP '" + op + "'");

  // The job's warm-up, as the bench's (collectives/bench/bench.h,
  // kJobWarmupSmallCalls): `warmup` calls at the largest count, then at
  // least kJobWarmupSmallCalls at the smallest.
  const long smallest = *std::min_element(counts.begin(), counts.end());
  for (long i = 0; i < warmup; ++i) call(max_count);
  for (long i = 0; i < std::max<long>(warmup, tessera::collectives::bench::kJobWarmupSmallCalls); ++i) call(smallest);

  std::vector<double> times;
  std::vector<long> used, warmed;
  for (long count : counts) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double w0 = MPI_Wtime();
    // A setting that makes a call take milliseconds (mpi_yield_when_idle 0
    // with ranks > cores on a busy machine) would take minutes at ITERS:
    // rank 0 caps the warm-up at about budget / 4 seconds (timed on its
    // first 5 calls) and the iterations so one size takes about `budget`
    // seconds (at least 5 calls; the file says how many ran). Calls of
    // microseconds are never capped.
    long warm = warmup;
    const long probe = std::min(warmup, 5L);
    for (long i = 0; i < probe; ++i) call(count);
    if (budget > 0 && warmup > probe) {
      const double per_probe = (MPI_Wtime() - w0) / static_cast<double>(probe);
      if (per_probe * static_cast<double>(warmup) > budget / 4)
        warm = std::max(probe, static_cast<long>(budget / 4 / per_probe));
      MPI_Bcast(&warm, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    }
    for (long i = probe; i < warm; ++i) call(count);
    long it = iters;
    if (warm > 0 && budget > 0) {
      const double per_warm = (MPI_Wtime() - w0) / static_cast<double>(warm);
      if (per_warm * static_cast<double>(iters) > budget) it = std::max(5L, static_cast<long>(budget / per_warm));
    }
    MPI_Bcast(&it, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    for (long i = 0; i < it; ++i) call(count);
    const double per = (MPI_Wtime() - t0) / static_cast<double>(it);
    double sum = 0;
    MPI_Reduce(&per, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    times.push_back(sum / n * 1e6);
    used.push_back(it);
    warmed.push_back(warm);
  }
  int code = 0;
  if (rank == 0) {
    char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int len = 0;
    MPI_Get_library_version(lib, &len);
    std::string first(lib, strnlen(lib, sizeof lib));
    first = first.substr(0, first.find_first_of("\n,"));
    std::string text = "# library " + first + "\n";
    for (size_t i = 0; i < counts.size(); ++i) {
      char line[160];
      std::snprintf(line, sizeof line, "%ld %.6f iters=%ld warmup=%ld\n", counts[i], times[i], used[i], warmed[i]);
      text += line;
    }
    try {
      tessera::write_file_atomic(out_path, text);  // the front-end reads a whole file or none
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tessera_mpi_peer: cannot write '%s': %s\n", out_path.c_str(), e.what());
      code = 1;
    }
  }
  std::free(send);
  std::free(recv);
  if (is16) MPI_Op_free(&mop);
  MPI_Finalize();
  return code;
}
