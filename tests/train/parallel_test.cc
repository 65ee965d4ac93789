// Tensor/data parallel training equals serial training: every (tp, dp) with
// tp * dp <= 8 (tp in 1, 2, 4, 8), plain DP, ZeRO-1 and sequence parallelism,
// after 3 AdamW steps from the same seed gives the serial run's losses and
// parameters within 1e-5 (relative to each tensor's 2-norm) on every DP
// replica (ZeRO-1: the gathered parameters on every rank), and the AdamW
// moments within 1e-4 (every element held by some rank, all holders agreeing).
// Ranks are forked processes, each with its own Device, over the shared-memory
// communicator.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <sstream>

#include "parallel/models/gpt/trainer.h"
#include "runtime/device.h"
#include "runtime/kernels.h"
#include "tests/collectives/fork_harness.h"

namespace tessera {
namespace {

struct Layout {
  int tp, dp;
  bool zero1, sp;
  int64_t vocab = 256;
  std::string export_path = "";  // rank 0 exports the trained model there
};

using Tensors = std::map<std::string, std::vector<double>>;  // full tensors by name

struct RunResult {
  std::vector<double> losses, grad_norms;
  double optimizer_state_bytes = 0;  // rank 0's
  Tensors params;                    // DP replica 0's
  Tensors exp_avg, exp_avg_sq;       // AdamW moments, each element from the rank that holds it
  std::vector<Tensors> replicas;     // every DP replica's parameters (parallel runs)
};

parallel::models::gpt::TrainOptions tiny_options(int64_t vocab = 256) {
  parallel::models::gpt::TrainOptions o;
  o.model.vocab = vocab;
  o.model.seq = 16;
  o.model.hidden = 32;
  o.model.heads = 8;
  o.model.layers = 2;
  o.seq = 16;
  o.micro_batch = 1;
  o.global_batch = 8;
  o.steps = 3;
  o.lr = 3e-4;
  o.warmup = 1;
  o.seed = 7;
  o.adamw.bucket_elems = 5000;  // several buckets even for this model
  return o;
}

std::shared_ptr<const parallel::data::ByteDataset> dataset() {
  static auto ds = std::make_shared<const parallel::data::ByteDataset>(parallel::data::ByteDataset::default_files());
  return ds;
}

const RunResult& serial(int64_t vocab = 256);

// Results come back through a shared anonymous mapping made before fork:
// losses and grad norms (rank 0), then one block per rank holding its view of
// every parameter and of the AdamW moments it keeps, as full tensors; an
// element the rank does not hold stays NaN.
class SharedResults {
 public:
  SharedResults(const std::vector<std::pair<std::string, int64_t>>& sizes, int ranks) {
    size_t n = 0;
    for (const auto& [name, numel] : sizes) {
      offsets_[name] = n;
      n += static_cast<size_t>(numel);
    }
    per_tensor_set_ = n;
    bytes_ = (8 + 3 * n * static_cast<size_t>(ranks)) * sizeof(double);
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
    base_ = static_cast<double*>(p);
    std::fill(base_ + 8, base_ + bytes_ / sizeof(double), std::nan(""));
  }
  ~SharedResults() { ::munmap(base_, bytes_); }
  double* head() { return base_; }
  // what: 0 parameters, 1 exp_avg, 2 exp_avg_sq.
  double* at(int rank, int what, const std::string& name) {
    return base_ + 8 + (static_cast<size_t>(rank) * 3 + static_cast<size_t>(what)) * per_tensor_set_ +
           offsets_.at(name);
  }

