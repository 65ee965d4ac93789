// Multi-process tests of the collectives over the shared-memory transport:
// every collective, dtype and op against a serial reference computed in
// double. Integers must match exactly; floats within one rounding of the
// output dtype (inputs are small integers, so the f32 accumulation itself is
// exact): f32 rel 1e-6, f16 rel 2^-10, bf16 rel 2^-7. SixteenBitAccumulation
// uses inputs that only an f32 accumulation sums right. Send buffers are
// checked bit for bit after every out-of-place call.
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <utility>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/host.h"
#include "runtime/device.h"
#include "runtime/shm_memory.h"
#include "tests/collectives/fork_harness.h"

#if defined(__SANITIZE_THREAD__)
// A race in a forked rank must fail that rank (its exit code), not just print.
extern "C" const char* __tsan_default_options() { return "halt_on_error=1"; }
#endif

namespace tessera::collectives {
namespace {

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
// Sanitized builds run ~10x slower: the (1<<20)+3 counts run on up to 4 ranks.
constexpr int kLargeMaxRanks = 4;
#else
constexpr int kLargeMaxRanks = 8;
#endif

using test::failures;
using test::run_ranks;

const DType kDTypes[] = {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64};
const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg};

// Input of `rank` at element i: small integers, so sums and products are exact.
double input(int rank, size_t i, ReduceOp op, int seed) {
  if (op == ReduceOp::Prod) {
    static const double v[] = {1, 2, -1, 1, -2};
    return v[(static_cast<size_t>(rank) * 3 + i + static_cast<size_t>(seed)) % 5];
  }
  return static_cast<double>((static_cast<size_t>(rank) * 7 + i * 13 + static_cast<size_t>(seed)) % 11) - 5.0;
}

double reference(int p, size_t i, ReduceOp op, DType dt, int seed) {
  double acc = input(0, i, op, seed);
  for (int r = 1; r < p; ++r) {
    const double v = input(r, i, op, seed);
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
  if (op == ReduceOp::Avg) acc = is_floating(dt) ? acc / p : std::trunc(acc / p);
  return acc;
}

double tolerance(DType dt, double expected) {
  const double m = std::max(1.0, std::fabs(expected));
  switch (dt) {
    case DType::F32:
      return 1e-6 * m;
    case DType::F16:
      return m / 1024;
    case DType::BF16:
      return m / 128;
    default:
      return 0;
  }
}

// Buffers on the heap or in a shared arena (read in place by the shm direct algorithm).
class Buffers {
 public:
  explicit Buffers(bool arena) {
    if (arena) device_ = std::make_unique<Device>(DeviceSpec::preset("test-core"), 0, make_shm_memory(256u << 20));
  }
  ~Buffers() {
    for (auto& [p, n] : blocks_) device_ ? device_->free(p, n) : std::free(p);
  }
  void* get(size_t bytes) {
    bytes = std::max<size_t>(bytes, 1);
    void* p = device_ ? device_->allocate(bytes) : std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    blocks_.emplace_back(p, bytes);
    return p;
  }

 private:
  std::unique_ptr<Device> device_;
  std::vector<std::pair<void*, size_t>> blocks_;
};

void fill(void* buf, size_t n, DType dt, const std::function<double(size_t)>& f) {
  std::vector<float> tmp(n);
  for (size_t i = 0; i < n; ++i) tmp[i] = static_cast<float>(f(i));
  if (n) convert(tmp.data(), DType::F32, buf, dt, n);
}

std::vector<double> read(const void* buf, size_t n, DType dt) {
  std::vector<double> out(n);
  if (dt == DType::I64) {
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    return out;
  }
  std::vector<float> tmp(n);
  if (n) convert(buf, dt, tmp.data(), DType::F32, n);
  for (size_t i = 0; i < n; ++i) out[i] = tmp[i];
  return out;
}

// The send buffer's bytes before a collective, to check it is left alone.
std::string snapshot(const void* buf, size_t bytes) { return std::string(static_cast<const char*>(buf), bytes); }
bool unchanged(const std::string& before, const void* buf) {
  return before.empty() || std::memcmp(before.data(), buf, before.size()) == 0;
}

std::string what(const Communicator& c, const char* coll, size_t count, DType dt, ReduceOp op, bool inplace) {
  return detail::concat(coll, " p=", c.size(), " rank=", c.rank(), " count=", count, " ", dtype_name(dt), " ",
                        reduce_op_name(op), inplace ? " in-place" : "", " algo=", c.last_algorithm());
}

void check_all_reduce(Communicator& c, Buffers& b, size_t count, DType dt, ReduceOp op, bool inplace, int seed) {
  const size_t es = dtype_size(dt);
  void* send = b.get(count * es);
  void* recv = inplace ? send : b.get(count * es);
  fill(send, count, dt, [&](size_t i) { return input(c.rank(), i, op, seed); });
  const std::string before = inplace ? "" : snapshot(send, count * es);
  c.all_reduce(send, recv, count, dt, op);
  auto got = read(recv, count, dt);
  for (size_t i = 0; i < count; ++i) {
    const double e = reference(c.size(), i, op, dt, seed);
    COLL_REQUIRE(std::fabs(got[i] - e) <= tolerance(dt, e), what(c, "all_reduce", count, dt, op, inplace), ": element ",
                 i, " is ", got[i], ", expected ", e);
  }
  COLL_REQUIRE(unchanged(before, send), what(c, "all_reduce", count, dt, op, inplace), ": send buffer changed");
}

void check_reduce_scatter(Communicator& c, Buffers& b, size_t count, DType dt, ReduceOp op, bool inplace) {
  const size_t es = dtype_size(dt), p = static_cast<size_t>(c.size());
  void* send = b.get(p * count * es);
  // In-place reduce-scatter: recv is this rank's block of send (NCCL convention).
  void* recv = inplace ? static_cast<char*>(send) + c.rank() * count * es : b.get(count * es);
  fill(send, p * count, dt, [&](size_t i) { return input(c.rank(), i, op, 3); });
  const std::string before = inplace ? "" : snapshot(send, p * count * es);
  c.reduce_scatter(send, recv, count, dt, op);
  COLL_REQUIRE(unchanged(before, send), what(c, "reduce_scatter", count, dt, op, inplace), ": send buffer changed");
  auto got = read(recv, count, dt);
  for (size_t i = 0; i < count; ++i) {
    const double e = reference(c.size(), c.rank() * count + i, op, dt, 3);
    COLL_REQUIRE(std::fabs(got[i] - e) <= tolerance(dt, e), what(c, "reduce_scatter", count, dt, op, inplace),
                 ": element ", i, " is ", got[i], ", expected ", e);
  }
}

void check_all_gather(Communicator& c, Buffers& b, size_t count, DType dt, bool inplace) {
  const size_t es = dtype_size(dt), p = static_cast<size_t>(c.size());
  void* recv = b.get(p * count * es);
  void* send = inplace ? static_cast<char*>(recv) + c.rank() * count * es : b.get(count * es);
  fill(send, count, dt, [&](size_t i) { return input(c.rank(), i, ReduceOp::Sum, 5); });
  const std::string before = inplace ? "" : snapshot(send, count * es);
  c.all_gather(send, recv, count, dt);
  COLL_REQUIRE(unchanged(before, send), what(c, "all_gather", count, dt, ReduceOp::Sum, inplace),
               ": send buffer changed");
  auto got = read(recv, p * count, dt);
  for (size_t r = 0; r < p; ++r)
    for (size_t i = 0; i < count; ++i)
      COLL_REQUIRE(got[r * count + i] == input(static_cast<int>(r), i, ReduceOp::Sum, 5),
                   what(c, "all_gather", count, dt, ReduceOp::Sum, inplace), ": block ", r, " element ", i);
}

void check_broadcast(Communicator& c, Buffers& b, size_t count, DType dt, int root) {
  void* buf = b.get(count * dtype_size(dt));
  fill(buf, count, dt, [&](size_t i) { return c.rank() == root ? input(root, i, ReduceOp::Sum, 9) : 99.0; });
  c.broadcast(buf, count, dt, root);
  auto got = read(buf, count, dt);
  for (size_t i = 0; i < count; ++i)
    COLL_REQUIRE(got[i] == input(root, i, ReduceOp::Sum, 9), what(c, "broadcast", count, dt, ReduceOp::Sum, false),
                 " root ", root, ": element ", i);
}

void check_reduce(Communicator& c, Buffers& b, size_t count, DType dt, ReduceOp op, int root) {
  const size_t es = dtype_size(dt);
  void* send = b.get(count * es);
  void* recv = c.rank() == root ? b.get(count * es) : nullptr;
  fill(send, count, dt, [&](size_t i) { return input(c.rank(), i, op, 1); });
  const std::string before = snapshot(send, count * es);
  c.reduce(send, recv, count, dt, op, root);
  COLL_REQUIRE(unchanged(before, send), what(c, "reduce", count, dt, op, false), " root ", root,
               ": send buffer changed");
  if (c.rank() != root) return;
  auto got = read(recv, count, dt);
  for (size_t i = 0; i < count; ++i) {
    const double e = reference(c.size(), i, op, dt, 1);
    COLL_REQUIRE(std::fabs(got[i] - e) <= tolerance(dt, e), what(c, "reduce", count, dt, op, false), " root ", root,
                 ": element ", i, " is ", got[i], ", expected ", e);
  }
}

void check_all_to_all(Communicator& c, Buffers& b, size_t count, DType dt, bool inplace) {
  const size_t es = dtype_size(dt), p = static_cast<size_t>(c.size());
  void* send = b.get(p * count * es);
  void* recv = inplace ? send : b.get(p * count * es);
  // Element i of block j sent by rank r encodes (r, j, i).
  auto code = [&](size_t r, size_t j, size_t i) { return static_cast<double>((r * 31 + j * 7 + i) % 97); };
  fill(send, p * count, dt,
       [&](size_t k) { return code(c.rank(), k / std::max<size_t>(count, 1), k % std::max<size_t>(count, 1)); });
  const std::string before = inplace ? "" : snapshot(send, p * count * es);
  c.all_to_all(send, recv, count, dt);
  COLL_REQUIRE(unchanged(before, send), what(c, "all_to_all", count, dt, ReduceOp::Sum, inplace),
               ": send buffer changed");
  auto got = read(recv, p * count, dt);
  for (size_t j = 0; j < p; ++j)
    for (size_t i = 0; i < count; ++i)
      COLL_REQUIRE(got[j * count + i] == code(j, c.rank(), i), what(c, "all_to_all", count, dt, ReduceOp::Sum, inplace),
                   ": block ", j, " element ", i);
}

// sendrecv around rings of every shift: rank r sends to r+s and receives
// from r-s, at once (a 2 MiB message, more than a TCP socket buffer, would
// deadlock a sendrecv that sent before it received). Different sizes each
// way; the buffers are checked exactly and the send buffer left unchanged.
void check_sendrecv(Communicator& c, size_t count) {
  const int p = c.size(), r = c.rank();
  for (int s = 1; s < p; ++s) {
    const int to = (r + s) % p, from = (r + p - s) % p;
    std::vector<int64_t> out(count + static_cast<size_t>(r)), in(count + static_cast<size_t>(from), -1);
    for (size_t i = 0; i < out.size(); ++i) out[i] = int64_t{r} * 1000003 + int64_t{s} * 7 + static_cast<int64_t>(i);
    const std::vector<int64_t> sent = out;
    c.sendrecv(out.data(), out.size(), to, in.data(), in.size(), from, DType::I64, 11);
    COLL_REQUIRE(out == sent, "sendrecv shift ", s, ": send buffer changed");
    for (size_t i = 0; i < in.size(); ++i)
      COLL_REQUIRE(in[i] == int64_t{from} * 1000003 + int64_t{s} * 7 + static_cast<int64_t>(i), "sendrecv shift ", s,
                   " count ", count, ": element ", i, " got ", in[i]);
  }
  if (p > 1) {
    int64_t x = 0;
    bool threw = false;
    try {
      c.sendrecv(&x, 1, r, &x, 1, (r + 1) % p, DType::I64, 11);
    } catch (const InvalidArgument& e) {
      threw = std::string(e.what()).find("sendrecv: peer") != std::string::npos;
    }
    COLL_REQUIRE(threw, "sendrecv to itself was not refused");
  }
}

// ---------------------------------------------------------------- sweeps

class WorldSize : public ::testing::TestWithParam<int> {};

// Every dtype and op, counts 0, 1, 7, 1000, in-place and not.
TEST_P(WorldSize, AllReduceEveryDtypeAndOp) {
  auto res = run_ranks(GetParam(), [](int rank, int size, std::shared_ptr<Store> store) {
    auto c = Communicator::create(std::move(store), rank, size);
    Buffers heap(false);
    int seed = 0;
    for (DType dt : kDTypes)
      for (ReduceOp op : kOps)
        for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}})
          for (bool inplace : {false, true}) check_all_reduce(*c, heap, count, dt, op, inplace, seed++);
  });
  EXPECT_EQ(failures(res), "");
}

