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
#include <tuple>

#include "parallel/models/gpt/trainer.h"
#include "parallel/pipeline/partition.h"
#include "parallel/pipeline/schedule.h"
#include "runtime/device.h"
#include "runtime/kernels.h"
#include "tests/collectives/fork_harness.h"

namespace tessera {
namespace {

// The model trained: GPT-2, or a Llama with kv_heads K/V heads (of 8), tied or untied.
// Trained in `precision` (bf16: with fp32 masters; fp32_grads: gradients in
// fp32; sr: stochastic rounding).
struct Model {
  std::string family = "gpt";
  int kv_heads = 8;
  bool tie = false;
  DType precision = DType::F32;
  bool fp32_grads = false, sr = false;
  auto key() const { return std::make_tuple(family, kv_heads, tie, precision, fp32_grads, sr); }
  std::string name() const {
    std::string n = family == "gpt" ? "" : "_llama_kv" + std::to_string(kv_heads) + (tie ? "_tied" : "");
    if (precision == DType::BF16) n += std::string("_bf16") + (fp32_grads ? "_fp32grads" : "") + (sr ? "_sr" : "");
    return n;
  }
  // The tied embedding's name, whose copy the last pipeline stage holds.
  std::string embedding() const { return family == "gpt" ? "transformer.wte.weight" : "model.embed_tokens.weight"; }
  bool has_tied_copy(int pp) const { return pp > 1 && (family == "gpt" || tie); }
};

struct Layout {
  int tp, dp;
  bool zero1, sp;
  int64_t vocab = 256;
  std::string export_path = "";  // rank 0 exports the trained model there
  int pp = 1;
  parallel::pipeline::Schedule schedule = parallel::pipeline::Schedule::k1F1B;
  std::vector<int> stages = {};
  int64_t layers = 2;
  int virtual_stages = 1;
  int64_t global_batch = 8;
  Model model = {};
};

// The last stage's copy of the tied embedding, reported under its own name
// and compared with the serial wte.
const char* const kWteCopy = "wte_copy (last stage)";

using Tensors = std::map<std::string, std::vector<double>>;  // full tensors by name

struct RunResult {
  std::vector<double> losses, grad_norms;
  double optimizer_state_bytes = 0;  // rank 0's
  Tensors params;                    // DP replica 0's
  Tensors exp_avg, exp_avg_sq;       // AdamW moments, each element from the rank that holds it
  std::vector<Tensors> replicas;     // every DP replica's parameters (parallel runs)
};

parallel::models::gpt::TrainOptions tiny_options(int64_t vocab = 256, int64_t layers = 2, int64_t global_batch = 8,
                                                 const Model& model = {}) {
  parallel::models::gpt::TrainOptions o;
  o.model.family = model.family;
  o.precision = model.precision;
  o.fp32_grads = model.fp32_grads;
  o.stochastic_rounding = model.sr;
  if (model.family == "llama") {
    o.model.kv_heads = model.kv_heads;
    o.model.ffn_hidden = 64;
    o.model.tie_embeddings = model.tie;
  }
  o.model.vocab = static_cast<int>(vocab);
  o.model.max_seq = 16;
  o.model.hidden = 32;
  o.model.heads = 8;
  o.model.layers = static_cast<int>(layers);
  o.seq = 16;
  o.micro_batch = 1;
  o.global_batch = global_batch;
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

const RunResult& serial(int64_t vocab = 256, int64_t layers = 2, int64_t global_batch = 8, const Model& model = {});

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
  std::vector<parallel::layers::Parameter*> params = t.parameters();
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

RunResult run_serial(int64_t vocab, int64_t layers, int64_t global_batch, const Model& model) {
  Device dev(DeviceSpec::preset("test-core"));
  auto ps = parallel::layers::serial_state(&dev);
  parallel::models::gpt::Trainer t(tiny_options(vocab, layers, global_batch, model), ps, dataset());
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

// The serial result with the wte copy a pipeline's last stage holds (equal to wte).
RunResult with_wte_copy(RunResult r, const Model& model = {}) {
  if (!model.has_tied_copy(2)) return r;
  const std::string wte = model.embedding();
  r.params[kWteCopy] = r.params.at(wte);
  r.exp_avg[kWteCopy] = r.exp_avg.at(wte);
  r.exp_avg_sq[kWteCopy] = r.exp_avg_sq.at(wte);
  return r;
}

// Runs the layout as tp * dp * pp forked processes over the real communicator.
RunResult run(const Layout& l) {
  kern::default_blas_threads();
  std::vector<std::pair<std::string, int64_t>> sizes;
  const RunResult& ref = serial(l.vocab, l.layers, l.global_batch, l.model);
  for (const auto& [name, v] : ref.params) sizes.emplace_back(name, static_cast<int64_t>(v.size()));
  if (l.model.has_tied_copy(l.pp))
    sizes.emplace_back(kWteCopy, static_cast<int64_t>(ref.params.at(l.model.embedding()).size()));
  const int ranks = l.tp * l.dp * l.pp;
  SharedResults shared(sizes, ranks);
  auto res = collectives::test::run_ranks(ranks, [&](int rank, int size, std::shared_ptr<collectives::Store> store) {
    Device dev(DeviceSpec::preset("test-core"), rank);
    collectives::CommOptions co;
    co.device = &dev;
    auto world = collectives::Communicator::create(std::move(store), rank, size, co);
    parallel::models::gpt::TrainOptions o = tiny_options(l.vocab, l.layers, l.global_batch, l.model);
    parallel::layers::ParallelState ps = parallel::layers::make_parallel_state(
        world, l.tp, l.dp, &dev, l.sp, l.pp, parallel::models::kv_replicas(o.model, l.tp));
    o.tp = l.tp;
    o.dp = l.dp;
    o.pp = l.pp;
    o.schedule = l.schedule;
    o.virtual_stages = l.virtual_stages;
    o.stages = l.stages;
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
    const int slot = rank;
    const bool copy_stage = l.pp > 1 && ps.last_stage();
    auto key = [&](const parallel::layers::Parameter& p) {
      return copy_stage && &p == t.tied_wte() ? std::string(kWteCopy) : p.name;
    };
    for (parallel::layers::Parameter* p : t.parameters()) {
      double* out = shared.at(slot, 0, key(*p));
      parallel::layers::for_each_shard_element(*p, [&](int64_t li, int64_t gi) {
        if (gi >= 0) out[gi] = p->value[li];
      });
    }
    for_each_moment(t, [&](parallel::layers::Parameter& p, int64_t gi, float m, float v) {
      shared.at(slot, 1, key(p))[gi] = m;
      shared.at(slot, 2, key(p))[gi] = v;
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
  // Slot = global rank = tp_rank + dp_rank * tp + pp_rank * tp * dp. Replica
  // d is the union of its TP ranks' and stages' views; a replicated tensor
  // must be the same on all of them, and every element must be held by some rank.
  r.replicas.resize(static_cast<size_t>(l.dp));
  for (int d = 0; d < l.dp; ++d) {
    for (const auto& [name, n] : sizes) {
      std::vector<double> full(static_cast<size_t>(n), std::nan(""));
      for (int tpp = 0; tpp < l.tp * l.pp; ++tpp) {
        const int tp = tpp % l.tp, pp = tpp / l.tp;
        const double* src = shared.at(tp + d * l.tp + pp * l.tp * l.dp, 0, name);
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
      for (int rank = 0; rank < ranks; ++rank) {
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

const RunResult& serial(int64_t vocab, int64_t layers, int64_t global_batch, const Model& model) {
  static std::map<std::tuple<int64_t, int64_t, int64_t, decltype(model.key())>, RunResult> cache;
  const auto key = std::make_tuple(vocab, layers, global_batch, model.key());
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, run_serial(vocab, layers, global_batch, model)).first;
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
      const auto third = static_cast<std::ptrdiff_t>(c);  // the key bias is the middle third
      std::fill(g.begin() + third, g.begin() + 2 * third, 0.f);
      auto wq = w;
      std::fill(wq.begin() + third, wq.begin() + 2 * third, 0.f);
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
// The same memory discipline for Llama: serial, and tp 2 > 1 K/V head (the
// K/V groups' gradient sums) with SP and ZeRO-1 over 4 ranks.
TEST(ParallelTraining, LlamaSteadyStateStepsAllocateNothingOnDevice) {
  Device dev(DeviceSpec::preset("test-core"));
  auto ps = parallel::layers::serial_state(&dev);
  parallel::models::gpt::TrainOptions o = tiny_options(256, 2, 8, Model{"llama", 2, false});
  o.micro_batch = 2;
  parallel::models::gpt::Trainer t(o, ps, dataset());
  EXPECT_EQ(steady_state_device_changes(t, dev), "");
}

TEST(ParallelTraining, LlamaSteadyStateParallelStepsAllocateNothingOnDevice) {
  kern::default_blas_threads();
  auto res = collectives::test::run_ranks(4, [&](int rank, int size, std::shared_ptr<collectives::Store> store) {
    Device dev(DeviceSpec::preset("test-core"), rank);
    collectives::CommOptions co;
    co.device = &dev;
    auto world = collectives::Communicator::create(std::move(store), rank, size, co);
    parallel::models::gpt::TrainOptions o = tiny_options(256, 2, 8, Model{"llama", 1, false});
    o.tp = 2;
    o.dp = 2;
    o.sequence_parallel = true;
    o.adamw.zero1 = true;
    parallel::layers::ParallelState ps = parallel::layers::make_parallel_state(
        world, 2, 2, &dev, /*sequence_parallel=*/true, 1, parallel::models::kv_replicas(o.model, 2));
    parallel::models::gpt::Trainer t(o, ps, dataset());
    const std::string changes = steady_state_device_changes(t, dev);
    TESSERA_CHECK(changes.empty(), "rank ", rank, " in steady steps: ", changes);
    world->barrier();
  });
  std::string f = collectives::test::failures(res);
  EXPECT_TRUE(f.empty()) << f;
}

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
  std::string what = "tp" + std::to_string(l.tp) + " dp" + std::to_string(l.dp) + (l.zero1 ? " zero1" : "") +
                     (l.sp ? " sp" : "") + l.model.name();
  expect_same(run(l), serial(l.vocab, l.layers, l.global_batch, l.model), what);
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

std::string tp_dp_name(const ::testing::TestParamInfo<Layout>& i) {
  return "tp" + std::to_string(i.param.tp) + "_dp" + std::to_string(i.param.dp) + (i.param.zero1 ? "_zero1" : "") +
         (i.param.sp ? "_sp" : "") + i.param.model.name();
}

INSTANTIATE_TEST_SUITE_P(AllTpDp, Layouts, ::testing::ValuesIn(all_layouts()), tp_dp_name);

// Llama (8 heads): K/V heads split (tp < kv_heads), one per rank (tp =
// kv_heads), and replicated when tp exceeds them (kv_heads 1 and 2 at tp 4,
// 2 at tp 8: each K/V head's gradient summed over exactly its ranks), with
// ZeRO-1 and SP, tied and untied heads.
std::vector<Layout> llama_layouts() {
  auto l = [](int tp, int dp, bool zero1, bool sp, int kv, bool tie = false) {
    Layout x{tp, dp, zero1, sp};
    x.model = {"llama", kv, tie};
    return x;
  };
  return {l(2, 1, false, false, 8),      l(2, 2, true, false, 2),       l(4, 1, false, false, 1),
          l(4, 2, true, false, 2),       l(4, 1, false, true, 2),       l(4, 2, false, true, 1, true),
          l(8, 1, false, false, 2),      l(8, 1, false, true, 8, true), l(1, 8, true, false, 2),
          l(1, 2, false, false, 1, true)};
}

INSTANTIATE_TEST_SUITE_P(LlamaTpDp, Layouts, ::testing::ValuesIn(llama_layouts()), tp_dp_name);

// ---- bf16 ----
// How far two runs are apart: the largest relative loss difference over the
// steps, and the largest over tensors of the parameters' difference relative
// to the tensor's 2-norm.
struct Distance {
  double loss = 0, params = 0;
};
Distance distance(const RunResult& a, const RunResult& b) {
  Distance d;
  for (size_t i = 0; i < b.losses.size(); ++i)
    d.loss = std::max(d.loss, std::abs(a.losses[i] - b.losses[i]) / std::abs(b.losses[i]));
  for (const auto& [name, w] : b.params) {
    if (name.find("weight") == std::string::npos) continue;  // biases: see Bf16Layouts
    const auto& g = a.params.at(name);
    double n = 0, e = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      n += w[i] * w[i];
      e += (g[i] - w[i]) * (g[i] - w[i]);
    }
    d.params = std::max(d.params, std::sqrt(e / n));
  }
  return d;
}

Model bf16_of(Model m, bool fp32_grads = false) {
  m.precision = DType::BF16;
  m.fp32_grads = fp32_grads;
  return m;
}

// ---- pipeline parallelism ----
// Every stage's parameters (and the last stage's wte copy) and the AdamW
// moments after 3 steps equal the serial 4-layer model's, for each schedule
// over 2 and 4 stages, mixed with TP (and SP), DP and ZeRO-1, with uneven
// and explicit partitions and micro-batch counts the stages do not divide.
class Pipelines : public ::testing::TestWithParam<Layout> {};

std::string pipeline_name(const Layout& l) {
  std::string n = "tp" + std::to_string(l.tp) + "_pp" + std::to_string(l.pp) + "_dp" + std::to_string(l.dp) + "_" +
                  parallel::pipeline::schedule_name(l.schedule);
  if (l.zero1) n += "_zero1";
  if (l.sp) n += "_sp";
  if (!l.stages.empty()) n += "_stages" + parallel::pipeline::stages_str(l.stages);
  if (l.global_batch != 8) n += "_gb" + std::to_string(l.global_batch);
  if (l.virtual_stages != 1) n += "_v" + std::to_string(l.virtual_stages);
  n += l.model.name();
  for (char& c : n)
    if (c == ',') c = '_';
  return n;
}

// NOLINTNEXTLINE(readability-identifier-naming): gtest finds it by this name
void PrintTo(const Layout& l, std::ostream* os) { *os << pipeline_name(l); }

TEST_P(Pipelines, MatchesSerial) {
  const Layout l = GetParam();
  expect_same(run(l), with_wte_copy(serial(l.vocab, l.layers, l.global_batch, l.model), l.model), pipeline_name(l));
}

std::vector<Layout> pipeline_layouts() {
  using parallel::pipeline::Schedule;
  auto pipe = [](int tp, int pp, int dp, Schedule s, bool zero1 = false, bool sp = false, std::vector<int> stages = {},
                 int64_t global_batch = 8) {
    Layout l{tp, dp, zero1, sp};
    l.global_batch = global_batch;
    l.pp = pp;
    l.schedule = s;
    l.stages = std::move(stages);
    l.layers = 4;
    return l;
  };
  auto interleaved = [](int tp, int pp, int dp, int v, std::vector<int> stages = {}, int64_t global_batch = 8,
                        int64_t layers = 4, bool zero1 = false, bool sp = false) {
    Layout l{tp, dp, zero1, sp};
    l.pp = pp;
    l.schedule = Schedule::kInterleaved;
    l.virtual_stages = v;
    l.stages = std::move(stages);
    l.global_batch = global_batch;
    l.layers = layers;
    return l;
  };
  return {
      pipe(1, 2, 1, Schedule::kGpipe),  // 8 micro-batches
      pipe(1, 2, 1, Schedule::k1F1B),
      pipe(1, 4, 1, Schedule::kGpipe),  // pp equal to the layer count
      pipe(1, 4, 1, Schedule::k1F1B),
      pipe(1, 2, 1, Schedule::k1F1B, false, false, {3, 1}),  // uneven, explicit
      pipe(2, 2, 2, Schedule::k1F1B, true),                  // tp2 x pp2 x dp2, ZeRO-1
      pipe(2, 2, 2, Schedule::kGpipe, false, true),          // with sequence parallelism
      pipe(1, 2, 4, Schedule::k1F1B, true),                  // 2 micro-batches per DP rank: m = p
      pipe(1, 4, 2, Schedule::k1F1B),                        // 4 micro-batches over 4 stages
      pipe(1, 4, 1, Schedule::k1F1B, false, false, {}, 6),   // m = 6, which 4 stages do not divide
      pipe(1, 4, 1, Schedule::k1F1B, false, false, {}, 3),   // m = 3 < p: warm-up cut short
      interleaved(1, 2, 1, 2),                               // 8 micro-batches, 4 virtual stages of 1 layer
      interleaved(1, 2, 1, 2, {}, 2),                        // m = p = 2: all forwards first (Megatron)
      interleaved(1, 4, 1, 2, {}, 8, 8),                     // pp 4 x v 2 over 8 layers
      interleaved(2, 2, 2, 2, {}, 8, 4, true),               // tp2 x pp2 x dp2, ZeRO-1
      interleaved(2, 2, 1, 2, {}, 8, 4, false, true),        // with sequence parallelism
      interleaved(1, 2, 1, 2, {2, 1, 1, 2}, 4, 6),           // uneven explicit virtual stages, m = 4
  };
}

INSTANTIATE_TEST_SUITE_P(Layouts, Pipelines, ::testing::ValuesIn(pipeline_layouts()),
                         [](const ::testing::TestParamInfo<Layout>& i) { return pipeline_name(i.param); });

// Llama through each schedule, mixed with TP beyond the K/V heads, DP,
// ZeRO-1 and SP; tied (the last stage's copy summed with the first's) and untied.
std::vector<Layout> llama_pipeline_layouts() {
  using parallel::pipeline::Schedule;
  std::vector<Layout> v;
  auto add = [&](int tp, int pp, int dp, Schedule s, int kv, bool tie, bool zero1 = false, bool sp = false,
                 int virtual_stages = 1) {
    Layout l{tp, dp, zero1, sp};
    l.pp = pp;
    l.schedule = s;
    l.layers = 4;
    l.virtual_stages = virtual_stages;
    l.model = {"llama", kv, tie};
    v.push_back(l);
  };
  add(1, 2, 1, Schedule::kGpipe, 2, false);
  add(1, 2, 1, Schedule::k1F1B, 2, true);
  add(1, 4, 2, Schedule::k1F1B, 1, false, true);
  add(2, 2, 2, Schedule::k1F1B, 1, true, true);           // tp 2 > kv 1, ZeRO-1
  add(4, 2, 1, Schedule::kGpipe, 2, false, false, true);  // tp 4 > kv 2, SP
  add(2, 2, 1, Schedule::kInterleaved, 2, true, false, false, 2);
  add(2, 2, 2, Schedule::kInterleaved, 1, false, true, true, 2);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Llama, Pipelines, ::testing::ValuesIn(llama_pipeline_layouts()),
                         [](const ::testing::TestParamInfo<Layout>& i) { return pipeline_name(i.param); });

// With 1F1B, a pipeline stage's later steps allocate nothing on its device
// either (the activation slots, receive buffers and buckets come from step 1).
TEST(PipelineTraining, SteadyStateStepsAllocateNothingOnDevice) {
  kern::default_blas_threads();
  auto res = collectives::test::run_ranks(2, [&](int rank, int size, std::shared_ptr<collectives::Store> store) {
    Device dev(DeviceSpec::preset("test-core"), rank);
    collectives::CommOptions co;
    co.device = &dev;
    auto world = collectives::Communicator::create(std::move(store), rank, size, co);
    parallel::layers::ParallelState ps = parallel::layers::make_parallel_state(world, 1, 1, &dev, false, 2);
    for (auto s : {parallel::pipeline::Schedule::k1F1B, parallel::pipeline::Schedule::kInterleaved}) {
      parallel::models::gpt::TrainOptions o = tiny_options(256, 4);
      o.pp = 2;
      o.schedule = s;
      o.virtual_stages = s == parallel::pipeline::Schedule::kInterleaved ? 2 : 1;
      parallel::models::gpt::Trainer t(o, ps, dataset());
      const std::string changes = steady_state_device_changes(t, dev);
      TESSERA_CHECK(changes.empty(), "stage ", rank, " in steady ", parallel::pipeline::schedule_name(s),
                    " steps: ", changes);
      // 1F1B holds at most p - stage micro-batches (8 micro-batches in the step).
      if (o.virtual_stages == 1)
        TESSERA_CHECK(t.model().num_slots() == 2 - rank, "stage ", rank, " used ", t.model().num_slots(), " slots");
    }
    world->barrier();
  });
  std::string f = collectives::test::failures(res);
  EXPECT_TRUE(f.empty()) << f;
}

// The same with TP, DP and ZeRO-1 around the pipeline (tp2 x pp2 x dp2, 8
// ranks): the DP buckets, the ZeRO-1 shards and all-gathers, the embedding
// sum and the pipeline buffers all come from step 1.
TEST(PipelineTraining, SteadyStateTpPpDpStepsAllocateNothingOnDevice) {
  kern::default_blas_threads();
  auto res = collectives::test::run_ranks(8, [&](int rank, int size, std::shared_ptr<collectives::Store> store) {
    Device dev(DeviceSpec::preset("test-core"), rank);
    collectives::CommOptions co;
    co.device = &dev;
    auto world = collectives::Communicator::create(std::move(store), rank, size, co);
    parallel::layers::ParallelState ps = parallel::layers::make_parallel_state(world, 2, 2, &dev, false, 2);
    for (auto s : {parallel::pipeline::Schedule::k1F1B, parallel::pipeline::Schedule::kInterleaved}) {
      parallel::models::gpt::TrainOptions o = tiny_options(256, 4);
      o.tp = 2;
      o.dp = 2;
      o.pp = 2;
      o.adamw.zero1 = true;
      o.schedule = s;
      o.virtual_stages = s == parallel::pipeline::Schedule::kInterleaved ? 2 : 1;
      parallel::models::gpt::Trainer t(o, ps, dataset());
      const std::string changes = steady_state_device_changes(t, dev);
      TESSERA_CHECK(changes.empty(), "rank ", rank, " in steady ", parallel::pipeline::schedule_name(s),
                    " steps: ", changes);
    }
    world->barrier();
  });
  std::string f = collectives::test::failures(res);
  EXPECT_TRUE(f.empty()) << f;
}

// GPipe holds every micro-batch of the step at once.
TEST(PipelineTraining, GpipeHoldsEveryMicroBatch) {
  kern::default_blas_threads();
  auto res = collectives::test::run_ranks(2, [&](int rank, int size, std::shared_ptr<collectives::Store> store) {
    Device dev(DeviceSpec::preset("test-core"), rank);
    collectives::CommOptions co;
    co.device = &dev;
    auto world = collectives::Communicator::create(std::move(store), rank, size, co);
    parallel::layers::ParallelState ps = parallel::layers::make_parallel_state(world, 1, 1, &dev, false, 2);
    parallel::models::gpt::TrainOptions o = tiny_options(256, 2);
    o.pp = 2;
    o.schedule = parallel::pipeline::Schedule::kGpipe;
    parallel::models::gpt::Trainer t(o, ps, dataset());
    t.init_random();
    t.step();
    TESSERA_CHECK(t.model().num_slots() == 8, "stage ", rank, " used ", t.model().num_slots(), " slots");
    world->barrier();
  });
  std::string f = collectives::test::failures(res);
  EXPECT_TRUE(f.empty()) << f;
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// Every layout of tp * pp * dp <= 8 (the fp32 suites' layouts, GPT and
// Llama) in bf16 with master weights, bf16 and fp32 gradient reduction,
// against the serial bf16 run.
//
// The tolerance. A layout computes the same bf16 training as the serial run
// with other fp32 summation orders (TP splits of the contractions, DP sums of
// gradients) and other bf16 rounding points (a TP partial sum is rounded
// before its all-reduce, the serial product once): another sample of bf16's
// rounding error around the fp32 trajectory. The serial bf16 run is one such
// sample, at distance D (its loss and weights against the serial fp32 run's,
// measured here); by the triangle inequality two samples at most D from fp32
// are at most 2 D apart. Biases are left out of the weights' distance: they
// start at 0, so relative to their own norm they are rounding noise (the key
// bias's exact gradient is 0). With fp32 gradients and tp = 1 the layout
// changes only the fp32 order of the gradient's DP sum, so the fp32 suites'
// bound holds: 1e-5.
class Bf16Layouts : public ::testing::TestWithParam<Layout> {};

TEST_P(Bf16Layouts, TracksSerialBf16) {
  const Layout l = GetParam();
  Model fp32 = l.model;
  fp32.precision = DType::F32;
  fp32.fp32_grads = fp32.sr = false;
  const RunResult& s16 = serial(l.vocab, l.layers, l.global_batch, l.model);
  const Distance noise = distance(s16, serial(l.vocab, l.layers, l.global_batch, fp32));
  const Distance got = distance(run(l), s16);
  const std::string what = pipeline_name(l);
  ASSERT_GT(noise.loss, 1e-6) << what << ": bf16 training should differ from fp32";
  ASSERT_GT(noise.params, 1e-4) << what;
  EXPECT_LE(got.loss, 2 * noise.loss) << what << " (serial bf16 to fp32: " << noise.loss << ")";
  EXPECT_LE(got.params, 2 * noise.params) << what << " (serial bf16 to fp32: " << noise.params << ")";
  if (l.model.fp32_grads && l.tp == 1 && l.pp == 1) {
    EXPECT_LE(got.loss, 1e-5) << what;
    EXPECT_LE(got.params, 1e-5) << what;
  }
}

std::vector<Layout> bf16_layouts() {
  std::vector<Layout> v;
  for (bool g32 : {false, true}) {
    for (const auto& list : {all_layouts(), llama_layouts(), pipeline_layouts(), llama_pipeline_layouts()}) {
      for (Layout l : list) {
        if (l.tp * l.dp * l.pp > 8 || !l.export_path.empty()) continue;
        l.model = bf16_of(l.model, g32);
        v.push_back(l);
      }
    }
  }
  return v;
}

std::string bf16_name(const ::testing::TestParamInfo<Layout>& i) { return pipeline_name(i.param); }

// Stochastic rounding's draws depend on (seed, step, tensor, element of the
// full tensor) only. One optimizer step with zero gradients leaves AdamW's
// decoupled decay alone, master = bf16(init) (1 - lr wd), the same fp32 value
// in every layout: the rounded bf16 weights must then be identical in every
// layout, element by element (a draw keyed by the shard's local index, or by
// the rank, moves them), and differ from round-to-nearest in many elements.
Tensors decay_step_weights(const Layout& l, bool sr) {
  Model m = bf16_of(l.model);
  m.sr = sr;
  auto options = [&]() {
    parallel::models::gpt::TrainOptions o = tiny_options(l.vocab, l.layers, l.global_batch, m);
    o.lr = 0.05;  // decay 0.5% per step: about one bf16 ulp, so the rounding decides
    o.warmup = 0;
    o.tp = l.tp;
    o.dp = l.dp;
    o.pp = l.pp;
    o.sequence_parallel = l.sp;
    o.adamw.zero1 = l.zero1;
    return o;
  };
  std::vector<std::pair<std::string, int64_t>> sizes;
  {
    Device dev(DeviceSpec::preset("test-core"));
    auto ps = parallel::layers::serial_state(&dev);
    parallel::models::gpt::TrainOptions o = options();
    o.tp = o.dp = o.pp = 1;
    o.sequence_parallel = o.adamw.zero1 = false;
    parallel::models::gpt::Trainer t(o, ps, dataset());
    for (parallel::layers::Parameter* p : t.parameters()) sizes.emplace_back(p->name, shape_numel(p->full_shape));
  }
  const int ranks = l.tp * l.dp * l.pp;
  SharedResults shared(sizes, ranks);
  auto res = collectives::test::run_ranks(ranks, [&](int rank, int size, std::shared_ptr<collectives::Store> store) {
    Device dev(DeviceSpec::preset("test-core"), rank);
    collectives::CommOptions co;
    co.device = &dev;
    auto world = collectives::Communicator::create(std::move(store), rank, size, co);
    parallel::models::gpt::TrainOptions o = options();
    parallel::layers::ParallelState ps = parallel::layers::make_parallel_state(
        world, l.tp, l.dp, &dev, l.sp, l.pp, parallel::models::kv_replicas(tiny_options(l.vocab).model, l.tp));
    parallel::models::gpt::Trainer t(o, ps, dataset());
    t.init_random();
    t.optimizer().zero_grad();
    t.optimizer().step(1);
    const bool copy_stage = l.pp > 1 && ps.last_stage();
    for (parallel::layers::Parameter* p : t.parameters()) {
      if (copy_stage && p == t.tied_wte()) continue;
      double* out = shared.at(rank, 0, p->name);
      parallel::layers::for_each_shard_element(*p, [&](int64_t li, int64_t gi) {
        if (gi >= 0) out[gi] = p->value[li];
      });
    }
    world->barrier();
  });
  std::string f = collectives::test::failures(res);
  EXPECT_TRUE(f.empty()) << f;
  Tensors out;  // rank 0's view of replicated tensors, the holder's of sharded elements
  for (const auto& [name, n] : sizes) {
    std::vector<double> full(static_cast<size_t>(n), std::nan(""));
    for (int r = 0; r < ranks; ++r) {
      const double* src = shared.at(r, 0, name);
      for (int64_t i = 0; i < n; ++i) {
        if (std::isnan(src[i])) continue;
        if (!std::isnan(full[static_cast<size_t>(i)]) && full[static_cast<size_t>(i)] != src[i])
          ADD_FAILURE() << name << "[" << i << "] differs between ranks";
        full[static_cast<size_t>(i)] = src[i];
      }
    }
    out[name] = std::move(full);
  }
  return out;
}

TEST(Bf16StochasticRounding, SameDrawsInEveryLayout) {
  const Layout serial_layout{1, 1, false, false};
  const Tensors want = decay_step_weights(serial_layout, true);
  const Tensors nearest = decay_step_weights(serial_layout, false);
  int64_t differ = 0, total = 0;
  for (const auto& [name, w] : want) {
    const auto& r = nearest.at(name);
    for (size_t i = 0; i < w.size(); ++i) {
      differ += w[i] != r[i];
      total += w[i] != 0;
    }
  }
  EXPECT_GT(differ, total / 20) << "stochastic rounding should move many weights off the nearest bf16";
  std::vector<Layout> layouts{{2, 1, false, false}, {4, 2, true, true}, {1, 4, true, false}, {2, 2, false, false}};
  Layout pp{2, 2, true, false};
  pp.pp = 2;
  layouts.push_back(pp);
  for (const Layout& l : layouts) {
    const Tensors got = decay_step_weights(l, true);
    for (const auto& [name, w] : want) {
      const auto& g = got.at(name);
      int64_t bad = 0;
      for (size_t i = 0; i < w.size(); ++i) bad += g[i] != w[i];
      EXPECT_EQ(bad, 0) << pipeline_name(l) << ": " << name << " has " << bad << " of " << w.size()
                        << " elements other than the serial run's";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllLayouts, Bf16Layouts, ::testing::ValuesIn(bf16_layouts()), bf16_name);

}  // namespace
}  // namespace tessera