 private:
  std::map<std::string, size_t> offsets_;
  size_t per_tensor_set_ = 0;
  double* base_ = nullptr;
  size_t bytes_ = 0;
};

// Calls fn(parameter, full index, m, v) for every moment element the optimizer holds on this rank.
void for_each_moment(parallel::models::gpt::Trainer& t,
                     const std::function<void(parallel::layers::Parameter&, int64_t, float, float)>& fn) {
  std::vector<parallel::layers::Parameter*> params = t.model().parameters();
  std::map<int64_t, parallel::layers::Parameter*> by_offset;
  std::map<parallel::layers::Parameter*, std::vector<int64_t>> global;
  for (parallel::layers::Parameter* p : params) {
    by_offset[p->offset] = p;
    auto& g = global[p];
    g.assign(static_cast<size_t>(p->numel()), -1);
    parallel::layers::for_each_shard_element(*p, [&](int64_t li, int64_t gi) { g[static_cast<size_t>(li)] = gi; });
  }
  t.optimizer().for_each_moment_run([&](int64_t off, int64_t n, const float* m, const float* v) {
    for (int64_t i = 0; i < n; ++i) {
      auto it = std::prev(by_offset.upper_bound(off + i));
      parallel::layers::Parameter* p = it->second;
      TESSERA_CHECK(off + i < p->offset + p->numel(), "moment element ", off + i, " outside every parameter");
      const int64_t gi = global[p][static_cast<size_t>(off + i - p->offset)];
      if (gi >= 0) fn(*p, gi, m[i], v[i]);
    }
  });
}

RunResult run_serial(int64_t vocab) {
  Device dev(DeviceSpec::preset("test-core"));
  auto ps = parallel::layers::serial_state(&dev);
  parallel::models::gpt::Trainer t(tiny_options(vocab), ps, dataset());
  t.init_random();
  RunResult r;
  for (int s = 0; s < 3; ++s) {
    auto rec = t.step();
    r.losses.push_back(rec.loss);
    r.grad_norms.push_back(rec.grad_norm);
  }
  for (parallel::layers::Parameter* p : t.model().parameters()) {
    auto& full = r.params[p->name];
    full.resize(shape_numel(p->full_shape));
    parallel::layers::for_each_shard_element(*p, [&](int64_t li, int64_t gi) { full[gi] = p->value[li]; });
    r.exp_avg[p->name].assign(full.size(), std::nan(""));
    r.exp_avg_sq[p->name].assign(full.size(), std::nan(""));
  }
  for_each_moment(t, [&](parallel::layers::Parameter& p, int64_t gi, float m, float v) {
    r.exp_avg[p.name][static_cast<size_t>(gi)] = m;
    r.exp_avg_sq[p.name][static_cast<size_t>(gi)] = v;
  });
  return r;
}

// Runs the layout as tp * dp forked processes over the real communicator.
RunResult run(const Layout& l) {
  kern::default_blas_threads();
  std::vector<std::pair<std::string, int64_t>> sizes;
  for (const auto& [name, v] : serial(l.vocab).params) sizes.emplace_back(name, static_cast<int64_t>(v.size()));
  SharedResults shared(sizes, l.tp * l.dp);
  auto res =
      collectives::test::run_ranks(l.tp * l.dp, [&](int rank, int size, std::shared_ptr<collectives::Store> store) {
        Device dev(DeviceSpec::preset("test-core"), rank);
        collectives::CommOptions co;
        co.device = &dev;
        auto world = collectives::Communicator::create(std::move(store), rank, size, co);
        parallel::layers::ParallelState ps = parallel::layers::make_parallel_state(world, l.tp, l.dp, &dev, l.sp);
        parallel::models::gpt::TrainOptions o = tiny_options(l.vocab);
        o.tp = l.tp;
        o.dp = l.dp;
        o.sequence_parallel = l.sp;
        o.adamw.zero1 = l.zero1;
        parallel::models::gpt::Trainer t(o, ps, dataset());
        t.init_random();
        for (int s = 0; s < 3; ++s) {
          auto r = t.step();
          if (rank == 0) {
            shared.head()[s] = r.loss;
            shared.head()[3 + s] = r.grad_norm;
          }
        }
        if (!l.export_path.empty()) t.export_hf(l.export_path);
        if (rank == 0) shared.head()[6] = static_cast<double>(t.optimizer().optimizer_state_bytes());
        // Every rank reports what it holds: its (gathered) parameters and its moments.
        const int slot = ps.dp_rank * l.tp + ps.tp_rank;
        for (parallel::layers::Parameter* p : t.model().parameters()) {
          double* out = shared.at(slot, 0, p->name);
          parallel::layers::for_each_shard_element(*p, [&](int64_t li, int64_t gi) {
            if (gi >= 0) out[gi] = p->value[li];
          });
        }
        for_each_moment(t, [&](parallel::layers::Parameter& p, int64_t gi, float m, float v) {
          shared.at(slot, 1, p.name)[gi] = m;
          shared.at(slot, 2, p.name)[gi] = v;
        });
        world->barrier();
      });
  std::string f = collectives::test::failures(res);
  EXPECT_TRUE(f.empty()) << f;
  RunResult r;
  for (int s = 0; s < 3; ++s) {
    r.losses.push_back(shared.head()[s]);
    r.grad_norms.push_back(shared.head()[3 + s]);
  }
  r.optimizer_state_bytes = shared.head()[6];
  // Slot = dp_rank * tp + tp_rank. Replica d is the
  // union of its TP ranks' views; a replicated tensor must be the same on all
  // of them, and every element must be held by some TP rank.
  r.replicas.resize(static_cast<size_t>(l.dp));
  for (int d = 0; d < l.dp; ++d) {
    for (const auto& [name, n] : sizes) {
      std::vector<double> full(static_cast<size_t>(n), std::nan(""));
      for (int tp = 0; tp < l.tp; ++tp) {
        const double* src = shared.at(d * l.tp + tp, 0, name);
        for (int64_t i = 0; i < n; ++i) {
          if (std::isnan(src[i])) continue;
          if (!std::isnan(full[i]) && full[i] != src[i]) {
            ADD_FAILURE() << name << "[" << i << "] differs between the TP ranks of DP replica " << d << ": " << full[i]
                          << " vs " << src[i];
            break;
          }
          full[i] = src[i];
        }
      }
      for (int64_t i = 0; i < n; ++i)
        if (std::isnan(full[i])) {
          ADD_FAILURE() << name << "[" << i << "] is held by no rank of DP replica " << d;
          break;
        }
      r.replicas[static_cast<size_t>(d)][name] = std::move(full);
    }
  }
  r.params = r.replicas[0];
  // Moments: every element held by at least one rank (one per TP rank under
  // ZeRO-1, every DP replica under plain DP); all holders must agree.
  for (int what : {1, 2}) {
    Tensors& out = what == 1 ? r.exp_avg : r.exp_avg_sq;
    for (const auto& [name, n] : sizes) {
      std::vector<double> full(static_cast<size_t>(n), std::nan(""));
      for (int rank = 0; rank < l.tp * l.dp; ++rank) {
        const double* src = shared.at(rank, what, name);
        for (int64_t i = 0; i < n; ++i) {
          if (std::isnan(src[i])) continue;
          if (!std::isnan(full[i]) && full[i] != src[i]) {
            ADD_FAILURE() << (what == 1 ? "exp_avg" : "exp_avg_sq") << " of " << name << "[" << i
                          << "] differs between the ranks that hold it";
            break;
          }
          full[i] = src[i];
        }
      }
      out[name] = std::move(full);
    }
  }
  return r;
}

const RunResult& serial(int64_t vocab) {
  static std::map<int64_t, RunResult> cache;
  auto it = cache.find(vocab);
  if (it == cache.end()) it = cache.emplace(vocab, run_serial(vocab)).first;
  return it->second;
}

void expect_same_params(const Tensors& got, const Tensors& want, const std::string& what);
void expect_same_moments(const Tensors& got, const Tensors& want, const std::string& what);

// Losses, grad norms, every DP replica's parameters and the AdamW moments.
void expect_same(const RunResult& got, const RunResult& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], 1e-5 * std::abs(want.losses[i])) << what << " loss of step " << i + 1;
    EXPECT_NEAR(got.grad_norms[i], want.grad_norms[i], 1e-4 * want.grad_norms[i]) << what << " grad norm " << i + 1;
  }
  if (got.replicas.empty()) {
    expect_same_params(got.params, want.params, what);
  } else {
    for (size_t d = 0; d < got.replicas.size(); ++d)
      expect_same_params(got.replicas[d], want.params, what + " DP replica " + std::to_string(d));
  }
  expect_same_moments(got.exp_avg, want.exp_avg, what + " exp_avg");
  expect_same_moments(got.exp_avg_sq, want.exp_avg_sq, what + " exp_avg_sq");
}