// (1<<20)+3 elements for a subset: f32 sum from a shared arena (read in
// place), i32 max and bf16 avg from the heap.
TEST_P(WorldSize, AllReduceLargeCount) {
  if (GetParam() > kLargeMaxRanks)
    GTEST_SKIP() << "sanitized build (about 10x slower): large counts run on up to " << kLargeMaxRanks << " ranks";
  auto res = run_ranks(GetParam(), [](int rank, int size, std::shared_ptr<Store> store) {
    auto c = Communicator::create(std::move(store), rank, size);
    Buffers arena(true), heap(false);
    const size_t n = (size_t{1} << 20) + 3;
    check_all_reduce(*c, arena, n, DType::F32, ReduceOp::Sum, false, 1);
    COLL_REQUIRE(size == 1 || c->last_algorithm() == "direct", "large arena all-reduce served by ",
                 c->last_algorithm());
    check_all_reduce(*c, heap, n, DType::I32, ReduceOp::Max, true, 2);
    check_all_reduce(*c, heap, n, DType::BF16, ReduceOp::Avg, false, 3);
  });
  EXPECT_EQ(failures(res), "");
}

TEST_P(WorldSize, OtherCollectives) {
  auto res = run_ranks(GetParam(), [](int rank, int size, std::shared_ptr<Store> store) {
    auto c = Communicator::create(std::move(store), rank, size);
    Buffers heap(false), arena(true);
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}}) {
      for (DType dt : kDTypes) {
        for (ReduceOp op : kOps) check_reduce_scatter(*c, heap, count, dt, op, false);
        check_reduce_scatter(*c, heap, count, dt, ReduceOp::Sum, true);
        check_all_gather(*c, heap, count, dt, false);
        check_all_gather(*c, heap, count, dt, true);
        check_all_to_all(*c, heap, count, dt, false);
      }
      check_all_to_all(*c, heap, count, DType::I64, true);
      for (int root = 0; root < size; root += std::max(1, size / 2)) {
        check_broadcast(*c, heap, count, DType::F32, root);
        check_reduce(*c, heap, count, DType::BF16, ReduceOp::Sum, root);
        check_reduce(*c, heap, count, DType::I64, ReduceOp::Prod, root);
        check_reduce(*c, heap, count, DType::F32, ReduceOp::Avg, root);
      }
      c->barrier();
    }
    // Point to point: a ring of sends, odd ranks receive first.
    if (size > 1) {
      std::vector<int64_t> out(1000), in(1000);
      for (size_t i = 0; i < out.size(); ++i) out[i] = int64_t{rank} * 1000 + static_cast<int64_t>(i);
      const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
      if (rank % 2 == 0) {
        c->send(out.data(), out.size(), DType::I64, next, 7);
        c->recv(in.data(), in.size(), DType::I64, prev, 7);
      } else {
        c->recv(in.data(), in.size(), DType::I64, prev, 7);
        c->send(out.data(), out.size(), DType::I64, next, 7);
      }
      for (size_t i = 0; i < in.size(); ++i)
        COLL_REQUIRE(in[i] == int64_t{prev} * 1000 + static_cast<int64_t>(i), "p2p ", i);
      check_sendrecv(*c, 1000);
      if (size <= kLargeMaxRanks) check_sendrecv(*c, size_t{1} << 18);
    }
    // Large: broadcast from an arena (direct) and the heap (tree), reduce-scatter.
    if (size > kLargeMaxRanks) return;
    const size_t n = (size_t{1} << 20) + 3;
    check_broadcast(*c, arena, n, DType::F32, size - 1);
    check_broadcast(*c, heap, n, DType::I32, 0);
    check_reduce_scatter(*c, heap, n / static_cast<size_t>(size), DType::F32, ReduceOp::Sum, false);
    check_all_gather(*c, heap, n / static_cast<size_t>(size), DType::BF16, false);
  });
  EXPECT_EQ(failures(res), "");
}

INSTANTIATE_TEST_SUITE_P(Sizes, WorldSize, ::testing::Values(1, 2, 3, 4, 5, 6, 7, 8),
                         [](const auto& info) { return "p" + std::to_string(info.param); });

// ---------------------------------------------------------------- TCP, both read paths

// Every op and dtype over TCP at 2, 3 and 4 ranks, in every size class of
// the transport: empty, a few elements, around the 64 KiB the caller reads
// itself (kEager in tcp_transport.cc: 16384 f32 is exactly 64 KiB, 16385
// one element beyond it), and large (the reading thread's, fragment-wise
// sinks). `thread`: TESSERA_TCP_READER_THREAD=1, every receive through the
// reading thread (the path before callers read).
struct TcpCase {
  int size;
  bool thread;
};
class TcpPaths : public ::testing::TestWithParam<TcpCase> {};

