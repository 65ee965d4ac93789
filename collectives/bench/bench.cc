#include "collectives/bench/bench.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "runtime/error.h"
#include "runtime/files.h"

namespace tessera::collectives::bench {

// ---- names, factors, sizes ---------------------------------------------------

BenchOp parse_bench_op(const std::string& s) {
  if (s == "all_reduce" || s == "allr" || s == "allreduce") return BenchOp::AllReduce;
  if (s == "all_gather" || s == "allg" || s == "allgather") return BenchOp::AllGather;
  if (s == "reduce_scatter" || s == "redsct" || s == "reducescatter") return BenchOp::ReduceScatter;
  if (s == "all_to_all" || s == "alltoall") return BenchOp::AllToAll;
  if (s == "broadcast" || s == "bcast") return BenchOp::Broadcast;
  if (s == "reduce") return BenchOp::Reduce;
  if (s == "sendrecv") return BenchOp::SendRecv;
  throw InvalidArgument("unknown operation '" + s +
                        "': expected all_reduce (allr), all_gather (allg), reduce_scatter (redsct), "
                        "all_to_all (alltoall), broadcast, reduce or sendrecv");
}

const char* bench_op_name(BenchOp op) {
  switch (op) {
    case BenchOp::AllReduce:
      return "all_reduce";
    case BenchOp::AllGather:
      return "all_gather";
    case BenchOp::ReduceScatter:
      return "reduce_scatter";
    case BenchOp::AllToAll:
      return "all_to_all";
    case BenchOp::Broadcast:
      return "broadcast";
    case BenchOp::Reduce:
      return "reduce";
    case BenchOp::SendRecv:
      return "sendrecv";
  }
  return "?";
}

bool op_reduces(BenchOp op) {
  return op == BenchOp::AllReduce || op == BenchOp::ReduceScatter || op == BenchOp::Reduce;
}

double bus_factor(BenchOp op, int n) {
  TESSERA_CHECK(n >= 1, "nranks ", n);
  switch (op) {
    case BenchOp::AllReduce:
      return 2.0 * (n - 1) / n;
    case BenchOp::AllGather:
    case BenchOp::ReduceScatter:
    case BenchOp::AllToAll:
      return static_cast<double>(n - 1) / n;
    case BenchOp::Broadcast:
    case BenchOp::Reduce:
    case BenchOp::SendRecv:
      return 1.0;
  }
  return 1.0;
}

static bool splits_per_rank(BenchOp op) {
  return op == BenchOp::AllGather || op == BenchOp::ReduceScatter || op == BenchOp::AllToAll;
}

size_t parse_size(const std::string& text) {
  std::string s = text;
  auto bad = [&] { return InvalidArgument("bad size '" + text + "': expected bytes such as 8, 64K, 1M or 1G"); };
  if (s.empty()) throw bad();
  // Strip an optional trailing "B" / "iB".
  if (s.size() > 1 && (s.back() == 'B' || s.back() == 'b')) {
    s.pop_back();
    if (s.size() > 1 && (s.back() == 'i' || s.back() == 'I')) s.pop_back();
  }
  uint64_t mult = 1;
  switch (s.empty() ? '\0' : s.back()) {
    case 'k':
    case 'K':
      mult = 1ull << 10;
      break;
    case 'm':
    case 'M':
      mult = 1ull << 20;
      break;
    case 'g':
    case 'G':
      mult = 1ull << 30;
      break;
    case 't':
    case 'T':
      mult = 1ull << 40;
      break;
    default:
      break;
  }
  if (mult != 1) s.pop_back();
  if (s.empty() || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) throw bad();
  if (s.size() > 15) throw bad();
  uint64_t v = std::stoull(s);
  if (v > (uint64_t{1} << 50) / mult) throw bad();
  return static_cast<size_t>(v * mult);
}

std::vector<size_t> size_sweep(size_t min_bytes, size_t max_bytes, double factor, size_t step_bytes) {
  if (min_bytes > max_bytes)
    throw InvalidArgument("minbytes (" + std::to_string(min_bytes) + ") is larger than maxbytes (" +
                          std::to_string(max_bytes) + ")");
  std::vector<size_t> out;
  if (factor > 1.0) {
    double s = static_cast<double>(min_bytes);
    if (s == 0) {
      out.push_back(0);
      s = 1;  // a zero start would never advance; nccl-tests users start at >= 1 anyway
    }
    for (; s <= static_cast<double>(max_bytes); s *= factor) {
      auto v = static_cast<size_t>(s);
      if (out.empty() || out.back() != v) out.push_back(v);
      if (out.size() > 4096) throw InvalidArgument("size sweep has more than 4096 sizes");
    }
  } else {
    if (step_bytes == 0 && min_bytes != max_bytes)
      throw InvalidArgument("stepbytes must be > 0 when minbytes != maxbytes (or give -f > 1)");
    for (size_t s = min_bytes; s <= max_bytes; s += step_bytes) {
      out.push_back(s);
      if (step_bytes == 0) break;
      if (out.size() > 4096) throw InvalidArgument("size sweep has more than 4096 sizes");
    }
  }
  return out;
}

size_t row_count(BenchOp op, size_t bytes, DType dtype, int n) {
  size_t count = bytes / dtype_size(dtype);
  if (splits_per_rank(op)) count = count / static_cast<size_t>(n) * static_cast<size_t>(n);
  return count;
}

// ---- exactly-known values ----------------------------------------------------

double reduce_input(ReduceOp op, int r, int n, size_t i) {
  switch (op) {
    case ReduceOp::Sum:
      return static_cast<double>((static_cast<size_t>(r) + i) % 4 + 1);
    case ReduceOp::Prod:
      return static_cast<double>(1 + (static_cast<size_t>(r) + i) % 2);
    case ReduceOp::Min:
    case ReduceOp::Max:
      return static_cast<double>((static_cast<size_t>(r) * 5 + i) % 7);
    case ReduceOp::Avg: {
      // Offsets +1/-1 in pairs (0 for an odd last rank) sum to zero, so the
      // average is the integer i % 4 + 1 exactly.
      int off = (r < (n / 2) * 2) ? ((r % 2 == 0) ? 1 : -1) : 0;
      return static_cast<double>(i % 4 + 1) + off;
    }
  }
  return 0;
}

double reduce_expected(ReduceOp op, int n, size_t i) {
  double acc = reduce_input(op, 0, n, i);
  for (int r = 1; r < n; ++r) {
    double v = reduce_input(op, r, n, i);
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg:
        acc += v;
        break;
      case ReduceOp::Prod:
        acc *= v;
        break;
      case ReduceOp::Min:
        acc = std::min(acc, v);
        break;
      case ReduceOp::Max:
        acc = std::max(acc, v);
        break;
    }
  }
  if (op == ReduceOp::Avg) acc /= n;
  return acc;
}