// Relative in the 2-norm of each tensor. The key bias's gradient is exactly
// 0 (it shifts each row of attention scores by a constant), so its moments
// are rounding noise: only their smallness is checked.
void expect_same_moments(const Tensors& got, const Tensors& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, w] : want) {
    const auto& g = got.at(name);
    ASSERT_EQ(g.size(), w.size()) << what << " " << name;
    const bool qkv_bias = name.find("c_attn.bias") != std::string::npos;
    const size_t c = w.size() / 3;
    double norm = 0, diff = 0, key = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      ASSERT_FALSE(std::isnan(g[i]) || std::isnan(w[i])) << what << " " << name << "[" << i << "] held by no rank";
      if (qkv_bias && i >= c && i < 2 * c) {
        key = std::max(key, std::abs(g[i]));
        continue;
      }
      norm += w[i] * w[i];
      diff += (g[i] - w[i]) * (g[i] - w[i]);
    }
    EXPECT_LE(std::sqrt(diff), 1e-4 * std::sqrt(norm))
        << what << " of " << name << " |diff| " << std::sqrt(diff) << " |serial| " << std::sqrt(norm);
    if (qkv_bias) {
      EXPECT_LE(key, 1e-3 * std::sqrt(norm)) << what << " of the key bias in " << name;
    }
  }
}