TEST_P(TcpPaths, EveryOpDtypeAndSizeClassExact) {
  const TcpCase tc = GetParam();
  auto res = run_ranks(tc.size, [tc](int rank, int size, std::shared_ptr<Store> store) {
    ::setenv("TESSERA_TCP_READER_THREAD", tc.thread ? "1" : "0", 1);
    CommOptions o;
    o.transport = TransportKind::Tcp;
    auto c = Communicator::create(std::move(store), rank, size, o);
    Buffers heap(false);
    int seed = 0;
    const size_t p = static_cast<size_t>(size);
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{16384}, size_t{16385}, (size_t{1} << 18) + 3}) {
      const bool large = count > 16385;
      for (DType dt : kDTypes) {
        for (ReduceOp op : kOps)
          if (!large || op == ReduceOp::Sum || dt == DType::BF16) {
            check_all_reduce(*c, heap, count, dt, op, seed % 2 == 1, seed);
            ++seed;
          }
        check_reduce_scatter(*c, heap, count / p, dt, large ? ReduceOp::Sum : ReduceOp::Max, false);
        check_all_gather(*c, heap, count / p, dt, dt == DType::I32);
        check_all_to_all(*c, heap, count / p, dt, false);
        check_broadcast(*c, heap, count, dt, size - 1);
        check_reduce(*c, heap, count, dt, ReduceOp::Sum, 0);
      }
      check_sendrecv(*c, count);
      c->barrier();
    }
  });
  EXPECT_EQ(failures(res), "");
}

INSTANTIATE_TEST_SUITE_P(Ranks, TcpPaths,
                         ::testing::Values(TcpCase{2, false}, TcpCase{3, false}, TcpCase{4, false}, TcpCase{2, true},
                                           TcpCase{3, true}, TcpCase{4, true}),
                         [](const auto& info) {
                           return "p" + std::to_string(info.param.size) + (info.param.thread ? "_thread" : "_caller");
                         });

// ---------------------------------------------------------------- forced algorithms

struct Forced {
  std::string algo;
  int size;
};

// A torus for the group when it factors: 4 = 2x2, 6 = 3x2, 8 = 2x2x2.
NetModel torus_for(int p) {
  std::vector<int> dims = p == 4   ? std::vector<int>{2, 2}
                          : p == 6 ? std::vector<int>{3, 2}
                          : p == 8 ? std::vector<int>{2, 2, 2}
                                   : std::vector<int>{p};
  std::vector<NetDim> d;
  d.reserve(dims.size());
  for (int k : dims) d.push_back(NetDim{k, LinkKind::Ring, 50e9, 1e-6});
  return NetModel(d);
}

class ForcedAlgo : public ::testing::TestWithParam<Forced> {};

TEST_P(ForcedAlgo, AllReduceMatchesReference) {
  const Forced f = GetParam();
  auto res = run_ranks(f.size, [f](int rank, int size, std::shared_ptr<Store> store) {
    CommOptions o;
    o.algo = f.algo;
    o.net = torus_for(size);
    auto c = Communicator::create(std::move(store), rank, size, o);
    Buffers arena(true);
    int seed = 0;
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{100003}}) {
      for (DType dt : {DType::F32, DType::I64, DType::BF16})
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max})
          for (bool inplace : {false, true}) {
            check_all_reduce(*c, arena, count, dt, op, inplace, seed++);
            // bf16 is reduced in an f32 heap workspace: oneshot takes <= 4096 bytes
            // of it, direct only arena buffers.
            const bool can = (f.algo != "oneshot" || count * std::max<size_t>(4, dtype_size(dt)) <= 4096) &&
                             (f.algo != "direct" || dt != DType::BF16);
            if (can && size > 1)
              COLL_REQUIRE(c->last_algorithm() == f.algo, "forced ", f.algo, " but ", c->last_algorithm(), " served");
          }
    }
    if (f.algo == "torus" || f.algo == "ring" || f.algo == "direct") {
      for (size_t count : {size_t{0}, size_t{1}, size_t{1000}, size_t{20011}}) {
        check_reduce_scatter(*c, arena, count, DType::F32, ReduceOp::Sum, false);
        if (size > 1) COLL_REQUIRE(c->last_algorithm() == f.algo, "reduce_scatter served by ", c->last_algorithm());
        check_reduce_scatter(*c, arena, count, DType::I32, ReduceOp::Min, true);
        check_all_gather(*c, arena, count, DType::I64, false);
        check_all_gather(*c, arena, count, DType::F16, true);
        if (size > 1) COLL_REQUIRE(c->last_algorithm() == f.algo, "all_gather served by ", c->last_algorithm());
      }
    }
  });
  EXPECT_EQ(failures(res), "");
}

// Direct all-reduce blocks of at least 1 MiB reach the peers with streaming
// stores (algorithms.cc, copy_streaming): exact at 2 and 3 ranks, in place
// and not, counts whose blocks are odd-sized and cross the threshold.
TEST(DirectAllReduce, LargeBlocksStreamedToPeersAreExact) {
  for (int size : {2, 3}) {
    auto res = run_ranks(size, [](int rank, int size, std::shared_ptr<Store> store) {
      CommOptions o;
      o.algo = "direct";
      auto c = Communicator::create(std::move(store), rank, size, o);
      Buffers arena(true);
      int seed = 0;
      for (size_t count : {size_t{3} * (size_t{1} << 18) + 7, size_t{1} << 20})
        for (DType dt : {DType::F32, DType::I64})
          for (bool inplace : {false, true}) {
            check_all_reduce(*c, arena, count, dt, ReduceOp::Sum, inplace, seed++);
            COLL_REQUIRE(c->last_algorithm() == "direct", "direct forced but ", c->last_algorithm(), " served");
          }
    });
    EXPECT_EQ(failures(res), "") << size << " ranks";
  }
}

INSTANTIATE_TEST_SUITE_P(Algos, ForcedAlgo,
                         ::testing::Values(Forced{"ring", 3}, Forced{"ring", 8}, Forced{"rhd", 5}, Forced{"rhd", 6},
                                           Forced{"rhd", 8}, Forced{"torus", 4}, Forced{"torus", 6}, Forced{"torus", 8},
                                           Forced{"direct", 3}, Forced{"direct", 7}, Forced{"oneshot", 5},
                                           Forced{"rd", 2}, Forced{"rd", 5}, Forced{"rd", 8}),
                         [](const auto& info) { return info.param.algo + "_p" + std::to_string(info.param.size); });

// ---------------------------------------------------------------- flat broadcast

// `flat` (shm): the root sends to every peer and returns, so it can run
// several broadcasts ahead of its receivers; back-to-back broadcasts from
// changing roots, then an all-reduce on the same channels, must each
// deliver exactly the root's values. By default it serves broadcasts up to
// 4 KiB on shared memory at 2 ranks and 32 KiB above, and larger ones go
// elsewhere.
class FlatBroadcast : public ::testing::TestWithParam<int> {};

TEST_P(FlatBroadcast, BackToBackFromEveryRoot) {
  auto res = run_ranks(GetParam(), [](int rank, int size, const std::shared_ptr<Store>& store) {
    CommOptions forced;
    forced.algo = "flat";
    forced.name = "flat";
    auto c = Communicator::create(store, rank, size, forced);
    Buffers heap(false);
    for (int rep = 0; rep < 3; ++rep)
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{5000}})
        for (int root = 0; root < size; ++root) {
          check_broadcast(*c, heap, count, DType::F32, root);
          if (size > 1) COLL_REQUIRE(c->last_algorithm() == std::string("flat"), "served by ", c->last_algorithm());
        }
    // The root ran ahead through the channels: an all-reduce on them next.
    check_all_reduce(*c, heap, 100003, DType::F32, ReduceOp::Sum, false, 3);
    // 40 back-to-back 8-byte broadcasts (more than a channel's slots) from one root.
    for (int i = 0; i < 40; ++i) check_broadcast(*c, heap, 2, DType::I32, size - 1);

    CommOptions dflt;
    dflt.name = "dflt";
    auto d = Communicator::create(store, rank, size, dflt);
    // flat_broadcast_max_bytes: 4 KiB for 2 ranks, 32 KiB above.
    const size_t most = size == 2 ? 1024 : 8192;
    check_broadcast(*d, heap, most, DType::F32, 0);
    COLL_REQUIRE(d->last_algorithm() == std::string("flat"), 4 * most, " B served by ", d->last_algorithm());
    check_broadcast(*d, heap, most + 1, DType::F32, 0);
    COLL_REQUIRE(d->last_algorithm() != std::string("flat"), 4 * most + 4, " B served by flat");
  });
  EXPECT_EQ(failures(res), "");
}

INSTANTIATE_TEST_SUITE_P(Sizes, FlatBroadcast, ::testing::Values(2, 3, 8),
                         [](const auto& info) { return "p" + std::to_string(info.param); });

// ---------------------------------------------------------------- channels
// Messages of at most 256 bytes go through a channel's box (packed records
// in a byte ring that wraps every 8 KiB), larger ones through its slots; both
// sides pick by size, and each is FIFO. Every rank sends a stream to the next
// and receives one from the previous, at once, mixing sizes on both sides of
// the limit and 0 bytes, 3000 messages (the box wraps many times, with skip
// records), each of its own bytes, so a stale record of an older lap or a
// mixed-up order is caught. First, a receiver that starts 50 ms late makes
// its sender fill the box and sleep, so the full-box path and its wake-up
// run (a lost wake-up would only show as a delay of up to 100 ms, not fail).
class Channels : public ::testing::TestWithParam<int> {};