double move_input(int r, size_t i) { return static_cast<double>((static_cast<size_t>(r) * 3 + i) % 11); }

double load(const void* buf, DType t, size_t i) {
  switch (t) {
    case DType::F32:
      return static_cast<const float*>(buf)[i];
    case DType::BF16:
      return bf16_bits_to_float(static_cast<const uint16_t*>(buf)[i]);
    case DType::F16:
      return f16_bits_to_float(static_cast<const uint16_t*>(buf)[i]);
    case DType::I32:
      return static_cast<const int32_t*>(buf)[i];
    case DType::I64:
      return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
  }
  return 0;
}

void store(void* buf, DType t, size_t i, double v) {
  switch (t) {
    case DType::F32:
      static_cast<float*>(buf)[i] = static_cast<float>(v);
      break;
    case DType::BF16:
      static_cast<uint16_t*>(buf)[i] = float_to_bf16_bits(static_cast<float>(v));
      break;
    case DType::F16:
      static_cast<uint16_t*>(buf)[i] = float_to_f16_bits(static_cast<float>(v));
      break;
    case DType::I32:
      static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v);
      break;
    case DType::I64:
      static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v);
      break;
  }
}

namespace {

// Every value function above is periodic in the index with a period dividing
// 4 * 7 * 11, so fills and checks encode one period once and tile it.
constexpr size_t kPeriod = 308;

struct Pattern {
  DType dtype;
  size_t ts;
  std::vector<unsigned char> bytes;  // kPeriod encoded elements
  template <typename F>
  Pattern(DType t, F value) : dtype(t), ts(dtype_size(t)), bytes(kPeriod * dtype_size(t)) {
    for (size_t j = 0; j < kPeriod; ++j) store(bytes.data(), t, j, value(j));
  }
  // Element i of the tiled pattern is value(first + i).
  void fill(void* buf, size_t count, size_t first) const {
    auto* out = static_cast<unsigned char*>(buf);
    size_t j = first % kPeriod;
    for (size_t i = 0; i < count;) {
      size_t n = std::min(count - i, kPeriod - j);
      std::memcpy(out + i * ts, bytes.data() + j * ts, n * ts);
      i += n;
      j = 0;
    }
  }
  int64_t count_wrong(const void* buf, size_t count, size_t first) const {
    const auto* in = static_cast<const unsigned char*>(buf);
    int64_t wrong = 0;
    size_t j = first % kPeriod;
    for (size_t i = 0; i < count;) {
      size_t n = std::min(count - i, kPeriod - j);
      if (std::memcmp(in + i * ts, bytes.data() + j * ts, n * ts) != 0) {
        for (size_t k = 0; k < n; ++k) wrong += std::memcmp(in + (i + k) * ts, bytes.data() + (j + k) * ts, ts) != 0;
      }
      i += n;
      j = 0;
    }
    return wrong;
  }
};

// Page-aligned anonymous memory, pre-faulted so the sweep never pays for a fresh page.
class Buffer {
 public:
  explicit Buffer(size_t bytes) : bytes_(std::max<size_t>(bytes, 4096)) {
    p_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p_ == MAP_FAILED) throw Error("bench: cannot map " + std::to_string(bytes_) + " bytes for buffers");
    std::memset(p_, 0, bytes_);
  }
  ~Buffer() { munmap(p_, bytes_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* data() const { return p_; }

 private:
  size_t bytes_;
  void* p_;
};

// One call of the op: pointers and per-call count.
struct Call {
  const void* send;
  void* recv;
  size_t count;  // elements per call argument (per rank block for split ops)
};

Call make_call(BenchOp op, size_t total, int r, int n, size_t ts, void* S, void* R, bool inplace) {
  auto* rb = static_cast<unsigned char*>(R);
  size_t per = total / static_cast<size_t>(n);
  switch (op) {
    case BenchOp::AllReduce:
    case BenchOp::Reduce:
      return inplace ? Call{R, R, total} : Call{S, R, total};
    case BenchOp::AllGather:
      return inplace ? Call{rb + r * per * ts, R, per} : Call{S, R, per};
    case BenchOp::ReduceScatter:
      return inplace ? Call{R, rb + r * per * ts, per} : Call{S, R, per};
    case BenchOp::AllToAll:
      return inplace ? Call{R, R, per} : Call{S, R, per};
    case BenchOp::Broadcast:
      return Call{R, R, total};
    case BenchOp::SendRecv:
      return Call{S, R, total};
  }
  return Call{S, R, total};
}

void issue(Communicator& c, BenchOp op, const Call& k, DType dt, ReduceOp redop, int root) {
  switch (op) {
    case BenchOp::AllReduce:
      c.all_reduce(k.send, k.recv, k.count, dt, redop);
      break;
    case BenchOp::AllGather:
      c.all_gather(k.send, k.recv, k.count, dt);
      break;
    case BenchOp::ReduceScatter:
      c.reduce_scatter(k.send, k.recv, k.count, dt, redop);
      break;
    case BenchOp::AllToAll:
      c.all_to_all(k.send, k.recv, k.count, dt);
      break;
    case BenchOp::Broadcast:
      c.broadcast(k.recv, k.count, dt, root);
      break;
    case BenchOp::Reduce:
      c.reduce(k.send, k.recv, k.count, dt, redop, root);
      break;
    case BenchOp::SendRecv: {
      // Each rank sends to rank+1 while receiving from rank-1, both at once
      // (nccl-tests' sendrecv; MPI_Sendrecv in the MPI column).
      int n = c.size(), r = c.rank();
      if (n == 1) {
        std::memcpy(k.recv, k.send, k.count * dtype_size(dt));
        break;
      }
      c.sendrecv(k.send, k.count, (r + 1) % n, k.recv, k.count, (r + n - 1) % n, dt, 7);
      break;
    }
  }
}

class Checker {
 public:
  Checker(BenchOp op, DType dt, ReduceOp redop, int r, int n, int root) : op_(op), dt_(dt), r_(r), n_(n), root_(root) {
    if (op_reduces(op)) {
      in_.emplace_back(dt, [&](size_t j) { return reduce_input(redop, r, n, j); });
      exp_.emplace_back(dt, [&](size_t j) { return reduce_expected(redop, n, j); });
    } else {
      for (int s = 0; s < n; ++s) exp_.emplace_back(dt, [&](size_t j) { return move_input(s, j); });
    }
    sentinel_.emplace(dt, [](size_t) { return -1.0; });
  }

  // Fills what `k` reads (total = row count).
  void prepare(const Call& k, size_t total, bool inplace, void* R) {
    void* send = const_cast<void*>(k.send);
    switch (op_) {
      // Out of place, the result region starts as a sentinel, so an op that
      // writes nothing cannot pass on an earlier run's results.
      case BenchOp::AllReduce:
      case BenchOp::Reduce:
        if (!inplace) sentinel_->fill(R, total, 0);
        in_[0].fill(send, total, 0);
        break;
      case BenchOp::ReduceScatter:
        if (!inplace) sentinel_->fill(R, total / static_cast<size_t>(n_), 0);
        in_[0].fill(send, total, 0);
        break;
      case BenchOp::AllGather:
        // Sentinel first (in place, the input block lies inside R), so stale
        // results of an earlier run can never pass for this one's.
        sentinel_->fill(R, total, 0);
        exp_[r_].fill(send, k.count, 0);
        break;
      case BenchOp::AllToAll:
        // Block j of my input is move_input(me, j*per + i): the receiver
        // knows the sender from the block index and itself from the offset.
        exp_[r_].fill(send, total, 0);
        if (!inplace) sentinel_->fill(R, total, 0);
        break;
      case BenchOp::Broadcast:
        if (r_ == root_)
          exp_[root_].fill(R, total, 0);
        else
          sentinel_->fill(R, total, 0);
        break;
      case BenchOp::SendRecv:
        exp_[r_].fill(send, total, 0);
        sentinel_->fill(R, total, 0);
        break;
    }
  }

  int64_t count_wrong(const Call& k, size_t total) const {
    size_t per = total / static_cast<size_t>(n_);
    size_t ts = dtype_size(dt_);
    const auto* out = static_cast<const unsigned char*>(k.recv);
    switch (op_) {
      case BenchOp::AllReduce:
        return exp_[0].count_wrong(out, total, 0);
      case BenchOp::Reduce:
        return r_ == root_ ? exp_[0].count_wrong(out, total, 0) : 0;
      case BenchOp::ReduceScatter:
        return exp_[0].count_wrong(out, per, static_cast<size_t>(r_) * per);
      case BenchOp::AllGather: {
        int64_t w = 0;
        for (int s = 0; s < n_; ++s) w += exp_[s].count_wrong(out + s * per * ts, per, 0);
        return w;
      }
      case BenchOp::AllToAll: {
        int64_t w = 0;
        for (int s = 0; s < n_; ++s) w += exp_[s].count_wrong(out + s * per * ts, per, static_cast<size_t>(r_) * per);
        return w;
      }
      case BenchOp::Broadcast:
        return exp_[root_].count_wrong(out, total, 0);
      case BenchOp::SendRecv:
        return exp_[(r_ + n_ - 1) % n_].count_wrong(out, total, 0);
    }
    return 0;
  }

 private:
  BenchOp op_;
  DType dt_;
  int r_, n_, root_;
  std::vector<Pattern> in_, exp_;
  std::optional<Pattern> sentinel_;
};

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Measured {
  double seconds;         // per iteration, mean over ranks
  double modeled;         // seconds, this rank's model of the last call
  int64_t wrong;          // summed over ranks; -1 unchecked
  std::string algorithm;  // what served the timed calls
};

Measured measure(Communicator& c, const BenchConfig& cfg, const Call& k, size_t total, bool inplace, void* R,
                 Checker* checker) {
  // Inputs first so timed iterations reduce sane values.
  if (checker) checker->prepare(k, total, inplace, R);
  for (int i = 0; i < cfg.warmup; ++i) issue(c, cfg.op, k, cfg.dtype, cfg.redop, cfg.root);
  c.barrier();
  double t0 = now_s();
  for (int i = 0; i < cfg.iters; ++i) issue(c, cfg.op, k, cfg.dtype, cfg.redop, cfg.root);
  double per_iter = cfg.iters > 0 ? (now_s() - t0) / cfg.iters : 0.0;
  double modeled = c.last_modeled_seconds();
  std::string algorithm = c.last_algorithm();

  int64_t wrong = 0;
  if (checker) {
    checker->prepare(k, total, inplace, R);
    issue(c, cfg.op, k, cfg.dtype, cfg.redop, cfg.root);
    if (cfg.corrupt_rank == c.rank() && total > 0) {
      bool holds_result = !(cfg.op == BenchOp::Reduce && c.rank() != cfg.root);
      if (holds_result) {
        double v = load(k.recv, cfg.dtype, 0);
        store(k.recv, cfg.dtype, 0, v + 1000);  // exact in every dtype, never the right value
      }
    }
    wrong = checker->count_wrong(k, total);
  }
  // One all-reduce combines the ranks' times (mean, as nccl-tests) and #wrong (sum).
  int64_t vals[2] = {static_cast<int64_t>(per_iter * 1e9), wrong};
  c.all_reduce(vals, vals, 2, DType::I64, ReduceOp::Sum);
  return Measured{static_cast<double>(vals[0]) / 1e9 / c.size(), modeled, checker ? vals[1] : -1, algorithm};
}

Result to_result(const Measured& m, size_t bytes, double factor) {
  Result r;
  r.time_us = m.seconds * 1e6;
  r.algbw_gbps = m.seconds > 0 ? static_cast<double>(bytes) / m.seconds / 1e9 : 0.0;
  r.busbw_gbps = r.algbw_gbps * factor;
  r.wrong = m.wrong;
  return r;
}

}  // namespace

size_t bytes_needed(const BenchConfig& cfg, int /*nranks*/) {
  size_t mx = 0;
  for (size_t s : cfg.sizes) mx = std::max(mx, s);
  return mx;
}

std::vector<Row> run_bench(Communicator& comm, const BenchConfig& cfg, Communicator* compare, void* send_buf,
                           void* recv_buf) {
  const int n = comm.size(), r = comm.rank();
  const size_t ts = dtype_size(cfg.dtype);
  std::optional<Buffer> own_s, own_r;
  if (!send_buf || !recv_buf) {
    size_t bytes = bytes_needed(cfg, n);
    own_s.emplace(bytes);
    own_r.emplace(bytes);
    send_buf = own_s->data();
    recv_buf = own_r->data();
  }
  std::optional<Checker> checker;
  if (cfg.check) checker.emplace(cfg.op, cfg.dtype, cfg.redop, r, n, cfg.root);
  const double factor = bus_factor(cfg.op, n);

  // The job's warm-up (kJobWarmupSmallCalls): largest size, then smallest.
  if (!cfg.sizes.empty()) {
    const auto [lo, hi] = std::minmax_element(cfg.sizes.begin(), cfg.sizes.end());
    for (const auto& [size, calls] :
         {std::pair{*hi, cfg.warmup}, std::pair{*lo, std::max(cfg.warmup, kJobWarmupSmallCalls)}}) {
      const Call k = make_call(cfg.op, row_count(cfg.op, size, cfg.dtype, n), r, n, ts, send_buf, recv_buf, false);
      for (int i = 0; i < calls; ++i) issue(comm, cfg.op, k, cfg.dtype, cfg.redop, cfg.root);
      if (compare)
        for (int i = 0; i < calls; ++i) issue(*compare, cfg.op, k, cfg.dtype, cfg.redop, cfg.root);
    }
  }
  std::vector<Row> rows;
  for (size_t size : cfg.sizes) {
    Row row;
    row.count = row_count(cfg.op, size, cfg.dtype, n);
    // Sizes that round to the same element count would repeat a row.
    if (!rows.empty() && rows.back().count == row.count) continue;
    row.size_bytes = row.count * ts;
    Call oop = make_call(cfg.op, row.count, r, n, ts, send_buf, recv_buf, false);
    Measured m = measure(comm, cfg, oop, row.count, false, recv_buf, checker ? &*checker : nullptr);
    row.oop = to_result(m, row.size_bytes, factor);
    row.algorithm = m.algorithm;
    if (m.modeled > 0) row.modeled_busbw_gbps = static_cast<double>(row.size_bytes) / m.modeled / 1e9 * factor;
    if (cfg.op != BenchOp::SendRecv) {
      Call ip = make_call(cfg.op, row.count, r, n, ts, send_buf, recv_buf, true);
      row.ip = to_result(measure(comm, cfg, ip, row.count, true, recv_buf, checker ? &*checker : nullptr),
                         row.size_bytes, factor);
    }
    if (compare) {
      Measured mm = measure(*compare, cfg, oop, row.count, false, recv_buf, nullptr);
      const Result cr = to_result(mm, row.size_bytes, factor);
      row.compare_busbw_gbps = cr.busbw_gbps;
      row.compare_time_us = cr.time_us;
    }
    rows.push_back(row);
  }
  return rows;
}

std::vector<size_t> row_counts(const BenchConfig& cfg, int nranks) {
  std::vector<size_t> out;
  for (size_t size : cfg.sizes) {
    const size_t c = row_count(cfg.op, size, cfg.dtype, nranks);
    if (!out.empty() && out.back() == c) continue;  // as run_bench skips it
    out.push_back(c);
  }
  return out;
}

CompareFigures read_compare_figures(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw FormatError("bench: cannot read MPI's figures from '" + path + "'");
  CompareFigures out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream is(line);
    size_t count = 0;
    CompareFigure f;
    if (!(is >> count >> f.time_us) || f.time_us < 0)
      throw FormatError(
          detail::concat("bench: ", path, " line ", n, ": expected 'COUNT TIME_US [SETTING]', got '", line, "'"));
    std::getline(is >> std::ws, f.setting);
    out.emplace_back(count, f);
  }
  return out;
}