void expect_same_params(const Tensors& got_params, const Tensors& want_params, const std::string& what) {
  ASSERT_EQ(got_params.size(), want_params.size()) << what;
  for (const auto& [name, w] : want_params) {
    auto g = got_params.at(name);
    ASSERT_EQ(g.size(), w.size());
    if (name.find("c_attn.bias") != std::string::npos) {
      // The key bias only shifts each row of attention scores by a constant,
      // so its exact gradient is 0 and its values are AdamW-normalised
      // rounding noise: check it stays ~0 in both runs, compare q and v.
      const size_t c = w.size() / 3;
      double kg = 0, kw = 0, all = 0;
      for (size_t i = 0; i < w.size(); ++i) all += double(w[i]) * w[i];
      for (size_t i = c; i < 2 * c; ++i) {
        kg += double(g[i]) * g[i];
        kw += double(w[i]) * w[i];
      }
      EXPECT_LE(std::sqrt(kg), 1e-3 * std::sqrt(all)) << what << " key bias of " << name;
      EXPECT_LE(std::sqrt(kw), 1e-3 * std::sqrt(all)) << "serial key bias of " << name;
      const auto key = static_cast<std::ptrdiff_t>(c);  // the key third: [c, 2c)
      std::fill(g.begin() + key, g.begin() + 2 * key, 0.f);
      auto wq = w;
      std::fill(wq.begin() + key, wq.begin() + 2 * key, 0.f);
      double n = 0, d = 0;
      for (size_t i = 0; i < w.size(); ++i) {
        n += double(wq[i]) * wq[i];
        d += (double(g[i]) - wq[i]) * (double(g[i]) - wq[i]);
      }
      EXPECT_LE(std::sqrt(d), 1e-5 * std::sqrt(n)) << what << " q/v biases of " << name;
      continue;
    }
    // Relative in the 2-norm of the tensor: single elements whose gradient is
    // rounding noise (e.g. the key biases, whose exact gradient is 0) move by
    // AdamW's normalised step whatever their size, so an element-wise bound
    // would measure the noise, not the parallel layout.
    double norm = 0, diff = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      norm += double(w[i]) * w[i];
      diff += (double(g[i]) - w[i]) * (double(g[i]) - w[i]);
    }
    EXPECT_LE(std::sqrt(diff), 1e-5 * std::sqrt(norm))
        << what << " parameter " << name << " |diff| " << std::sqrt(diff) << " |param| " << std::sqrt(norm);
  }
}