TEST_P(Channels, SmallAndLargeMessagesInterleavedInOrder) {
  auto res = run_ranks(GetParam(), [](int rank, int size, const std::shared_ptr<Store>& store) {
    CommOptions o;
    o.name = "chan";
    auto c = Communicator::create(store, rank, size, o);
    // Counts of 2-byte elements: 0 to 4000 bytes, 254, 256 and 258 among them.
    const size_t counts[] = {0, 1, 3, 4, 8, 15, 16, 17, 50, 64, 100, 127, 128, 129, 2000, 4, 128, 1};
    const int to = (rank + 1) % size, from = (rank + size - 1) % size;
    auto byte_of = [](int sender, int msg, size_t i) {
      return static_cast<unsigned char>((static_cast<size_t>(sender) * 131 + static_cast<size_t>(msg) * 7 + i) % 251);
    };
    std::vector<unsigned char> out(4001), in(4001);
    // Rank 0 streams 1000 8-byte messages to rank 1, which starts late: the
    // box (8 KiB, 32 bytes a record) fills, rank 0 sleeps on it, and rank
    // 1's takes must wake it.
    for (int m = 0; m < 1000; ++m) {
      if (rank == 0) {
        for (size_t i = 0; i < 8; ++i) out[i] = byte_of(0, m, i);
        c->send(out.data(), 4, DType::BF16, 1, 7);
      } else if (rank == 1) {
        if (m == 0) usleep(50000);
        c->recv(in.data(), 4, DType::BF16, 0, 7);
        for (size_t i = 0; i < 8; ++i) COLL_REQUIRE(in[i] == byte_of(0, m, i), "streamed message ", m, " byte ", i);
      }
    }
    const int n = 3000;
    for (int m = 0; m < n; ++m) {
      const size_t count = counts[static_cast<size_t>(m) % std::size(counts)], bytes = 2 * count;
      for (size_t i = 0; i < bytes; ++i) out[i] = byte_of(rank, m, i);
      std::fill(in.begin(), in.end(), 0xEE);
      const uint32_t tag = static_cast<uint32_t>(m % 5);
      // Even ranks send first, odd ranks receive first: both orders in one run.
      if (rank % 2 == 0) {
        c->send(out.data(), count, DType::BF16, to, tag);
        c->recv(in.data(), count, DType::BF16, from, tag);
      } else {
        c->recv(in.data(), count, DType::BF16, from, tag);
        c->send(out.data(), count, DType::BF16, to, tag);
      }
      for (size_t i = 0; i < bytes; ++i)
        COLL_REQUIRE(in[i] == byte_of(from, m, i), "message ", m, " (", bytes, " B) byte ", i, ": got ",
                     static_cast<int>(in[i]), ", want ", static_cast<int>(byte_of(from, m, i)));
      COLL_REQUIRE(in[bytes] == 0xEE, "message ", m, " (", bytes, " B) wrote past its end");
    }
  });
  EXPECT_EQ(failures(res), "");
}

INSTANTIATE_TEST_SUITE_P(Sizes, Channels, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return "p" + std::to_string(info.param); });

// ---------------------------------------------------------------- 16-bit accumulation

// bf16 and f16 reductions accumulate in f32 (communicator.h). Element i gets a
// large value L on rank i % 8 and small ones (0.25, 0.5 or 0.75) elsewhere.
// L sits where the 16-bit grid has spacing 2 (bf16 256, f16 2048), so one
// small value added to L in 16 bits rounds away, while the 7 together (1.75
// to 5.25) move the correctly rounded sum: accumulating in bf16/f16 in any
// order that meets L first loses them. The oracle is the sum in double,
// rounded once to the 16-bit grid (nearest, ties to even), exactly.
double large_value(DType dt) { return dt == DType::BF16 ? 256.0 : 2048.0; }

double acc_input(int rank, size_t i, DType dt) {
  if (static_cast<size_t>(rank) == i % 8) return large_value(dt);
  return 0.25 * static_cast<double>(1 + (static_cast<size_t>(rank) * 5 + i) % 3);
}

// x in [L, 2L): the 16-bit value nearest to x on the grid of spacing 2, ties to even (multiples of 4).
double round_to_grid(double x) {
  const double q = x / 2.0, f = std::floor(q), frac = q - f;
  double r = frac > 0.5 ? f + 1 : frac < 0.5 ? f : (std::fmod(f, 2.0) == 0 ? f : f + 1);
  return 2.0 * r;
}

double acc_oracle(int p, size_t i, DType dt) {
  double sum = 0;
  for (int r = 0; r < p; ++r) sum += acc_input(r, i, dt);
  return round_to_grid(sum);
}

class SixteenBitAccumulation : public ::testing::TestWithParam<std::string> {};

TEST_P(SixteenBitAccumulation, MatchesDoubleOracleRoundedOnce) {
  const std::string algo = GetParam();
  auto res = run_ranks(8, [algo](int rank, int size, std::shared_ptr<Store> store) {
    CommOptions o;
    o.algo = algo;
    o.net = torus_for(size);
    auto c = Communicator::create(std::move(store), rank, size, o);
    Buffers heap(false);
    const size_t n = 1000;  // oneshot serves up to 4 KiB of the f32 workspace
    for (DType dt : {DType::BF16, DType::F16}) {
      const size_t es = dtype_size(dt);
      auto expect_oracle = [&](const void* buf, size_t count, size_t first, const char* coll) {
        auto got = read(buf, count, dt);
        size_t lost = 0;
        for (size_t i = 0; i < count; ++i) {
          const double e = acc_oracle(size, first + i, dt);
          COLL_REQUIRE(got[i] == e, coll, " ", dtype_name(dt), " algo=", c->last_algorithm(), " element ", first + i,
                       " is ", got[i], ", expected ", e, " (the small values were lost: accumulated in 16 bits?)");
          lost += e != large_value(dt);
        }
        COLL_REQUIRE(lost == count, "the oracle does not tell the accumulations apart");
      };
      // all_reduce, out of place and in place.
      void* send = heap.get(n * es);
      void* recv = heap.get(n * es);
      fill(send, n, dt, [&](size_t i) { return acc_input(rank, i, dt); });
      c->all_reduce(send, recv, n, dt, ReduceOp::Sum);
      if (!algo.empty()) COLL_REQUIRE(c->last_algorithm() == algo, "forced ", algo, " but ", c->last_algorithm());
      expect_oracle(recv, n, 0, "all_reduce");
      c->all_reduce(send, send, n, dt, ReduceOp::Sum);
      expect_oracle(send, n, 0, "all_reduce in place");
      // reduce_scatter: block b of the 8 x n/8 input is elements [b n/8, (b+1) n/8).
      const size_t blk = n / static_cast<size_t>(size);
      void* rs_send = heap.get(n * es);
      void* rs_recv = heap.get(blk * es);
      fill(rs_send, n, dt, [&](size_t i) { return acc_input(rank, i, dt); });
      c->reduce_scatter(rs_send, rs_recv, blk, dt, ReduceOp::Sum);
      expect_oracle(rs_recv, blk, static_cast<size_t>(rank) * blk, "reduce_scatter");
      // reduce to the last rank.
      void* r_recv = rank == size - 1 ? heap.get(n * es) : nullptr;
      c->reduce(rs_send, r_recv, n, dt, ReduceOp::Sum, size - 1);
      if (r_recv) expect_oracle(r_recv, n, 0, "reduce");
    }
  });
  EXPECT_EQ(failures(res), "");
}

INSTANTIATE_TEST_SUITE_P(Algos, SixteenBitAccumulation, ::testing::Values("", "ring", "rhd", "torus", "oneshot"),
                         [](const auto& info) { return info.param.empty() ? std::string("default") : info.param; });

// ---------------------------------------------------------------- groups

TEST(Collectives, SplitAndTwoCommunicatorsAtOnce) {
  auto res = run_ranks(6, [](int rank, int size, const std::shared_ptr<Store>& store) {
    auto world = Communicator::create(store, rank, size);
    CommOptions oo;
    oo.name = "other";
    auto other = Communicator::create(store, rank, size, oo);
    // Even/odd groups, ordered by descending world rank.
    auto half = world->split(rank % 2, -rank, "half");
    COLL_REQUIRE(half && half->size() == 3, "split size");
    COLL_REQUIRE(half->rank() == (4 + rank % 2 - rank) / 2, "split rank ", half->rank());
    COLL_REQUIRE(half->options().world_ranks.size() == 3 && half->options().world_ranks[0] == 4 + rank % 2,
                 "world ranks");
    // Ranks 0,1,2 and 3,4,5; rank 5 opts out of its group.
    auto third = world->split(rank == 5 ? -1 : rank / 3, 0);
    COLL_REQUIRE((rank == 5) == (third == nullptr), "color -1");
    Buffers heap(false);
    for (int it = 0; it < 3; ++it) {
      int64_t v = rank + 1, sum = 0;
      half->all_reduce(&v, &sum, 1, DType::I64, ReduceOp::Sum);
      COLL_REQUIRE(sum == (rank % 2 == 0 ? 1 + 3 + 5 : 2 + 4 + 6), "half sum ", sum);
      if (third) {
        third->all_reduce(&v, &sum, 1, DType::I64, ReduceOp::Sum);
        COLL_REQUIRE(sum == (rank < 3 ? 6 : 4 + 5), "third sum ", sum);
      }
      // Two world-sized communicators used alternately, one asynchronously.
      std::vector<float> a(5000, static_cast<float>(rank)), b(5000, 1.0f);
      auto w = other->all_reduce_async(a.data(), a.data(), a.size(), DType::F32, ReduceOp::Sum);
      world->all_reduce(b.data(), b.data(), b.size(), DType::F32, ReduceOp::Sum);
      w->wait();
      COLL_REQUIRE(a[4999] == 15.0f && b[0] == 6.0f, "two communicators");
      check_all_reduce(*half, heap, 1000, DType::F16, ReduceOp::Avg, false, it);
    }
    // A sub-communicator of a sub-communicator.
    auto pair = half->split(half->rank() / 2, 0);
    int32_t x = 1, y = 0;
    pair->all_reduce(&x, &y, 1, DType::I32, ReduceOp::Sum);
    COLL_REQUIRE(y == pair->size(), "nested split");
  });
  EXPECT_EQ(failures(res), "");
}

