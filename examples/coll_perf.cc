// coll_perf: tessera's shared-memory all-reduce against MPI_Allreduce, in the
// same processes and the same run, plus single-core memcpy bandwidth.
//
//   mpirun -np 2 build/bin/coll_perf [--iters-large N] [--iters-small N] [--mib M]
//
// Bus bandwidth follows nccl-tests: busbw = 2 (p-1)/p * bytes / time.
// tessera runs twice for large messages: with buffers in the device's shared
// arena (peers read them in place: the "direct" algorithm) and with plain heap
// buffers (staged through the transport's channels: "ring").
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "runtime/device.h"
#include "runtime/shm_memory.h"

using namespace tessera;
using namespace tessera::coll;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Slowest rank's mean seconds per call of fn over iters calls.
template <typename Fn>
double time_op(int iters, int warmup, Fn fn) {
  for (int i = 0; i < warmup; ++i) fn();
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = now();
  for (int i = 0; i < iters; ++i) fn();
  double dt = (now() - t0) / iters, worst = 0;
  MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

double memcpy_bandwidth(size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 2);  // touched: no first-touch faults in the timing
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    const double t0 = now();
    std::memcpy(b.data(), a.data(), bytes);
    best = std::min(best, now() - t0);
    a[i] = b[bytes - 1 - i];  // keep the copies observable
  }
  return static_cast<double>(bytes) / best;
}

bool check(const float* v, size_t n, float expect) {
  for (size_t i = 0; i < n; i += 4099)
    if (v[i] != expect) return false;
  return v[n - 1] == expect;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int iters_large = 20, iters_small = 20000;
  size_t mib = 64;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        if (rank == 0) std::fprintf(stderr, "coll_perf: %s needs a value\n", a.c_str());
        MPI_Finalize();
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--iters-large")
      iters_large = std::atoi(next());
    else if (a == "--iters-small")
      iters_small = std::atoi(next());
    else if (a == "--mib")
      mib = static_cast<size_t>(std::atol(next()));
    else {
      if (rank == 0)
        std::fprintf(stderr, "usage: mpirun -np N coll_perf [--iters-large N] [--iters-small N] [--mib M]\n");
      MPI_Finalize();
      return 2;
    }
  }
  const size_t bytes = mib << 20, n = bytes / 4;
  const double bus = size > 1 ? 2.0 * (size - 1) / size : 1.0;

  // Rendezvous directory for tessera's store, chosen by rank 0.
  char dir[4096] = {0};
  if (rank == 0) {
    std::string t = (std::filesystem::temp_directory_path() / "coll_perf-XXXXXX").string();
    if (!::mkdtemp(t.data())) {
      std::perror("mkdtemp");
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    std::snprintf(dir, sizeof dir, "%s", t.c_str());
  }
  MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);

  int rc = 0;
  {
    auto comm = Communicator::create(make_file_store(dir), rank, size);
    Device dev(DeviceSpec::preset("trn1-core"), rank, make_shm_memory(size_t{4} << 30));
    auto* arena = static_cast<float*>(dev.allocate(bytes));
    std::vector<float> heap(n), mpi_send(n, 1.0f), mpi_recv(n);

    const double memcpy_bw = memcpy_bandwidth(bytes);

    // ---- 8 bytes ----
    float small[2] = {1, 1}, small_out[2];
    const double mpi_small =
        time_op(iters_small, 1000, [&] { MPI_Allreduce(small, small_out, 2, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); });
    const double tes_small =
        time_op(iters_small, 1000, [&] { comm->all_reduce(small, small_out, 2, DType::F32, ReduceOp::Sum); });
    const std::string small_algo = comm->last_algorithm();
    rc |= small_out[0] != static_cast<float>(size);

    // ---- large: results must be exact (all ones summed) ----
    const double mpi_large = time_op(iters_large, 2, [&] {
      MPI_Allreduce(mpi_send.data(), mpi_recv.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    });
    rc |= !check(mpi_recv.data(), n, static_cast<float>(size));
    std::fill(arena, arena + n, 1.0f);
    auto* arena_out = static_cast<float*>(dev.allocate(bytes));
    const double tes_arena =
        time_op(iters_large, 2, [&] { comm->all_reduce(arena, arena_out, n, DType::F32, ReduceOp::Sum); });
    const std::string arena_algo = comm->last_algorithm();
    rc |= !check(arena_out, n, static_cast<float>(size));
    std::fill(heap.begin(), heap.end(), 1.0f);
    std::vector<float> heap_out(n);
    const double tes_heap =
        time_op(iters_large, 2, [&] { comm->all_reduce(heap.data(), heap_out.data(), n, DType::F32, ReduceOp::Sum); });
    const std::string heap_algo = comm->last_algorithm();
    rc |= !check(heap_out.data(), n, static_cast<float>(size));
    const double modeled = comm->last_modeled_seconds();

    if (rank == 0) {
      std::printf("coll_perf: %d ranks, f32 sum, %zu MiB, single-core memcpy %.2f GB/s\n", size, mib, memcpy_bw / 1e9);
      std::printf("%-34s %12s %12s %14s\n", "case", "time", "busbw GB/s", "vs OpenMPI");
      std::printf("%-34s %10.2f us %12s %14s\n", "MPI_Allreduce 8 B", mpi_small * 1e6, "-", "1.00x");
      std::printf("%-34s %10.2f us %12s %13.2fx\n", ("tessera 8 B (" + small_algo + ")").c_str(), tes_small * 1e6, "-",
                  mpi_small / tes_small);
      auto line = [&](const std::string& name, double t) {
        const double bw = bus * static_cast<double>(bytes) / t;
        std::printf("%-34s %10.2f ms %12.2f %13.2fx  (%.0f%% of memcpy)\n", name.c_str(), t * 1e3, bw / 1e9,
                    mpi_large / t, 100.0 * bw / memcpy_bw);
      };
      line("MPI_Allreduce " + std::to_string(mib) + " MiB", mpi_large);
      line("tessera " + std::to_string(mib) + " MiB arena (" + arena_algo + ")", tes_arena);
      line("tessera " + std::to_string(mib) + " MiB heap (" + heap_algo + ")", tes_heap);
      std::printf("modeled NeuronLink time of the heap all-reduce (default ring model): %.3f ms\n", modeled * 1e3);
      if (rc) std::printf("RESULT CHECK FAILED\n");
    }
    dev.free(arena, bytes);
    dev.free(arena_out, bytes);
    comm->barrier();
  }
  int any = 0;
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) std::filesystem::remove_all(dir);
  MPI_Finalize();
  return any ? 1 : 0;
}