void write_compare_figures(const std::string& path, const CompareFigures& f) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(6);
  for (const auto& [count, fig] : f) out << count << ' ' << fig.time_us << ' ' << fig.setting << '\n';
  try {
    write_file_atomic(path, out.str());
  } catch (const Error& e) {
    throw Error("bench: cannot write '" + path + "': " + e.what());
  }
}

void apply_compare_figures(Report& r, const CompareFigures& f, int nranks, BenchOp op) {
  const double factor = bus_factor(op, nranks);
  for (auto& row : r.rows) {
    for (const auto& [count, fig] : f) {
      if (count != row.count) continue;
      row.compare_time_us = fig.time_us;
      row.compare_busbw_gbps =
          fig.time_us > 0 ? static_cast<double>(row.size_bytes) / (fig.time_us * 1e-6) / 1e9 * factor : 0.0;
      row.compare_setting = fig.setting;
    }
  }
}

// ---- report formats ------------------------------------------------------------

double Report::avg_busbw_gbps() const {
  double sum = 0;
  int k = 0;
  for (const auto& row : rows) {
    sum += row.oop.busbw_gbps, ++k;
    if (row.ip) sum += row.ip->busbw_gbps, ++k;
  }
  return k ? sum / k : 0.0;
}

int64_t Report::total_wrong() const {
  int64_t w = 0;
  for (const auto& row : rows) {
    w += std::max<int64_t>(row.oop.wrong, 0);
    if (row.ip) w += std::max<int64_t>(row.ip->wrong, 0);
  }
  return w;
}

