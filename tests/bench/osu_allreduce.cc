// A standalone MPI_Allreduce latency loop in the style of OSU's
// osu_allreduce (skip warm-up calls, time the rest, average the per-call
// latency over the ranks with MPI_Reduce), written independently of the
// bench's MPI peer so the test can hold `--compare mpi` to it. The calls are
// timed back to back after one barrier, as the bench times them (OSU times
// each call between barriers); the test passes the bench's call counts.
//
//   mpirun -np N osu_allreduce COUNT ITERS SKIP    prints "avg_us X" (rank 0)
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc != 4) {
    if (rank == 0) std::fprintf(stderr, "usage: osu_allreduce COUNT ITERS SKIP\n");
    MPI_Finalize();
    return 2;
  }
  const int count = std::atoi(argv[1]), iters = std::atoi(argv[2]), skip = std::atoi(argv[3]);
  std::vector<float> in(static_cast<size_t>(count) + 1, 1.0f), out(static_cast<size_t>(count) + 1, 0.0f);
  for (int i = 0; i < skip; ++i) MPI_Allreduce(in.data(), out.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  for (int i = 0; i < iters; ++i) MPI_Allreduce(in.data(), out.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  const double latency = (MPI_Wtime() - t0) * 1e6 / iters;
  double sum = 0;
  MPI_Reduce(&latency, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
  // The result is checked too: every rank contributed 1.0 per element.
  int bad = count > 0 && out[0] != static_cast<float>(size);
  int any_bad = 0;
  MPI_Reduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank == 0) std::printf("avg_us %.4f\n", sum / size);
  MPI_Finalize();
  return any_bad ? 1 : 0;
}
