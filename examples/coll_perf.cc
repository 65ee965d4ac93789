// coll_perf: tessera's shared-memory all-reduce against MPI_Allreduce, in the
// same processes and the same run, plus single-core memcpy bandwidth.
// MPI is reached through tessera's MPI backend (collectives/mpi/): its
// communicator makes one MPI_Allreduce per call (on a duplicate of
// MPI_COMM_WORLD), and mpi_env.h starts and ends MPI.
//
//   mpirun -np 2 build/bin/coll_perf [--iters-large N] [--iters-small N] [--mib M] [--rounds R]
//
// The ranks meet as every tessera program started by mpirun does
// (launcher/worker.h): rank 0 serves the coordinator, whose store the
// tessera communicator rendezvous through.
//
// Iteration counts are per round; rounds interleave all cases and each case
// reports its median round (the machine this was written on is shared).
//
// Bus bandwidth follows nccl-tests: busbw = 2 (p-1)/p * bytes / time.
// tessera runs twice for large messages: with buffers in the device's shared
// arena (peers read them in place: the "direct" algorithm) and with plain heap
// buffers (staged through the transport's channels: "ring").
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/mpi/mpi_env.h"
#include "launcher/worker.h"
#include "runtime/device.h"
#include "runtime/shm_memory.h"

using namespace tessera;
using namespace tessera::collectives;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// The MPI communicator: the reference all-reduce, and the timing's max.
std::shared_ptr<Communicator> g_mpi;

// Slowest rank's mean seconds per call of fn over iters calls.
template <typename Fn>
double time_op(int iters, int warmup, Fn fn) {
  for (int i = 0; i < warmup; ++i) fn();
  mpi::barrier();
  const double t0 = now();
  for (int i = 0; i < iters; ++i) fn();
  int64_t ns = static_cast<int64_t>((now() - t0) / iters * 1e9), worst = 0;
  g_mpi->all_reduce(&ns, &worst, 1, DType::I64, ReduceOp::Max);
  return static_cast<double>(worst) * 1e-9;
}

// Mean bandwidth of `iters` copies between two pre-faulted buffers, on one core.
// Per-call seconds of fn on this rank, appended to `out` (reserved by the caller).
template <typename Fn>
void time_each(int iters, Fn fn, std::vector<double>& out) {
  mpi::barrier();
  for (int i = 0; i < iters; ++i) {
    const double t0 = now();
    fn();
    out.push_back(now() - t0);
  }
}

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

double memcpy_bandwidth(std::vector<char>& a, std::vector<char>& b, int iters) {
  const double t0 = now();
  for (int i = 0; i < iters; ++i) {
    std::memcpy(b.data(), a.data(), a.size());
    a[static_cast<size_t>(i)] = b[a.size() - 1 - static_cast<size_t>(i)];  // keep the copies observable
  }
  return static_cast<double>(a.size()) * iters / (now() - t0);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

bool check(const float* v, size_t n, float expect) {
  for (size_t i = 0; i < n; i += 4099)
    if (v[i] != expect) return false;
  return v[n - 1] == expect;
}

}  // namespace

