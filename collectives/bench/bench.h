// tessera bench: collective bandwidth, measured the way nccl-tests and
// nccom-test measure it (docs/bench.md).
//
// This header is the testable core: op names, bus-bandwidth factors, size
// parsing and sweeps, the exactly-known input/expected values behind
// --check, the table and JSON formats, and run_bench(), which drives one
// Communicator through a size sweep. One rank's run (store, communicators,
// output) is bench_rank.h; flags and spawning ranks are the front-end's
// (launcher/bench_cli.cc).
//
// Threads: everything here runs on the calling thread; run_bench() must be
// called by every rank of the communicator (it issues collectives).
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "runtime/dtype.h"
#include "runtime/netmodel.h"

namespace tessera::collectives::bench {

enum class BenchOp { AllReduce, AllGather, ReduceScatter, AllToAll, Broadcast, Reduce, SendRecv };

// Accepts nccl-tests names (all_reduce, all_gather, reduce_scatter, alltoall,
// broadcast, reduce, sendrecv), nccom-test's short names (allr, allg, redsct,
// alltoall) and all_to_all; throws InvalidArgument listing them.
BenchOp parse_bench_op(const std::string& s);
const char* bench_op_name(BenchOp op);
// True for ops that take a reduction operator (the redop column).
bool op_reduces(BenchOp op);
// busbw = algbw * bus_factor: all-reduce 2(n-1)/n; all-gather, reduce-scatter,
// all-to-all (n-1)/n; broadcast, reduce, sendrecv 1.
double bus_factor(BenchOp op, int nranks);

// "8", "64K", "1M", "1G" (binary units, case-insensitive, optional trailing
// "B"/"iB"); throws InvalidArgument naming the text.
size_t parse_size(const std::string& s);
// min..max (inclusive) multiplying by factor when factor > 1, else adding
// step (> 0). Throws InvalidArgument when min > max or the sweep cannot advance.
std::vector<size_t> size_sweep(size_t min_bytes, size_t max_bytes, double factor, size_t step_bytes);

// Element count of the row for `bytes`, nccl-tests style: ops that split the
// buffer into one block per rank round down to a multiple of nranks.
// `count` is the elements of the largest buffer (the gathered one for
// all-gather, the input for reduce-scatter).
size_t row_count(BenchOp op, size_t bytes, DType dtype, int nranks);

struct Result {
  double time_us = 0;  // mean over iterations, averaged over ranks
  double algbw_gbps = 0;
  double busbw_gbps = 0;
  int64_t wrong = -1;  // -1: not checked
};

struct Row {
  size_t size_bytes = 0;
  size_t count = 0;
  Result oop;
  std::optional<Result> ip;  // absent when the op has no in-place form (sendrecv)
  double modeled_busbw_gbps = 0;
  std::optional<double> compare_busbw_gbps;  // --compare mpi: MPI's own, out-of-place
  std::optional<double> compare_time_us;     // the same measurement as a time per call
  std::string compare_setting;               // which MPI setting gave it, when several were tried
  std::string algorithm;                     // last_algorithm() of the timed calls (JSON only)
};

struct Report {
  std::string op, transport, algo, dtype, redop;
  int ranks = 1;
  std::vector<Row> rows;
  std::optional<double> memcpy_gbps, tcp_loopback_gbps, tcp_loopback_unidir_gbps;
  // memcpy by every rank at once, per rank (the slowest rank's figure).
  std::optional<double> memcpy_all_gbps;
  std::string compare;           // "mpi" or empty
  std::string compare_settings;  // how the compared library ran (a header line), e.g. mpirun's flags