TEST(Collectives, AsyncCompletesInOrder) {
  auto res = run_ranks(3, [](int rank, int size, std::shared_ptr<Store> store) {
    auto c = Communicator::create(std::move(store), rank, size);
    const size_t n = 20000;
    std::vector<std::vector<float>> bufs(8, std::vector<float>(n));
    std::vector<std::vector<float>> outs(8, std::vector<float>(n / size));
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < 8; ++k) {
      std::fill(bufs[k].begin(), bufs[k].end(), static_cast<float>(rank * 10 + k));
      if (k % 2 == 0)
        works.push_back(c->all_reduce_async(bufs[k].data(), bufs[k].data(), n, DType::F32, ReduceOp::Sum));
      else
        works.push_back(c->reduce_scatter_async(bufs[k].data(), outs[k].data(), n / size, DType::F32, ReduceOp::Sum));
    }
    // A blocking call issued after them runs after them.
    c->barrier();
    for (int k = 0; k < 8; ++k) COLL_REQUIRE(works[k]->done(), "work ", k, " not done after a later blocking call");
    for (int k = 0; k < 8; ++k) {
      works[k]->wait();
      const float e = static_cast<float>(10 * (0 + 1 + 2) + 3 * k);
      COLL_REQUIRE((k % 2 == 0 ? bufs[k][n - 1] : outs[k][0]) == e, "async result ", k);
    }
  });
  EXPECT_EQ(failures(res), "");
}

// ---------------------------------------------------------------- several hosts

// Ranks split into "hosts" (TESSERA_HOST_KEY_SUFFIX, TCP on loopback): the
// default transport uses shared memory inside a host and TCP between hosts,
// within one communicator, and every collective still gives exact values.
struct Layout {
  std::string name;
  std::vector<int> host_of;  // rank -> host
};

void enter_host(int host) {
  ::setenv("TESSERA_HOST_KEY_SUFFIX", ("test-host-" + std::to_string(host)).c_str(), 1);
  ::setenv("TESSERA_HOST_NAME", ("h" + std::to_string(host)).c_str(), 1);
  ::setenv("TESSERA_TCP_ADDR", "127.0.0.1", 1);
}

// The CPUs this process may run on (the ranks inherit the test's affinity).
int my_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return CPU_COUNT(&set);
}

// Confines this process (a rank) to CPU 0.
void pin_to_cpu0() {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(0, &set);
  if (::sched_setaffinity(0, sizeof set, &set) != 0) throw std::runtime_error("sched_setaffinity failed");
}

class Hosts : public ::testing::TestWithParam<Layout> {};

TEST_P(Hosts, EveryCollectiveExactOverShmAndTcp) {
  const Layout l = GetParam();
  auto res = run_ranks(static_cast<int>(l.host_of.size()), [&](int rank, int size,
                                                               const std::shared_ptr<Store>& store) {
    enter_host(l.host_of[rank]);
    auto c = Communicator::create(store, rank, size);
    // A rank with no peer on its host has only TCP links.
    int on_my_host = 0;
    for (int h : l.host_of) on_my_host += h == l.host_of[rank] ? 1 : 0;
    const std::string expect_transport = on_my_host > 1 ? "shm+tcp" : "tcp";
    COLL_REQUIRE(c->transport() == expect_transport, "world transport ", c->transport(), ", expected ",
                 expect_transport);
    Buffers heap(false), arena(true);
    int seed = 0;
    for (DType dt : {DType::F32, DType::BF16, DType::I64})
      for (ReduceOp op : kOps)
        for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}})
          check_all_reduce(*c, heap, count, dt, op, false, seed++);
    // Small ones take hier_rd where hosts hold equal powers of two (>= 2) of
    // ranks, or hier_leader where a host has
    // more ranks than the CPUs they may use (two by four on a 2-CPU machine).
    // Elsewhere (unequal hosts, one rank per host) there is no shared-memory
    // transport for the whole group, and rd serves them (3 and 5 ranks: folded).
    const bool two_level = l.name == "two_by_two" || l.name == "interleaved" || l.name == "two_by_four";
    const bool crowded = l.name == "two_by_four" ? my_cpus() < 4 : my_cpus() < 2;
    check_all_reduce(*c, heap, 7, DType::F32, ReduceOp::Sum, false, seed++);
    std::string small_algo = "rd";
    if (two_level) small_algo = crowded ? "hier_leader" : "hier_rd";
    COLL_REQUIRE(c->last_algorithm() == small_algo, "7 floats served by ", c->last_algorithm());
    for (size_t count : {size_t{1}, size_t{1000}}) {
      check_reduce_scatter(*c, heap, count, DType::F32, ReduceOp::Sum, false);
      check_all_gather(*c, heap, count, DType::I32, true);
      check_all_to_all(*c, heap, count, DType::I64, false);
      for (int root = 0; root < size; ++root) {
        check_broadcast(*c, heap, count, DType::F32, root);
        check_reduce(*c, heap, count, DType::I64, ReduceOp::Sum, root);
      }
    }
    // Large, from a shared arena (as training does): ring through both transports.
    const size_t n = (size_t{1} << 20) + 3;
    check_all_reduce(*c, arena, n, DType::F32, ReduceOp::Sum, false, 1);
    // Hierarchical when every host holds the same number (>= 2) of ranks.
    std::vector<int> per_host;
    for (int h : l.host_of) {
      if (h >= static_cast<int>(per_host.size())) per_host.resize(h + 1, 0);
      ++per_host[h];
    }
    bool even = per_host.size() >= 2 && per_host[0] >= 2;
    for (int k : per_host) even = even && k == per_host[0];
    COLL_REQUIRE(c->last_algorithm() == (even ? "hier" : "ring"), "large all-reduce served by ", c->last_algorithm());
    check_all_reduce(*c, heap, n, DType::BF16, ReduceOp::Avg, true, 2);
    // Forced hierarchical at every size (it declines where it cannot; the defaults follow).
    CommOptions ho;
    ho.name = "hier";
    ho.algo = "hier";
    auto hc = Communicator::create(store, rank, size, ho);
    for (size_t count : {size_t{0}, size_t{1}, size_t{3}, size_t{7}, size_t{1000}, size_t{65541}}) {
      check_all_reduce(*hc, heap, count, DType::F32, ReduceOp::Sum, false, 7);
      check_all_reduce(*hc, heap, count, DType::I64, ReduceOp::Max, true, 8);
      COLL_REQUIRE((hc->last_algorithm() == "hier") == even, "forced hier served by ", hc->last_algorithm());
    }
    // hier_leader and hier_rd forced (whether the hosts are crowded or not):
    // exact at every size, in place or not; they decline where hier does
    // (these layouts hold powers of two). hier_rd's two by four takes 3
    // exchanges, two by two 2: the input starts in the workspace or in recv.
    for (const char* algo : {"hier_leader", "hier_rd"}) {
      CommOptions lo;
      lo.name = std::string("forced-") + algo;
      lo.algo = algo;
      auto lc = Communicator::create(store, rank, size, lo);
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{65541}}) {
        check_all_reduce(*lc, heap, count, DType::F32, ReduceOp::Sum, count % 2 == 0, 9);
        check_all_reduce(*lc, heap, count, DType::I64, ReduceOp::Max, count % 2 == 1, 10);
        COLL_REQUIRE((lc->last_algorithm() == std::string(algo)) == even, "forced ", algo, " served by ",
                     lc->last_algorithm());
      }
    }
    // Hierarchical all-gather, reduce-scatter and broadcast, forced at every
    // size and in place or not; exact values against the serial definition.
    for (size_t count : {size_t{0}, size_t{1}, size_t{3}, size_t{1000}, size_t{65541}}) {
      check_all_gather(*hc, heap, count, DType::I32, count % 2 == 1);
      COLL_REQUIRE((hc->last_algorithm() == "hier") == even, "forced hier all-gather served by ", hc->last_algorithm());
      check_reduce_scatter(*hc, heap, count, DType::F32, ReduceOp::Sum, count % 2 == 0);
      COLL_REQUIRE((hc->last_algorithm() == "hier") == even, "forced hier reduce-scatter served by ",
                   hc->last_algorithm());
      check_reduce_scatter(*hc, heap, count, DType::BF16, ReduceOp::Avg, false);
      check_reduce_scatter(*hc, heap, count, DType::I64, ReduceOp::Max, true);
      for (int root = 0; root < size; ++root) {
        check_broadcast(*hc, heap, count, DType::F32, root);
        COLL_REQUIRE((hc->last_algorithm() == "hier") == even, "forced hier broadcast served by ",
                     hc->last_algorithm());
      }
    }
    // By default: all-gather and reduce-scatter at every size, broadcast from 256 KiB.
    check_all_gather(*c, heap, 1000, DType::F32, false);
    COLL_REQUIRE(c->last_algorithm() == (even ? "hier" : "ring"), "all-gather served by ", c->last_algorithm());
    check_reduce_scatter(*c, heap, 1000, DType::F32, ReduceOp::Sum, false);
    COLL_REQUIRE(c->last_algorithm() == (even ? "hier" : "ring"), "reduce-scatter served by ", c->last_algorithm());
    check_broadcast(*c, heap, size_t{1} << 16, DType::F32, size - 1);
    COLL_REQUIRE(c->last_algorithm() == (even ? "hier" : "tree"), "broadcast served by ", c->last_algorithm());
    check_broadcast(*c, heap, 1000, DType::F32, 0);
    COLL_REQUIRE(c->last_algorithm() == "tree", "small broadcast served by ", c->last_algorithm());
    // Groups inside a host take shared memory; groups across hosts TCP.
    const int host = l.host_of[rank];
    auto same_host = c->split(host, rank, "host");
    COLL_REQUIRE(same_host->transport() == "shm" || on_my_host == 1, "host group transport ", same_host->transport());
    int local = 0;
    for (int r = 0; r < rank; ++r) local += l.host_of[r] == host ? 1 : 0;
    auto across = c->split(local, rank, "across");
    int64_t v = rank, sum = 0;
    across->all_reduce(&v, &sum, 1, DType::I64, ReduceOp::Sum);
    int64_t expect = 0;
    for (int r = 0; r < size; ++r) {
      int lr = 0;
      for (int q = 0; q < r; ++q) lr += l.host_of[q] == l.host_of[r] ? 1 : 0;
      if (lr == local) expect += r;
    }
    COLL_REQUIRE(sum == expect, "across-host group sum ", sum, " expected ", expect);
    check_all_reduce(*same_host, heap, 1000, DType::F32, ReduceOp::Sum, false, 4);
    // Point to point between every pair, whichever transport carries it.
    for (int a = 0; a < size; ++a)
      for (int b = 0; b < size; ++b) {
        if (a == b) continue;
        int64_t x = a * 100 + b;
        if (rank == a) c->send(&x, 1, DType::I64, b, 3);
        if (rank == b) {
          int64_t y = -1;
          c->recv(&y, 1, DType::I64, a, 3);
          COLL_REQUIRE(y == a * 100 + b, "p2p ", a, "->", b, " got ", y);
        }
      }
    check_sendrecv(*c, 5);
    check_sendrecv(*c, size_t{1} << 18);
    c->barrier();
  });
  EXPECT_EQ(failures(res), "");
}