int run(int argc, char** argv) {
  CLI::App app("coll_perf: tessera's all-reduce against MPI_Allreduce, under mpirun -np N");
  int iters_large = 4, iters_small = 5000, rounds = 9;
  size_t mib = 64;
  app.add_option("--iters-large", iters_large, "Timed calls per round of the large all-reduce")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--iters-small", iters_small, "Timed calls per round of the 8-byte all-reduce")
      ->check(CLI::Range(1, 100000000));
  app.add_option("--mib", mib, "Size of the large all-reduce in MiB")->check(CLI::Range(size_t{1}, size_t{65536}));
  app.add_option("--rounds", rounds, "Interleaved rounds; each case reports its median round")
      ->check(CLI::Range(1, 10000));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help: 0; wrong flags: 2 with the message, before MPI starts
  }
  mpi::install();
  mpi::init();
  const int rank = mpi::world_rank(), size = mpi::world_size();
  const size_t bytes = mib << 20, n = bytes / 4;
  const double bus = 2.0 * (size - 1) / size;  // nccl-tests' all-reduce factor: 0 for one rank, as tessera bench prints

  // tessera's store: the job's, joined as every launched tessera rank joins
  // (launcher/worker.h: under mpirun rank 0 serves the coordinator).
  launcher::WorkerOptions wo;
  wo.create_communicator = false;
  wo.cpu_rotation = false;  // timing: mpirun's placement, as MPI's side has it
  launcher::WorkerContext job;
  try {
    job = launcher::init_worker(wo);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coll_perf: cannot join the job: %s\n", e.what());
    mpi::abort(1);
  }

  int rc = 0;
  {
    CommOptions mo;
    mo.transport = TransportKind::Mpi;
    mo.name = "mpi";
    g_mpi = Communicator::create(nullptr, rank, size, mo);
    CommOptions to;
    to.reach = job.reach;
    auto comm = Communicator::create(std::make_shared<PrefixStore>(job.store, "coll_perf/"), rank, size, to);
    Device dev(DeviceSpec::preset("trn1-core"), rank, make_shm_memory(size_t{4} << 30));
    auto* arena = static_cast<float*>(dev.allocate(bytes));
    std::vector<float> heap(n), mpi_send(n, 1.0f), mpi_recv(n);
    std::vector<char> copy_a(rank == 0 ? bytes : 1, 1), copy_b(rank == 0 ? bytes : 1, 2);
    // Fault in the pages the timed loops use.
    std::fill(mpi_recv.begin(), mpi_recv.end(), 0.0f);

    // The machine is shared: the cases are interleaved in `rounds` rounds and
    // each reports its median round, so a noisy neighbour hits all alike.
    float small[2] = {1, 1}, small_out[2];
    std::fill(arena, arena + n, 1.0f);
    auto* arena_out = static_cast<float*>(dev.allocate(bytes));
    std::fill(heap.begin(), heap.end(), 1.0f);
    std::vector<float> heap_out(n);
    std::vector<double> v_memcpy, v_mpi_small, v_tes_small, v_mpi_large, v_tes_arena, v_tes_heap;
    std::string small_algo, arena_algo, heap_algo;
    std::vector<double> each_mpi, each_tes;  // per-call 8-byte latencies (rank 0)
    each_mpi.reserve(static_cast<size_t>(iters_small) * rounds);
    each_tes.reserve(static_cast<size_t>(iters_small) * rounds);
    double modeled = 0;
    for (int round = 0; round < rounds; ++round) {
      double bw = 0;
      if (rank == 0)
        bw = memcpy_bandwidth(copy_a, copy_b, iters_large);  // one core copying, the others idle in the barrier
      mpi::barrier();
      v_memcpy.push_back(bw);
      // Alternate which library goes first, so neither always runs right
      // after the other (order effects on a shared machine cancel out).
      auto mpi8 = [&] {
        v_mpi_small.push_back(
            time_op(iters_small, 500, [&] { g_mpi->all_reduce(small, small_out, 2, DType::F32, ReduceOp::Sum); }));
      };
      auto tes8 = [&] {
        v_tes_small.push_back(
            time_op(iters_small, 500, [&] { comm->all_reduce(small, small_out, 2, DType::F32, ReduceOp::Sum); }));
      };
      if (round % 2 == 0) {
        mpi8();
        tes8();
      } else {
        tes8();
        mpi8();
      }
      small_algo = comm->last_algorithm();
      rc |= small_out[0] != static_cast<float>(size);
      time_each(
          iters_small, [&] { g_mpi->all_reduce(small, small_out, 2, DType::F32, ReduceOp::Sum); }, each_mpi);
      time_each(
          iters_small, [&] { comm->all_reduce(small, small_out, 2, DType::F32, ReduceOp::Sum); }, each_tes);
      v_mpi_large.push_back(time_op(
          iters_large, 1, [&] { g_mpi->all_reduce(mpi_send.data(), mpi_recv.data(), n, DType::F32, ReduceOp::Sum); }));
      rc |= !check(mpi_recv.data(), n, static_cast<float>(size));
      v_tes_arena.push_back(
          time_op(iters_large, 1, [&] { comm->all_reduce(arena, arena_out, n, DType::F32, ReduceOp::Sum); }));
      arena_algo = comm->last_algorithm();
      rc |= !check(arena_out, n, static_cast<float>(size));
      v_tes_heap.push_back(time_op(
          iters_large, 1, [&] { comm->all_reduce(heap.data(), heap_out.data(), n, DType::F32, ReduceOp::Sum); }));
      heap_algo = comm->last_algorithm();
      modeled = comm->last_modeled_seconds();
      rc |= !check(heap_out.data(), n, static_cast<float>(size));
    }
    const double memcpy_bw = median(v_memcpy), mpi_small = median(v_mpi_small), tes_small = median(v_tes_small),
                 mpi_large = median(v_mpi_large), tes_arena = median(v_tes_arena), tes_heap = median(v_tes_heap);

    if (rank == 0) {
      std::printf(
          "coll_perf: %d ranks, f32 sum, %zu MiB, medians of %d interleaved rounds; single-core memcpy %.2f GB/s\n",
          size, mib, rounds, memcpy_bw / 1e9);
      std::printf("%-34s %12s %12s %14s\n", "case", "time", "busbw GB/s", "vs OpenMPI");
      std::printf("%-34s %10.2f us %12s %14s\n", "MPI_Allreduce 8 B", mpi_small * 1e6, "-", "1.00x");
      std::printf("%-34s %10.2f us %12s %13.2fx\n", ("tessera 8 B (" + small_algo + ")").c_str(), tes_small * 1e6, "-",
                  mpi_small / tes_small);
      std::printf("  8 B per call on rank 0: MPI p50 %.2f us p99 %.2f us; tessera p50 %.2f us p99 %.2f us\n",
                  percentile(each_mpi, 0.5) * 1e6, percentile(each_mpi, 0.99) * 1e6, percentile(each_tes, 0.5) * 1e6,
                  percentile(each_tes, 0.99) * 1e6);
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
  int32_t any = 0;
  g_mpi->all_reduce(&rc, &any, 1, DType::I32, ReduceOp::Max);
  g_mpi.reset();
  launcher::shutdown(job);
  mpi::finalize();
  return any ? 1 : 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coll_perf: %s\n", e.what());
    return 1;
  } catch (...) {
    std::fprintf(stderr, "coll_perf: unknown error\n");
    return 1;
  }
}