  // Mean busbw over every measured out-of-place and in-place result (as nccl-tests).
  double avg_busbw_gbps() const;
  int64_t total_wrong() const;
};

std::string format_header(const Report& r);
std::string format_row(const Report& r, const Row& row);
// Header, rows, then the baselines and "# Avg bus bandwidth : X".
std::string format_table(const Report& r);
nlohmann::json to_json(const Report& r);

// ---- exactly-known data for --check --------------------------------------
// Every value is a small integer, so sums, products, min/max and averages are
// exact in every dtype (including bf16) for the group sizes the bench runs.
//
// Input element i of rank r for a reducing op.
double reduce_input(ReduceOp op, int rank, int nranks, size_t i);
// The reduction over all ranks of reduce_input(op, *, nranks, i).
double reduce_expected(ReduceOp op, int nranks, size_t i);
// Input element i of rank r for a data-movement op (gather, all-to-all, broadcast, sendrecv).
double move_input(int rank, size_t i);

double load(const void* buf, DType dtype, size_t i);
void store(void* buf, DType dtype, size_t i, double v);

// ---- the sweep --------------------------------------------------------------
// Before the first size both the bench and its MPI peer warm up once, as
// nccl-tests does (`warmup` calls at the largest size, then at least this
// many at the smallest): OpenMPI's shared-memory BTL gives a peer its fast
// box only after btl_vader_fbox_threshold (16) sends to it, so with 5
// warm-up calls MPI's first size timed its slow path (4-11x at 8 B).
inline constexpr int kJobWarmupSmallCalls = 32;

struct BenchConfig {
  BenchOp op = BenchOp::AllReduce;
  std::vector<size_t> sizes;
  int iters = 20;
  int warmup = 5;
  DType dtype = DType::F32;
  ReduceOp redop = ReduceOp::Sum;
  bool check = true;
  int root = 0;
  // Fault hook for testing #wrong: this rank corrupts one element of every
  // result before it is checked (-1: none). TESSERA_BENCH_CORRUPT=rank sets it.
  int corrupt_rank = -1;
};

// Buffers for the sweep, allocated once at the largest size and pre-faulted.
// Default: page-aligned anonymous memory; a caller may pass its own
// (e.g. memory from a shared-memory arena) of at least bytes_needed() each.
size_t bytes_needed(const BenchConfig& cfg, int nranks);

// Runs the sweep on `comm` (every rank calls it). When `compare` is given,
// each size also runs out-of-place through it (MPI's own collectives, in the
// same processes: used under mpirun) and the row records its time and busbw.
// Rows are complete on every rank.
std::vector<Row> run_bench(Communicator& comm, const BenchConfig& cfg, Communicator* compare = nullptr,
                           void* send_buf = nullptr, void* recv_buf = nullptr);

// The element counts of the rows run_bench() measures for `cfg` on `nranks`
// ranks (sizes that round to the same count as the previous row are skipped).
std::vector<size_t> row_counts(const BenchConfig& cfg, int nranks);

// MPI's figures measured by tessera_mpi_peer (collectives/bench/mpi_peer.cc)
// for --compare mpi: per element count, the time per call and which of the
// settings tried gave it (the fastest is kept).
struct CompareFigure {
  double time_us = 0;
  std::string setting;
};
using CompareFigures = std::vector<std::pair<size_t, CompareFigure>>;
// Reads "COUNT TIME_US [SETTING]" lines ('#' lines skipped); throws
// FormatError naming the file and line.
CompareFigures read_compare_figures(const std::string& path);
void write_compare_figures(const std::string& path, const CompareFigures& f);
// Fills the rows' compare columns from `f` (by element count).
void apply_compare_figures(Report& r, const CompareFigures& f, int nranks, BenchOp op);

// Single-core memcpy bandwidth on pre-faulted buffers of `bytes` (GB/s,
// counting the bytes copied once, as the busbw of a copy).
double measure_memcpy_gbps(size_t bytes, int reps);
// The same copy made by every rank of `comm` at once, between barriers:
// bytes x reps over the slowest rank's time (GB/s per rank). What the
// memory system gives each rank when all copy together: the yardstick for a
// shared-memory collective whose ranks each move a memcpy's worth of bytes
// (not a bound: streaming stores and writes into cached lines beat it).
// Every rank must call it; every rank gets the figure.
double measure_memcpy_all_gbps(Communicator& comm, size_t bytes, int reps);

// Raw TCP loopback throughput between this process and a peer process over
// Boost.Asio: `bytes` streamed `reps` times. Two figures: one direction only,
// and per direction with both directions streaming at once (what a 2-rank
// ring needs). With a communicator of >= 2 ranks, ranks 0 and 1 measure
// (every rank must call it); with one rank, a forked child is the peer.
struct TcpBaseline {
  double unidir_gbps = 0;
  double bidir_gbps = 0;  // per direction
};
TcpBaseline measure_tcp_loopback(Communicator& comm, size_t bytes, int reps);

// Writes a gnuplot script and runs gnuplot to draw busbw vs size (log x) as a
// PNG. Throws Error naming the file when gnuplot fails.
void plot_png(const Report& r, const std::string& png_path);

}  // namespace tessera::collectives::bench