TEST(ParallelTraining, SerialRunLearns) {
  const auto& s = serial();
  ASSERT_EQ(s.losses.size(), 3u);
  // The steps move the weights far more than the comparison tolerance.
  parallel::models::gpt::TrainOptions o = tiny_options();
  Device dev(DeviceSpec::preset("test-core"));
  auto ps = parallel::layers::serial_state(&dev);
  parallel::models::gpt::Trainer t(o, ps, dataset());
  t.init_random();
  for (parallel::layers::Parameter* p : t.model().parameters()) {
    if (p->name.find("weight") == std::string::npos) continue;
    const auto& after = s.params.at(p->name);
    double n = 0, d = 0;
    for (int64_t i = 0; i < p->numel(); ++i) {
      n += double(p->value[i]) * p->value[i];
      d += (double(after[i]) - p->value[i]) * (double(after[i]) - p->value[i]);
    }
    EXPECT_GT(std::sqrt(d), 1e-4 * std::sqrt(n)) << p->name << " barely changed";  // 10x the tolerance
  }
  EXPECT_NEAR(s.losses[0], std::log(256.0), 0.1);  // uniform prediction at init
  EXPECT_LT(s.losses[2], s.losses[0]);
}

// Activation and gradient buffers are allocated in the first step and reused:
// later steps make no Device allocation at all.
// Runs a first step, then two more; says what the two changed on the device
// (empty when they allocated nothing and the peak stayed put).
std::string steady_state_device_changes(parallel::models::gpt::Trainer& t, const Device& dev) {
  t.init_random();
  t.step();
  const auto before = dev.memory_stats();
  t.step();
  t.step();
  const auto after = dev.memory_stats();
  if (after.num_allocs == before.num_allocs && after.in_use == before.in_use && after.peak == before.peak) return "";
  std::ostringstream os;
  os << after.num_allocs - before.num_allocs << " allocations, in use " << before.in_use << " -> " << after.in_use
     << ", peak " << before.peak << " -> " << after.peak;
  return os.str();
}

TEST(ParallelTraining, SteadyStateStepsAllocateNothingOnDevice) {
  Device dev(DeviceSpec::preset("test-core"));
  auto ps = parallel::layers::serial_state(&dev);
  parallel::models::gpt::TrainOptions o = tiny_options();
  o.micro_batch = 2;
  parallel::models::gpt::Trainer t(o, ps, dataset());
  EXPECT_EQ(steady_state_device_changes(t, dev), "");
}

// The same over TP x DP with ZeRO-1 and sequence parallelism: collectives
// workspaces, buckets and the SP staging buffer are sized by the first step.
TEST(ParallelTraining, SteadyStateParallelStepsAllocateNothingOnDevice) {
  kern::default_blas_threads();
  auto res = collectives::test::run_ranks(4, [&](int rank, int size, std::shared_ptr<collectives::Store> store) {
    Device dev(DeviceSpec::preset("test-core"), rank);
    collectives::CommOptions co;
    co.device = &dev;
    auto world = collectives::Communicator::create(std::move(store), rank, size, co);
    parallel::layers::ParallelState ps =
        parallel::layers::make_parallel_state(world, 2, 2, &dev, /*sequence_parallel=*/true);
    parallel::models::gpt::TrainOptions o = tiny_options();
    o.tp = 2;
    o.dp = 2;
    o.sequence_parallel = true;
    o.adamw.zero1 = true;
    parallel::models::gpt::Trainer t(o, ps, dataset());
    const std::string changes = steady_state_device_changes(t, dev);
    TESSERA_CHECK(changes.empty(), "rank ", rank, " in steady steps: ", changes);
    world->barrier();
  });
  std::string f = collectives::test::failures(res);
  EXPECT_TRUE(f.empty()) << f;
}