namespace {
std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

// nccl-tests prints times with fewer decimals as they grow, to keep the column width.
std::string time_str(double us) {
  if (us < 10000) return fmt("%7.2f", us);
  if (us < 100000) return fmt("%7.1f", us);
  return fmt("%7.0f", us);
}

std::string result_cols(const Result& r) {
  std::string wrong = r.wrong < 0 ? "N/A" : std::to_string(r.wrong);
  return fmt("  %7s  %6.2f  %6.2f  %6s", time_str(r.time_us).c_str(), r.algbw_gbps, r.busbw_gbps, wrong.c_str());
}
}  // namespace

std::string format_header(const Report& r) {
  std::ostringstream os;
  os << "# tessera bench " << r.op << ": " << r.ranks << " ranks, transport " << r.transport << ", algo "
     << (r.algo.empty() ? "auto" : r.algo) << "\n#\n";
  std::string extra1, extra2, extra3;
  extra1 = fmt("  %11s", "modeled");
  extra2 = fmt("  %11s", "busbw");
  extra3 = fmt("  %11s", "(GB/s)");
  if (!r.compare.empty()) {
    extra1 += fmt("  %7s  %9s  %6s", r.compare.c_str(), r.compare.c_str(), "");
    extra2 += fmt("  %7s  %9s  %6s", "time", "busbw", "ratio");
    extra3 += fmt("  %7s  %9s  %6s", "(us)", "(GB/s)", "");
    if (!r.compare_settings.empty()) os << "# " << r.compare << ": " << r.compare_settings << "\n#\n";
  }
  os << fmt("# %12s  %12s  %8s  %6s%33s%33s", "", "", "", "", "out-of-place", "in-place") << extra1 << "\n";
  os << fmt("# %12s  %12s  %8s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s", "size", "count", "type", "redop", "time",
            "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong")
     << extra2 << "\n";
  os << fmt("# %12s  %12s  %8s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s", "(B)", "(elements)", "", "", "(us)",
            "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "")
     << extra3 << "\n";
  return os.str();
}

std::string format_row(const Report& r, const Row& row) {
  std::string s = fmt("  %12zu  %12zu  %8s  %6s", row.size_bytes, row.count, r.dtype.c_str(), r.redop.c_str());
  s += result_cols(row.oop);
  if (row.ip)
    s += result_cols(*row.ip);
  else
    s += fmt("  %7s  %6s  %6s  %6s", "N/A", "N/A", "N/A", "N/A");
  if (row.modeled_busbw_gbps > 0)
    s += fmt("  %11.2f", row.modeled_busbw_gbps);
  else
    s += fmt("  %11s", "N/A");
  if (!r.compare.empty()) {
    double c = row.compare_busbw_gbps.value_or(0);
    s += row.compare_time_us ? fmt("  %7s", time_str(*row.compare_time_us).c_str()) : fmt("  %7s", "N/A");
    s += fmt("  %9.2f", c);
    if (c > 0)
      s += fmt("  %6.2f", row.oop.busbw_gbps / c);
    else
      s += fmt("  %6s", "N/A");
  }
  return s + "\n";
}

std::string format_table(const Report& r) {
  std::string s = format_header(r);
  for (const auto& row : r.rows) s += format_row(r, row);
  if (r.memcpy_gbps) s += fmt("# memcpy baseline (1 core, pre-faulted) : %.2f GB/s\n", *r.memcpy_gbps);
  if (r.memcpy_all_gbps)
    s += fmt("# memcpy baseline (all %d ranks at once)  : %.2f GB/s per rank\n", r.ranks, *r.memcpy_all_gbps);
  if (r.tcp_loopback_gbps)
    s += fmt("# TCP loopback baseline (2 processes)    : %.2f GB/s per direction both ways, %.2f GB/s one way\n",
             *r.tcp_loopback_gbps, r.tcp_loopback_unidir_gbps.value_or(0));
  s += fmt("# Out of bounds values : %lld %s\n", static_cast<long long>(r.total_wrong()),
           r.total_wrong() ? "FAILED" : "OK");
  s += fmt("# Avg bus bandwidth : %g\n", r.avg_busbw_gbps());
  return s;
}

nlohmann::json to_json(const Report& r) {
  using nlohmann::json;
  auto res = [](const Result& x) {
    return json{{"time_us", x.time_us},
                {"algbw_gbps", x.algbw_gbps},
                {"busbw_gbps", x.busbw_gbps},
                {"wrong", x.wrong < 0 ? json(nullptr) : json(x.wrong)}};
  };
  json j;
  j["op"] = r.op;
  j["ranks"] = r.ranks;
  j["transport"] = r.transport;
  j["algo"] = r.algo.empty() ? "auto" : r.algo;
  j["dtype"] = r.dtype;
  j["redop"] = r.redop;
  json rows = json::array();
  for (const auto& row : r.rows) {
    json o{{"size_bytes", row.size_bytes},
           {"count", row.count},
           {"oop", res(row.oop)},
           {"ip", row.ip ? res(*row.ip) : json(nullptr)},
           {"modeled_busbw_gbps", row.modeled_busbw_gbps > 0 ? json(row.modeled_busbw_gbps) : json(nullptr)}};
    if (!row.algorithm.empty()) o["algorithm"] = row.algorithm;
    if (row.compare_busbw_gbps) {
      o["compare_busbw_gbps"] = *row.compare_busbw_gbps;
      if (row.compare_time_us) o["compare_time_us"] = *row.compare_time_us;
      if (!row.compare_setting.empty()) o["compare_setting"] = row.compare_setting;
      o["compare_ratio"] =
          *row.compare_busbw_gbps > 0 ? json(row.oop.busbw_gbps / *row.compare_busbw_gbps) : json(nullptr);
    }
    rows.push_back(o);
  }
  j["results"] = rows;
  j["avg_busbw_gbps"] = r.avg_busbw_gbps();
  if (!r.compare.empty()) j["compare"] = r.compare;
  if (!r.compare_settings.empty()) j["compare_settings"] = r.compare_settings;
  if (r.memcpy_gbps || r.tcp_loopback_gbps) {
    json b = json::object();
    if (r.memcpy_gbps) b["memcpy_gbps"] = *r.memcpy_gbps;
    if (r.memcpy_all_gbps) b["memcpy_all_gbps"] = *r.memcpy_all_gbps;
    if (r.tcp_loopback_gbps) {
      b["tcp_loopback_gbps"] = *r.tcp_loopback_gbps;
      b["tcp_loopback_unidir_gbps"] = r.tcp_loopback_unidir_gbps.value_or(0);
    }
    j["baselines"] = b;
  }
  return j;
}

double measure_memcpy_gbps(size_t bytes, int reps) {
  Buffer a(bytes), b(bytes);
  std::memset(a.data(), 1, bytes);
  std::memcpy(b.data(), a.data(), bytes);  // warm
  reps = std::max(reps, 1);
  double t0 = now_s();
  for (int i = 0; i < reps; ++i) std::memcpy(b.data(), a.data(), bytes);
  double dt = now_s() - t0;
  return dt > 0 ? static_cast<double>(bytes) * reps / dt / 1e9 : 0.0;
}

double measure_memcpy_all_gbps(Communicator& comm, size_t bytes, int reps) {
  Buffer a(bytes), b(bytes);
  std::memset(a.data(), 1, bytes);
  std::memcpy(b.data(), a.data(), bytes);  // warm
  reps = std::max(reps, 1);
  comm.barrier();
  const double t0 = now_s();
  for (int i = 0; i < reps; ++i) std::memcpy(b.data(), a.data(), bytes);
  const int64_t mine_ns = static_cast<int64_t>((now_s() - t0) * 1e9);
  int64_t slowest_ns = 0;
  comm.all_reduce(&mine_ns, &slowest_ns, 1, DType::I64, ReduceOp::Max);
  return slowest_ns > 0 ? static_cast<double>(bytes) * reps / static_cast<double>(slowest_ns) : 0.0;
}

}  // namespace tessera::collectives::bench