INSTANTIATE_TEST_SUITE_P(Layouts, Hosts,
                         ::testing::Values(Layout{"two_by_two", {0, 0, 1, 1}}, Layout{"interleaved", {0, 1, 0, 1}},
                                           Layout{"three_and_two", {0, 0, 0, 1, 1}},
                                           Layout{"one_and_three", {0, 1, 1, 1}}, Layout{"one_per_host", {0, 1, 2}},
                                           Layout{"two_by_four", {0, 0, 0, 0, 1, 1, 1, 1}}),
                         [](const auto& info) { return info.param.name; });

// A host's CPUs are the union of its ranks' affinity masks, published with
// the host identity; a host with more ranks than CPUs makes the group
// crowded. Identities that do not parse are refused naming the rank.
TEST(HostMap, CpusAreTheUnionOfTheRanksMasks) {
  ::setenv("TESSERA_HOST_KEY_SUFFIX", "hostmap-test", 1);
  struct Unset {
    ~Unset() { ::unsetenv("TESSERA_HOST_KEY_SUFFIX"); }
  } unset;
  const HostIdentity me = this_host();
  ASSERT_EQ(me.cpus, cpu_mask_hex());
  std::vector<bool> mine;
  ASSERT_TRUE(add_cpu_mask(me.cpus, mine));
  const int n = static_cast<int>(std::count(mine.begin(), mine.end(), true));
  ASSERT_EQ(n, my_cpus());
  // Ranks 1 and 2 on host "b" (CPUs 0-1 and 4: 3 CPUs, 2 ranks), ranks 3-5
  // on host "c" (CPU 8 each: 1 CPU, 3 ranks), rank 0 here.
  auto store = make_memory_store();
  store->set("host/1", "kb 3 b");
  store->set("host/2", "kb 01 b");
  store->set("host/3", "kc 100 c one");
  store->set("host/4", "kc 100 c one");
  store->set("host/5", "kc 100 c one");
  const HostMap m = exchange_hosts(*store, 0, 6, std::chrono::milliseconds(1000));
  EXPECT_EQ(m.host_of, (std::vector<int>{0, 1, 1, 2, 2, 2}));
  EXPECT_EQ(m.names[2], "c one");
  EXPECT_EQ(m.cpus, (std::vector<int>{n, 3, 1}));
  EXPECT_TRUE(m.crowded());
  store->set("host/3", "kc 1f0 c one");
  store->set("host/4", "kc 100 c one");
  store->set("host/5", "kc 100 c one");
  const HostMap roomy = exchange_hosts(*store, 0, 6, std::chrono::milliseconds(1000));
  EXPECT_EQ(roomy.cpus[2], 5);
  EXPECT_FALSE(roomy.crowded());
  for (const char* bad : {"kb b", "kb 0 b", "kb 3g b", "kb", " 3 b", "kb 3 "}) {
    store->set("host/1", bad);
    try {
      exchange_hosts(*store, 0, 6, std::chrono::milliseconds(1000));
      ADD_FAILURE() << "identity '" << bad << "' accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
    }
  }
}

// Hosts whose ranks share one CPU (each rank confined to CPU 0): the small
// all-reduce takes hier_leader (a binomial reduce to local index 0, the
// leaders' recursive doubling across hosts, a binomial broadcast), exact for
// every dtype and op, in place or not, at L = 2 and 3 (hier_rd needs a power
// of two) and 4 on H = 2 hosts, and L = 2 on H = 4 (two exchanges between
// the leaders, so their result lands in the other buffer first); modeled
// as twice the reduce's ceil(log2 L) steps plus log2(H) (ae + n/be), with
// the link figures given. Large ones still take hier.
TEST(HostsCrowded, SmallAllReduceTakesOneLeaderPerHost) {
  for (auto [L, H] : {std::pair{2, 2}, std::pair{3, 2}, std::pair{4, 2}, std::pair{2, 4}}) {
    auto res = run_ranks(L * H, [L = L, H = H](int rank, int size, const std::shared_ptr<Store>& store) {
      pin_to_cpu0();
      enter_host(rank / L);
      ::setenv("TESSERA_NET_INTER_HOST", "150,1.5", 1);
      ::setenv("TESSERA_NET_INTRA_HOST", "20,10", 1);
      const double a = 20e-6, bw = 10e9, ae = 150e-6, be = 1.5e9;
      auto c = Communicator::create(store, rank, size);
      Buffers heap(false);
      int seed = 0;
      for (DType dt : {DType::F32, DType::BF16, DType::I64})
        for (ReduceOp op : kOps)
          for (size_t count : {size_t{1}, size_t{7}, size_t{1000}}) {
            for (bool inplace : {false, true}) check_all_reduce(*c, heap, count, dt, op, inplace, seed++);
            COLL_REQUIRE(c->last_algorithm() == std::string("hier_leader"), "L ", L, ": ", count,
                         " elements served by ", c->last_algorithm());
          }
      // The reduce's (and broadcast's) steps: local indices 0-1, then 0-2
      // (L > 2), two hops apart on the default model's ring.
      const double n = 7 * 4, tree = (a + n / bw) + (L > 2 ? 2 * a + n / bw : 0);
      check_all_reduce(*c, heap, 7, DType::F32, ReduceOp::Sum, false, seed++);
      const double t = 2 * tree + (H == 4 ? 2 : 1) * (ae + n / be);
      COLL_REQUIRE(std::fabs(c->last_modeled_seconds() - t) <= 1e-12, "L ", L, ": modeled ", c->last_modeled_seconds(),
                   " vs ", t);
      check_all_reduce(*c, heap, size_t{1} << 20, DType::F32, ReduceOp::Sum, false, seed++);
      COLL_REQUIRE(c->last_algorithm() == std::string("hier"), "L ", L, ": 4 MiB served by ", c->last_algorithm());
    });
    EXPECT_EQ(failures(res), "") << "L = " << L << ", H = " << H;
  }
}