// A vocabulary that does not divide over TP (257 over 4: shards of 65, the
// last padded) trains exactly like the serial model.
TEST(ParallelTraining, UnevenVocabMatchesSerial) {
  Layout l{4, 2, true, true};
  l.vocab = 257;
  expect_same(run(l), serial(257), "tp4 dp2 zero1 sp vocab 257");
}

// --export from a TP=2 run writes the full Hugging Face layout; --init of
// that file into a serial model reproduces every weight bit for bit.
TEST(ParallelTraining, ExportFromTpLoadsIntoSerial) {
  std::string dir = collectives::test::make_temp_dir();
  Layout l{2, 2, false, false};
  l.export_path = dir + "/model.safetensors";
  RunResult r = run(l);
  Device dev(DeviceSpec::preset("test-core"));
  auto ps = parallel::layers::serial_state(&dev);
  parallel::models::gpt::Trainer t(tiny_options(), ps, dataset());
  t.load_hf(l.export_path);
  for (parallel::layers::Parameter* p : t.model().parameters()) {
    const auto& want = r.params.at(p->name);
    ASSERT_EQ(static_cast<int64_t>(want.size()), p->numel()) << p->name;
    for (int64_t i = 0; i < p->numel(); ++i) ASSERT_EQ(p->value[i], static_cast<float>(want[i])) << p->name << " " << i;
  }
  std::filesystem::remove_all(dir);
}

// ZeRO-1 is plain DP with the AdamW states sharded: same numbers, 1/dp of the state.
TEST(ParallelTraining, ZeroOneEqualsPlainDp) {
  RunResult plain = run({2, 4, false, false});
  RunResult zero = run({2, 4, true, false});
  expect_same(zero, plain, "zero1 vs plain dp");
  ASSERT_GT(plain.optimizer_state_bytes, 0);
  // Buckets are padded to a multiple of dp, hence the small slack.
  EXPECT_NEAR(zero.optimizer_state_bytes, plain.optimizer_state_bytes / 4, 8.0 * 4 * 8);
}

class Layouts : public ::testing::TestWithParam<Layout> {};

TEST_P(Layouts, MatchesSerial) {
  const Layout l = GetParam();
  std::string what =
      "tp" + std::to_string(l.tp) + " dp" + std::to_string(l.dp) + (l.zero1 ? " zero1" : "") + (l.sp ? " sp" : "");
  expect_same(run(l), serial(), what);
}

std::vector<Layout> all_layouts() {
  std::vector<Layout> v;
  for (int tp : {1, 2, 4, 8})
    for (int dp : {1, 2, 4, 8})
      if (tp * dp <= 8 && tp * dp > 1) {
        v.push_back({tp, dp, false, false});
        if (dp > 1) v.push_back({tp, dp, true, false});
        if (tp > 1) v.push_back({tp, dp, false, true});
      }
  return v;
}

INSTANTIATE_TEST_SUITE_P(AllTpDp, Layouts, ::testing::ValuesIn(all_layouts()),
                         [](const ::testing::TestParamInfo<Layout>& i) {
                           return "tp" + std::to_string(i.param.tp) + "_dp" + std::to_string(i.param.dp) +
                                  (i.param.zero1 ? "_zero1" : "") + (i.param.sp ? "_sp" : "");
                         });

}  // namespace
}  // namespace tessera