// Shared memory forced across hosts is refused, naming the other host, before
// anything of a peer on another host is opened.
TEST(HostsForced, ShmAcrossHostsIsRefusedNamingTheHost) {
  auto res = run_ranks(4, [](int rank, int size, std::shared_ptr<Store> store) {
    enter_host(rank / 2);
    CommOptions o;
    o.transport = TransportKind::Shm;
    o.timeout = std::chrono::seconds(20);
    try {
      auto c = Communicator::create(std::move(store), rank, size, o);
    } catch (const CollectiveError& e) {
      const std::string w = e.what();
      const std::string other = rank < 2 ? "h1" : "h0";
      COLL_REQUIRE(w.find("is on host '" + other + "', not on this host") != std::string::npos, "message: ", w);
      COLL_REQUIRE(w.find("/proc/") == std::string::npos, "opened another host's /proc: ", w);
      COLL_REQUIRE(e.peer() >= 0 && e.peer() / 2 != rank / 2, "peer ", e.peer());
      return;
    }
    COLL_REQUIRE(false, "forced shm across hosts was accepted");
  });
  EXPECT_EQ(failures(res), "");
}

// A rank of another host that dies mid-collective: the survivors on both
// hosts fail within about a second (not at the timeout), and those that
// reach it over TCP name its host.
TEST(HostsFaults, DeadRankOnAnotherHostFailsEveryoneNamingIt) {
  auto res = run_ranks(4, [](int rank, int size, std::shared_ptr<Store> store) {
    enter_host(rank / 2);
    CommOptions o;
    o.timeout = std::chrono::seconds(60);
    auto c = Communicator::create(std::move(store), rank, size, o);
    std::vector<float> buf(1 << 16, 1.0f);
    c->all_reduce(buf.data(), buf.data(), buf.size(), DType::F32, ReduceOp::Sum);
    if (rank == 3) ::_exit(0);  // dies without closing anything
    const auto t0 = std::chrono::steady_clock::now();
    try {
      for (int i = 0; i < 1000; ++i) c->all_reduce(buf.data(), buf.data(), buf.size(), DType::F32, ReduceOp::Sum);
    } catch (const CollectiveError& e) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      COLL_REQUIRE(s < 10, "failure noticed after ", s, " s");
      const std::string w = e.what();
      COLL_REQUIRE(w.find("rank 3 is on host 'h1'") != std::string::npos ||
                       w.find("rank 2 is on host 'h1'") != std::string::npos ||
                       (rank == 2 && w.find("rank 3") != std::string::npos) ||
                       (rank == 1 && w.find("rank 0") != std::string::npos),
                   "rank ", rank, ": message does not name the lost rank's host: ", w);
      return;
    }
    COLL_REQUIRE(false, "all-reduces went on without rank 3");
  });
  ASSERT_EQ(res.size(), 4u);
  EXPECT_EQ(res[3].exit_code, 0);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(res[r].exit_code, 0) << res[r].message;
}

// ---------------------------------------------------------------- modeled time

// Two hosts of two ranks, default model: NeuronLink (48 GiB/s, 2 us) inside a
// host, the instance network (800 Gb/s shared by the host's 2 ranks, 10 us)
// between hosts. hier: 2(L-1) local steps of n/L and 2(H-1) cross steps of
// n/(LH); a flat ring over 4 ranks pays the cross-host link at every step.
TEST(ModeledTime, HierarchicalUsesTwoLevels) {
  auto res = run_ranks(4, [](int rank, int size, const std::shared_ptr<Store>& store) {
    enter_host(rank / 2);
    const double a = 2e-6, bw = 48.0 * (1ull << 30), ae = 10e-6, be = 800e9 / 8 / 2;
    const size_t count = size_t{4} * 2 * 1000;
    const double n = static_cast<double>(count * 4);
    std::vector<float> buf(count, 1.0f);
    auto near = [](double x, double y) { return std::fabs(x - y) <= 1e-9 * std::max(1.0, std::fabs(y)) + 1e-15; };
    CommOptions o;
    o.algo = "hier";
    auto c = Communicator::create(store, rank, size, o);
    c->all_reduce(buf.data(), buf.data(), count, DType::F32, ReduceOp::Sum);
    COLL_REQUIRE(c->last_algorithm() == "hier", c->last_algorithm());
    const double hier = 2 * (a + n / 2 / bw) + 2 * (ae + n / 4 / be);
    COLL_REQUIRE(near(c->last_modeled_seconds(), hier), "hier ", c->last_modeled_seconds(), " vs ", hier);
    CommOptions r;
    r.name = "flat";
    r.algo = "ring";
    auto f = Communicator::create(store, rank, size, r);
    f->all_reduce(buf.data(), buf.data(), count, DType::F32, ReduceOp::Sum);
    const double ring = 6 * (ae + n / 4 / be);
    COLL_REQUIRE(near(f->last_modeled_seconds(), ring), "ring ", f->last_modeled_seconds(), " vs ", ring);
    COLL_REQUIRE(hier < ring, "hier not cheaper");
  });
  EXPECT_EQ(failures(res), "");
}

// Two hosts of two ranks, default selection: the two-level cost model picks
// hier_rd for small all-reduces (log2 L + log2 H = 2 exchanges of the whole
// vector, one of them across hosts: (a + n/bw) + (ae + n/be)) and hier for
// large ones, where hier_rd's whole-vector exchanges cost more.
TEST(ModeledTime, SmallAllReduceAcrossHostsTakesLogSteps) {
  // Two ranks per host on fewer CPUs would be crowded hosts (hier_leader, HostsCrowded).
  if (my_cpus() < 2) GTEST_SKIP() << "needs 2 CPUs for 2 ranks per host";
  auto res = run_ranks(4, [](int rank, int size, std::shared_ptr<Store> store) {
    enter_host(rank / 2);
    const double a = 2e-6, bw = 48.0 * (1ull << 30), ae = 10e-6, be = 800e9 / 8 / 2;
    auto near = [](double x, double y) { return std::fabs(x - y) <= 1e-9 * std::max(1.0, std::fabs(y)) + 1e-15; };
    auto c = Communicator::create(std::move(store), rank, size);
    for (size_t count : {size_t{2}, size_t{1024}, size_t{16384}, size_t{1} << 20}) {
      std::vector<float> buf(count);
      for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>(rank + 1 + (i % 3));
      c->all_reduce(buf.data(), buf.data(), count, DType::F32, ReduceOp::Sum);
      for (size_t i = 0; i < count; ++i)
        COLL_REQUIRE(buf[i] == static_cast<float>(10 + 4 * (i % 3)), "count ", count, " element ", i, ": ", buf[i]);
      const double n = static_cast<double>(count * 4);
      if (count <= 16384) {
        COLL_REQUIRE(c->last_algorithm() == "hier_rd", count, " floats served by ", c->last_algorithm());
        const double t = (a + n / bw) + (ae + n / be);
        COLL_REQUIRE(near(c->last_modeled_seconds(), t), "hier_rd ", c->last_modeled_seconds(), " vs ", t);
      } else {
        COLL_REQUIRE(c->last_algorithm() == "hier", count, " floats served by ", c->last_algorithm());
      }
    }
  });
  EXPECT_EQ(failures(res), "");
}

// Measured link figures (TESSERA_NET_INTER_HOST / _INTRA_HOST, as the
// multihost tests pass from a ping-pong) replace the default model's: the
// hier_rd all-reduce of n bytes on 2 hosts x 2 ranks is modeled as
// (a + n/bw) + (ae + n/be) with those figures. A malformed value is refused
// by name.
TEST(ModeledTime, MeasuredLinkFiguresSetTheModel) {
  // Two ranks per host on fewer CPUs would be crowded hosts (hier_leader, HostsCrowded).
  if (my_cpus() < 2) GTEST_SKIP() << "needs 2 CPUs for 2 ranks per host";
  auto res = run_ranks(4, [](int rank, int size, const std::shared_ptr<Store>& store) {
    enter_host(rank / 2);
    ::setenv("TESSERA_NET_INTER_HOST", "150,1.5", 1);
    ::setenv("TESSERA_NET_INTRA_HOST", "20", 1);
    const double a = 20e-6, bw = 48.0 * (1ull << 30), ae = 150e-6, be = 1.5e9;
    auto c = Communicator::create(store, rank, size);
    std::vector<float> buf(1024, 1.0f);
    c->all_reduce(buf.data(), buf.data(), buf.size(), DType::F32, ReduceOp::Sum);
    COLL_REQUIRE(buf[7] == 4.0f, "value ", buf[7]);
    COLL_REQUIRE(c->last_algorithm() == "hier_rd", c->last_algorithm());
    const double n = 4096, t = (a + n / bw) + (ae + n / be);
    COLL_REQUIRE(std::fabs(c->last_modeled_seconds() - t) <= 1e-12, "modeled ", c->last_modeled_seconds(), " vs ", t);
    for (const char* bad : {"fast", "10,", "-3", "10,0", "10x"}) {
      ::setenv("TESSERA_NET_INTER_HOST", bad, 1);
      CommOptions o;
      o.name = std::string("bad") + bad;
      try {
        Communicator::create(store, rank, size, o);
        COLL_REQUIRE(false, "TESSERA_NET_INTER_HOST='", bad, "' accepted");
      } catch (const InvalidArgument& e) {
        COLL_REQUIRE(std::string(e.what()).find("TESSERA_NET_INTER_HOST='") != std::string::npos, e.what());
      }
    }
  });
  EXPECT_EQ(failures(res), "");
}

// Same two hosts of two ranks (L = H = 2). hier all-gather and
// reduce-scatter of c bytes per rank: (H-1) cross steps of c and (L-1)
// local steps of H c; a flat ring pays the cross-host link at each of its
// p-1 steps of c. hier broadcast of n bytes: a scatter of n/L inside the
// root's host, one cross round of n/L, an all-gather step of n/L; the flat
// binomial tree sends all n once inside the host and once across.
TEST(ModeledTime, HierarchicalGatherScatterBroadcastUseTwoLevels) {
  auto res = run_ranks(4, [](int rank, int size, const std::shared_ptr<Store>& store) {
    enter_host(rank / 2);
    const double a = 2e-6, bw = 48.0 * (1ull << 30), ae = 10e-6, be = 800e9 / 8 / 2;
    const size_t count = size_t{2} * 1000;
    const double cb = static_cast<double>(count * 4);
    std::vector<float> in(count * size, 1.0f), out(count * size);
    auto near = [](double x, double y) { return std::fabs(x - y) <= 1e-9 * std::max(1.0, std::fabs(y)) + 1e-15; };
    CommOptions o;
    o.algo = "hier";
    auto c = Communicator::create(store, rank, size, o);
    CommOptions fo;
    fo.name = "flat";
    fo.algo = "ring";
    auto f = Communicator::create(store, rank, size, fo);
    const double hier_ag = (ae + cb / be) + (a + 2 * cb / bw), ring_ag = 3 * (ae + cb / be);
    c->all_gather(in.data(), out.data(), count, DType::F32);
    COLL_REQUIRE(c->last_algorithm() == "hier", c->last_algorithm());
    COLL_REQUIRE(near(c->last_modeled_seconds(), hier_ag), "hier all-gather ", c->last_modeled_seconds(), " vs ",
                 hier_ag);
    f->all_gather(in.data(), out.data(), count, DType::F32);
    COLL_REQUIRE(near(f->last_modeled_seconds(), ring_ag), "ring all-gather ", f->last_modeled_seconds(), " vs ",
                 ring_ag);
    c->reduce_scatter(in.data(), out.data(), count, DType::F32, ReduceOp::Sum);
    COLL_REQUIRE(c->last_algorithm() == "hier", c->last_algorithm());
    COLL_REQUIRE(near(c->last_modeled_seconds(), hier_ag), "hier reduce-scatter ", c->last_modeled_seconds(), " vs ",
                 hier_ag);
    COLL_REQUIRE(out[0] == 4.0f, "reduce-scatter value ", out[0]);
    f->reduce_scatter(in.data(), out.data(), count, DType::F32, ReduceOp::Sum);
    COLL_REQUIRE(near(f->last_modeled_seconds(), ring_ag), "ring reduce-scatter ", f->last_modeled_seconds());
    const double n = static_cast<double>(count * size * 4);
    const double hier_bc = 2 * (a + n / 2 / bw) + (ae + n / 2 / be), tree_bc = (a + n / bw) + (ae + n / be);
    for (int root : {0, 3}) {
      c->broadcast(in.data(), count * size, DType::F32, root);
      COLL_REQUIRE(c->last_algorithm() == "hier", c->last_algorithm());
      COLL_REQUIRE(near(c->last_modeled_seconds(), hier_bc), "hier broadcast ", c->last_modeled_seconds(), " vs ",
                   hier_bc);
    }
    CommOptions to;
    to.name = "tree";
    to.algo = "tree";
    auto t = Communicator::create(store, rank, size, to);
    t->broadcast(in.data(), count * size, DType::F32, 0);
    COLL_REQUIRE(near(t->last_modeled_seconds(), tree_bc), "tree broadcast ", t->last_modeled_seconds(), " vs ",
                 tree_bc);
    // At 32 kB hier broadcast's extra local step costs more than the n/(2 B_e)
    // it saves across (they cross at n = 2 a B_e = 200 kB): hence its 256 KiB threshold.
    COLL_REQUIRE(hier_ag < ring_ag && hier_bc > tree_bc, "hier all-gather ", hier_ag, " ring ", ring_ag,
                 "; hier broadcast ", hier_bc, " tree ", tree_bc);
  });
  EXPECT_EQ(failures(res), "");
}

TEST(ModeledTime, SchedulesMatchClosedForms) {
  auto res = run_ranks(6, [](int rank, int size, const std::shared_ptr<Store>& store) {
    const double a = 1.5e-6, bw = 40e9;
    const size_t count = size_t{6} * 2 * 1000;  // divisible by 2p: every block equal
    const double n = static_cast<double>(count * 4);
    std::vector<float> buf(count, 1.0f);
    auto near = [](double x, double y) { return std::fabs(x - y) <= 1e-9 * std::max(1.0, std::fabs(y)) + 1e-15; };
    Device dev(DeviceSpec::preset("test-core"));
    {  // Ring all-reduce on a ring: 2(p-1)a + 2(p-1)/p n/B, charged to the device clock too.
      CommOptions o;
      o.algo = "ring";
      o.net = NetModel::ring(size, bw, a);
      o.device = &dev;
      auto c = Communicator::create(store, rank, size, o);
      c->all_reduce(buf.data(), buf.data(), count, DType::F32, ReduceOp::Sum);
      COLL_REQUIRE(c->last_algorithm() == "ring", c->last_algorithm());
      const double e = 2.0 * (size - 1) * a + 2.0 * (size - 1) / size * n / bw;
      COLL_REQUIRE(near(c->last_modeled_seconds(), e), "ring ", c->last_modeled_seconds(), " vs ", e);
      COLL_REQUIRE(near(e, NetModel::ring_allreduce_time(size, n, a, bw)), "closed form");
      COLL_REQUIRE(near(dev.clock().totals().comm_s, e), "device clock ", dev.clock().totals().comm_s);
      c->all_gather(buf.data(), buf.data(), count / size, DType::F32);
      COLL_REQUIRE(near(c->last_modeled_seconds(), NetModel::ring_allgather_time(size, n, a, bw)), "ring allgather");
      COLL_REQUIRE(near(c->total_modeled_seconds(), e + NetModel::ring_allgather_time(size, n, a, bw)), "total");
    }
    {  // Torus 3x2: 2 sum(k_i - 1) a + 2(p-1)/p n/B per direction; the two
       // directions carry half the vector each, i.e. the closed form at 2B.
      CommOptions o;
      o.name = "torus";
      o.algo = "torus";
      o.net = NetModel({NetDim{3, LinkKind::Ring, bw, a}, NetDim{2, LinkKind::Ring, bw, a}});
      auto c = Communicator::create(store, rank, size, o);
      c->all_reduce(buf.data(), buf.data(), count, DType::F32, ReduceOp::Sum);
      COLL_REQUIRE(c->last_algorithm() == "torus", c->last_algorithm());
      const double e = 2.0 * ((3 - 1) + (2 - 1)) * a + 2.0 * (size - 1) / size * n / (2 * bw);
      const NetModel twice({NetDim{3, LinkKind::Ring, 2 * bw, a}, NetDim{2, LinkKind::Ring, 2 * bw, a}});
      COLL_REQUIRE(near(e, twice.torus_allreduce_time(n)), "closed form ", e, " vs ", twice.torus_allreduce_time(n));
      COLL_REQUIRE(near(c->last_modeled_seconds(), e), "torus ", c->last_modeled_seconds(), " vs ", e);
      // Reduce-scatter / all-gather run one direction: the closed forms at B.
      std::vector<float> out(count / size);
      c->reduce_scatter(buf.data(), out.data(), count / size, DType::F32, ReduceOp::Sum);
      COLL_REQUIRE(near(c->last_modeled_seconds(), o.net.torus_reduce_scatter_time(n)), "torus rs ",
                   c->last_modeled_seconds(), " vs ", o.net.torus_reduce_scatter_time(n));
      c->all_gather(out.data(), buf.data(), count / size, DType::F32);
      COLL_REQUIRE(near(c->last_modeled_seconds(), o.net.torus_allgather_time(n)), "torus ag");
    }
    {  // Halving-doubling on a switch (one hop between any pair), p = 6 folds
       // 2 ranks: 2 ceil(log2 p) a + 2(p'-1)/p' n/B + the fold and unfold (2 (a + n/B)).
      CommOptions o;
      o.name = "rhd";
      o.algo = "rhd";
      o.net = NetModel({NetDim{size, LinkKind::Switch, bw, a}});
      auto c = Communicator::create(store, rank, size, o);
      c->all_reduce(buf.data(), buf.data(), count, DType::F32, ReduceOp::Sum);
      const double pp = 4;
      const double e = 2 * 2 * a + 2 * (pp - 1) / pp * n / bw + 2 * (a + n / bw);
      COLL_REQUIRE(near(c->last_modeled_seconds(), e), "rhd ", c->last_modeled_seconds(), " vs ", e);
      auto sub = c->split(rank < 4 ? 0 : -1, rank);
      if (sub) {  // a power of two: exactly the closed form
        sub->all_reduce(buf.data(), buf.data(), 4000, DType::F32, ReduceOp::Sum);
        const double e4 = NetModel::rhd_allreduce_time(4, 16000, a, bw);
        COLL_REQUIRE(near(sub->last_modeled_seconds(), e4), "rhd p=4 ", sub->last_modeled_seconds(), " vs ", e4);
      }
    }
  });
  EXPECT_EQ(failures(res), "");
}

}  // namespace
}  // namespace tessera::collectives
