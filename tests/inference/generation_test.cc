// Generation with a KV cache (CausalLM::forward_cached, parallel/models/generation.h):
//   - for both families (GPT-2 and a Llama with GQA), at TP 1, 2, 4 and 8
//     (tp > kv_heads included), a batch of prompts of different lengths
//     decoded step by step (one prompt joining mid-way, padding-free) gives
//     the logits of recomputing the whole sequence from an empty cache
//     within 1e-5 relative; that recomputation's log-softmax equals the
//     training forward's per-token losses (an independent code path);
//   - TP generate()'s greedy tokens equal the serial run's, and seeded
//     sampling gives the same tokens in every layout and batch size
//     (continuous batching included);
//   - the inference planner's KV-cache bytes equal what the emulated device's
//     memory counter charged for the cache, and its TTFT and time per output
//     token equal the emulated clock's within 0.5%, at TP 1-8, fp32 and
//     bf16, on emulated cores and placed on inf2.48xlarge and
//     trn3-ultraserver;
//   - a prompt past the model's context and a batch whose cache does not fit
//     the device are refused by name.
// Ranks are forked processes over the shared-memory communicator
// (tests/collectives/fork_harness.h), as tests/llama/model_test.cc.
#include "parallel/models/generation.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cctype>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "parallel/inference_planner.h"
#include "parallel/layers/kv_cache.h"
#include "parallel/mesh.h"
#include "parallel/models/causal_lm.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/kernels.h"
#include "runtime/topology.h"
#include "tests/collectives/fork_harness.h"
#include "tests/parameter_values.h"

namespace tessera {
namespace {

using parallel::ModelConfig;
using parallel::layers::Parameter;
namespace models = parallel::models;
namespace layers = parallel::layers;

ModelConfig tiny_gpt() {
  ModelConfig c;
  c.name = "tiny-gpt";
  c.family = "gpt";
  c.layers = 2;
  c.hidden = 32;
  c.heads = 8;
  c.ffn_hidden = 64;
  c.vocab = 50;  // not a multiple of 4 or 8: the last TP rank's vocabulary shard is padded
  c.max_seq = 16;
  models::complete_model_config(c);
  return c;
}

// 8 heads over 2 K/V heads: tp 4 and 8 replicate each K/V head on 2 and 4 ranks.
ModelConfig tiny_llama() {
  ModelConfig c = test::tiny_llama(/*kv_heads=*/2, /*tied=*/false, /*bias=*/true);
  models::complete_model_config(c);
  return c;
}

ModelConfig family(const std::string& f) { return f == "gpt" ? tiny_gpt() : tiny_llama(); }

using test::full_value;

// A model of this rank bound for inference, every parameter from full_value.
struct Loaded {
  std::unique_ptr<models::CausalLM> model;
  std::unique_ptr<models::InferenceWeights> weights;
};
Loaded load(const ModelConfig& cfg, const layers::ParallelState& ps, DType dt = DType::F32) {
  Loaded l;
  l.model = models::make_causal_lm(cfg, ps);
  l.weights = std::make_unique<models::InferenceWeights>(*l.model, ps.device, dt);
  for (Parameter* p : l.model->parameters()) layers::load_shard(*p, full_value(*p).data());
  l.weights->finish();
  return l;
}

// Doubles shared with forked ranks (NaN until written).
class Shared {
 public:
  explicit Shared(size_t n) : n_(n) {
    mem_ = ::mmap(nullptr, bytes(), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mem_ == MAP_FAILED) throw std::runtime_error("mmap failed");
    std::fill(data(), data() + n_, std::nan(""));
  }
  ~Shared() { ::munmap(mem_, bytes()); }
  Shared(const Shared&) = delete;
  Shared& operator=(const Shared&) = delete;
  double* data() const { return static_cast<double*>(mem_); }
  double& operator[](size_t i) const { return data()[i]; }

 private:
  size_t bytes() const { return std::max<size_t>(n_, 1) * sizeof(double); }
  size_t n_;
  void* mem_;
};

// Runs fn(ps) on tp forked ranks (tp 1: one forked rank too, over a world of one), each on its
// own `device` core at `dt` (activations and the KV cache), placed as generate --topology places
// them (the topology's first tp cores; "": each group its own ring); fails the test with every
// failed rank's message.
void on_ranks(int tp, const ModelConfig& cfg, const std::string& device,
              const std::function<void(int rank, const layers::ParallelState&)>& fn, const std::string& topology = "",
              DType dt = DType::F32) {
  kern::default_blas_threads();
  NetModel net;
  std::vector<int> nodes;
  if (!topology.empty()) {
    TopologyOptions o;
    o.device = device;
    const Topology topo = Topology::load(topology, o).first_cores(tp);
    const parallel::Placement pl(topo, parallel::Mesh({.tp = tp, .dp = 1, .pp = 1}));
    for (int r = 0; r < tp; ++r) nodes.push_back(pl.node(r));
    net = topo.net_model();
  }
  auto res = collectives::test::run_ranks(tp, [&](int rank, int size, std::shared_ptr<collectives::Store> store) {
    Device dev(DeviceSpec::preset(device), rank);
    dev.set_precision(dt, dt);
    collectives::CommOptions co;
    co.device = &dev;
    co.net = net;
    co.world_ranks = nodes;
    auto world = collectives::Communicator::create(std::move(store), rank, size, co);
    const auto ps = tp == 1 ? layers::serial_state(&dev)
                            : layers::make_parallel_state(world, tp, 1, &dev, false, 1, models::kv_replicas(cfg, tp));
    fn(rank, ps);
    world->barrier();
  });
  const std::string f = collectives::test::failures(res);
  ASSERT_TRUE(f.empty()) << f;
}

// ---- the KV cache against recomputing the sequence ----

// Three prompts of 5, 2 and 9 tokens. Step 0 prefills prompts 0 and 1;
// step 1 decodes them and prefills prompt 2 in the same forward; steps 2-4
// decode all three. Decode feeds fixed tokens (not sampled ones), so every
// layout sees the same sequences.
constexpr int kSeqs = 3, kSteps = 5;
const int64_t kPrompt[kSeqs] = {5, 2, 9};
const int kJoins[kSeqs] = {0, 0, 1};  // the step each prompt is prefilled in

int32_t token(int seq, int64_t pos, int vocab) {
  return static_cast<int32_t>((int64_t{7} * seq + 11 * pos + 3) % vocab);
}
int64_t final_len(int s) { return kPrompt[s] + (kSteps - 1 - kJoins[s]); }

struct Record {
  int seq;
  int64_t pos;  // the position of the token whose logits these are
};

// The records in forward order: per step, the sequences in slot order.
std::vector<Record> schedule() {
  std::vector<Record> r;
  for (int step = 0; step < kSteps; ++step)
    for (int s = 0; s < kSeqs; ++s)
      if (step >= kJoins[s]) r.push_back({s, step == kJoins[s] ? kPrompt[s] - 1 : kPrompt[s] - 1 + step - kJoins[s]});
  return r;
}

// Runs the schedule on this rank; out gets each record's full logits, [records, vocab].
void run_schedule(models::CausalLM& m, const layers::ParallelState& ps, double* out) {
  const ModelConfig& cfg = m.config();
  std::vector<int64_t> caps;
  caps.reserve(kSeqs);
  for (int s = 0; s < kSeqs; ++s) caps.push_back(final_len(s));
  layers::KvCache cache(ps.device, cfg.layers, models::kv_cache_width(cfg, ps.tp_size), caps);
  std::vector<float> gathered, full;
  size_t rec = 0;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<int32_t> toks;
    std::vector<int> slots;
    std::vector<int64_t> lens;
    for (int s = 0; s < kSeqs; ++s) {
      if (step < kJoins[s]) continue;
      slots.push_back(s);
      if (step == kJoins[s]) {
        for (int64_t p = 0; p < kPrompt[s]; ++p) toks.push_back(token(s, p, cfg.vocab));
        lens.push_back(kPrompt[s]);
      } else {
        toks.push_back(token(s, cache.length(s), cfg.vocab));
        lens.push_back(1);
      }
    }
    const float* logits = m.forward_cached(cache, toks.data(), slots, lens, false);
    const auto rows = static_cast<int64_t>(slots.size());
    models::gather_logits(ps, cfg, logits, rows, gathered, full);
    for (int64_t r = 0; r < rows; ++r, ++rec)
      for (int64_t j = 0; j < cfg.vocab; ++j)
        out[rec * static_cast<size_t>(cfg.vocab) + static_cast<size_t>(j)] =
            full[static_cast<size_t>(r * cfg.vocab + j)];
  }
  for (int s = 0; s < kSeqs; ++s)  // on a forked rank: throw (the parent reports it)
    TESSERA_CHECK(cache.length(s) == final_len(s), "sequence ", s, " cached ", cache.length(s), " tokens");
}

// Serial recomputation: each whole sequence from an empty cache, every row's logits, [len, vocab] per sequence.
std::vector<std::vector<float>> recompute(const ModelConfig& cfg) {
  Device dev(DeviceSpec::preset("test-core"));
  const auto ps = layers::serial_state(&dev);
  Loaded l = load(cfg, ps);
  std::vector<std::vector<float>> out;
  for (int s = 0; s < kSeqs; ++s) {
    const int64_t n = final_len(s);
    layers::KvCache cache(&dev, cfg.layers, models::kv_cache_width(cfg, 1), {n});
    std::vector<int32_t> toks;
    for (int64_t p = 0; p < n; ++p) toks.push_back(token(s, p, cfg.vocab));
    const float* logits = l.model->forward_cached(cache, toks.data(), {0}, {n}, true);
    out.emplace_back(logits, logits + n * cfg.vocab);
  }
  return out;
}

class CachedForward : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(CachedForward, EqualsRecomputingTheSequence) {
  const auto& [fam, tp] = GetParam();
  const ModelConfig cfg = family(fam);
  const std::vector<std::vector<float>> want = recompute(cfg);
  const std::vector<Record> recs = schedule();
  Shared got(recs.size() * static_cast<size_t>(cfg.vocab));
  on_ranks(tp, cfg, "test-core", [&](int rank, const layers::ParallelState& ps) {
    Loaded l = load(cfg, ps);
    std::vector<double> mine(recs.size() * static_cast<size_t>(cfg.vocab));
    run_schedule(*l.model, ps, mine.data());
    if (rank == 0) std::copy(mine.begin(), mine.end(), got.data());
  });
  for (size_t i = 0; i < recs.size(); ++i) {
    const Record& r = recs[i];
    const float* w = want[static_cast<size_t>(r.seq)].data() + r.pos * cfg.vocab;
    double diff = 0, norm = 0;
    for (int64_t j = 0; j < cfg.vocab; ++j) {
      const double g = got[i * static_cast<size_t>(cfg.vocab) + static_cast<size_t>(j)];
      ASSERT_FALSE(std::isnan(g)) << "record " << i << " not written";
      diff += (g - w[j]) * (g - w[j]);
      norm += double(w[j]) * w[j];
    }
    ASSERT_GT(norm, 0);
    EXPECT_LE(std::sqrt(diff), 1e-5 * std::sqrt(norm))
        << fam << " tp " << tp << ": sequence " << r.seq << " at position " << r.pos << " (record " << i << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(Families, CachedForward,
                         ::testing::Combine(::testing::Values("gpt", "llama"), ::testing::Values(1, 2, 4, 8)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_tp" + std::to_string(std::get<1>(info.param));
                         });

// The recomputation's log-softmax against the training forward's per-token
// losses: with vocab copies of the sequence, copy j's every target j, the loss
// at position t is -log_softmax(logits_t)[j].
TEST(CachedForward, RecomputationEqualsTheTrainingForward) {
  for (const std::string fam : {"gpt", "llama"}) {
    SCOPED_TRACE(fam);
    const ModelConfig cfg = family(fam);
    const std::vector<std::vector<float>> cached = recompute(cfg);
    Device dev(DeviceSpec::preset("test-core"));
    const auto ps = layers::serial_state(&dev);
    Loaded l = load(cfg, ps);
    for (int s = 0; s < kSeqs; ++s) {
      const int64_t n = final_len(s), v = cfg.vocab;
      std::vector<int32_t> in, tg;
      for (int64_t j = 0; j < v; ++j)
        for (int64_t p = 0; p < n; ++p) {
          in.push_back(token(s, p, cfg.vocab));
          tg.push_back(static_cast<int32_t>(j));
        }
      l.model->forward(in.data(), tg.data(), v, n, false, 1.f);
      const float* loss = l.model->token_losses();
      for (int64_t p = 0; p < n; ++p) {
        const float* z = cached[static_cast<size_t>(s)].data() + p * v;
        double mx = z[0], sum = 0;
        for (int64_t j = 1; j < v; ++j) mx = std::max<double>(mx, z[j]);
        for (int64_t j = 0; j < v; ++j) sum += std::exp(z[j] - mx);
        const double lse = mx + std::log(sum);
        for (int64_t j = 0; j < v; ++j) {
          const double want = -loss[j * n + p], have = z[j] - lse;
          ASSERT_NEAR(have, want, 1e-5 * std::max(1.0, std::abs(want)))
              << "sequence " << s << " position " << p << " token " << j;
        }
      }
    }
  }
}

// ---- tokens in every layout ----

std::vector<models::GenerationRequest> requests(int64_t new_tokens, bool staggered = false) {
  std::vector<models::GenerationRequest> q;
  for (int s = 0; s < kSeqs; ++s) {
    models::GenerationRequest r;
    for (int64_t p = 0; p < kPrompt[s]; ++p) r.prompt.push_back(token(s, p, 50));
    r.max_new_tokens = new_tokens;
    r.arrival_step = staggered ? s : 0;
    q.push_back(std::move(r));
  }
  return q;
}

constexpr int64_t kNew = 6;

models::SamplingOptions sampling() {
  models::SamplingOptions o;
  o.greedy = false;
  o.temperature = 0.8;
  o.top_k = 20;
  o.top_p = 0.9;
  o.seed = 1234;
  return o;
}

// Every request's tokens from generate() on tp ranks, [requests x kNew].
std::vector<int32_t> tokens_on(int tp, const ModelConfig& cfg, const models::SamplingOptions& o, int max_batch = 0,
                               bool staggered = false) {
  Shared out(static_cast<size_t>(kSeqs * kNew));
  on_ranks(tp, cfg, "test-core", [&](int rank, const layers::ParallelState& ps) {
    Loaded l = load(cfg, ps);
    const models::GenerationResult r = models::generate(*l.model, ps, requests(kNew, staggered), o, max_batch);
    for (const auto& st : r.steps)
      if (max_batch > 0) TESSERA_CHECK(st.batch <= max_batch, "step ", st.step, " ran ", st.batch, " sequences");
    if (rank == 0)
      for (int s = 0; s < kSeqs; ++s)
        for (int64_t k = 0; k < kNew; ++k) out[static_cast<size_t>(s * kNew + k)] = r.tokens.at(s).at(k);
  });
  std::vector<int32_t> v;
  v.reserve(static_cast<size_t>(kSeqs * kNew));
  for (int i = 0; i < kSeqs * kNew; ++i) v.push_back(static_cast<int32_t>(out[static_cast<size_t>(i)]));
  return v;
}

TEST(Generation, TpGreedyTokensEqualSerial) {
  for (const std::string fam : {"gpt", "llama"}) {
    const ModelConfig cfg = family(fam);
    const std::vector<int32_t> serial = tokens_on(1, cfg, {});
    for (int tp : {2, 4, 8}) EXPECT_EQ(tokens_on(tp, cfg, {}), serial) << fam << " tp " << tp;
    // Continuous batching (two at a time, one request arriving per step) decodes the same tokens.
    EXPECT_EQ(tokens_on(1, cfg, {}, 2, true), serial) << fam << " max_batch 2, staggered";
  }
}

TEST(Generation, SeededSamplingSameInEveryLayout) {
  for (const std::string fam : {"gpt", "llama"}) {
    const ModelConfig cfg = family(fam);
    const std::vector<int32_t> serial = tokens_on(1, cfg, sampling());
    EXPECT_NE(serial, tokens_on(1, cfg, {})) << fam << ": sampling drew the greedy tokens";
    models::SamplingOptions other = sampling();
    other.seed = 99;
    EXPECT_NE(serial, tokens_on(1, cfg, other)) << fam << ": another seed drew the same tokens";
    for (int tp : {2, 4, 8}) EXPECT_EQ(tokens_on(tp, cfg, sampling()), serial) << fam << " tp " << tp;
    EXPECT_EQ(tokens_on(4, cfg, sampling(), 1, true), serial) << fam << " tp 4, max_batch 1, staggered";
  }
}

TEST(Generation, ContinuousBatchingJoinsAndLeaves) {
  const ModelConfig cfg = tiny_gpt();
  Device dev(DeviceSpec::preset("test-core"));
  const auto ps = layers::serial_state(&dev);
  Loaded l = load(cfg, ps);
  std::vector<models::GenerationRequest> q = requests(3);
  q[1].max_new_tokens = 1;
  q[2].arrival_step = 1;
  std::vector<int> batches;
  const models::GenerationResult r =
      models::generate(*l.model, ps, q, {}, 2, [&](const models::GenerationStep& s) { batches.push_back(s.batch); });
  // Step 0: requests 0 and 1 prefill (1 leaves with its one token); step 1: 0 decodes, 2 joins; step 2: both
  // decode (0 leaves with 3 tokens); steps 3: 2 decodes its third.
  EXPECT_EQ(batches, (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(r.first_step, (std::vector<int64_t>{0, 0, 1}));
  EXPECT_EQ(r.steps[1].prefills, 1);
  for (int s = 0; s < kSeqs; ++s) EXPECT_EQ(static_cast<int64_t>(r.tokens[s].size()), q[s].max_new_tokens);
  // Two slots, each for the longest request: 9 + 3 tokens.
  EXPECT_EQ(r.slot_capacity, (std::vector<int64_t>{12, 12}));
}

// ---- the planner against the emulated cores ----

// family, tp, topology ("": emulated:tp, each group its own ring), precision.
using PlannerCase = std::tuple<std::string, int, std::string, std::string>;
class PlannerVsEmulated : public ::testing::TestWithParam<PlannerCase> {};

// The planner's KV bytes equal what rank 0's device counted for the cache:
// generate()'s count (the device's in-use bytes across the cache's
// allocation), and the test's own (in use during the last step, the cache
// live, less after generate() freed it; the forward's buffers stay); its
// TTFT and time per output token equal the emulated clock's within 0.5%.
TEST_P(PlannerVsEmulated, KvBytesAndClock) {
  const auto& [fam, tp, topology, precision] = GetParam();
  const ModelConfig cfg = family(fam);
  const DType dt = precision == "bf16" ? DType::BF16 : DType::F32;
  TopologyOptions o;
  o.device = topology.empty() ? "trn1-core" : "";
  Topology topo = Topology::load(topology.empty() ? "emulated:" + std::to_string(tp) : topology, o);
  const std::string device = topo.device().name;
  topo = topo.first_cores(tp);
  Shared got(5);  // KV bytes by generate(), TTFT, TPOT, bytes in use before generate(), the cache's bytes in use
  on_ranks(
      tp, cfg, device,
      [&](int rank, const layers::ParallelState& ps) {
        Loaded l = load(cfg, ps, dt);
        const uint64_t before = ps.device->memory_stats().in_use;
        uint64_t during = 0;
        const models::GenerationResult r =
            models::generate(*l.model, ps, requests(kNew), {}, 0, [&](const models::GenerationStep&) {
              during = ps.device->memory_stats().in_use;  // the last step's is kept
            });
        // The cache is freed with generate(); what the first forward left allocated stays.
        const uint64_t after = ps.device->memory_stats().in_use;
        if (rank == 0) {
          got[0] = static_cast<double>(r.kv_cache_bytes);
          got[1] = r.ttft_emulated_s();
          got[2] = r.tpot_emulated_s();
          got[3] = static_cast<double>(before);
          got[4] = static_cast<double>(during) - static_cast<double>(after);
        }
      },
      topology, dt);
  parallel::InferenceConfig c;
  c.prompts.assign(kPrompt, kPrompt + kSeqs);
  c.generate = static_cast<int>(kNew);
  c.dtype = dt;
  c.tp = tp;
  const parallel::InferencePlan p = parallel::plan_inference(cfg, topo, c).at(0);
  ASSERT_EQ(p.tp, tp);
  // (5 + 2 + 9 prompt tokens + 3 x 6 new) x 2 layers x (K, V) x local K/V heads x head size x dtype bytes.
  const int64_t local_kv = std::max(1, cfg.kv_heads / tp);
  const double hand =
      static_cast<double>(int64_t{34} * 2 * 2 * local_kv * cfg.head_size()) * static_cast<double>(dtype_size(dt));
  EXPECT_EQ(p.kv_bytes, hand);
  EXPECT_EQ(got[0], p.kv_bytes) << "generate()'s count of the device's bytes for the cache";
  EXPECT_EQ(got[4], p.kv_bytes) << "the device's bytes in use in the last step less after generate()";
  EXPECT_GT(got[3], 0);
  EXPECT_GT(got[1], 0);
  EXPECT_GT(got[2], 0);
  EXPECT_NEAR(p.ttft_s, got[1], 0.005 * got[1]) << "TTFT";
  EXPECT_NEAR(p.tpot_s, got[2], 0.005 * got[2]) << "time per output token";
}

INSTANTIATE_TEST_SUITE_P(Emulated, PlannerVsEmulated,
                         ::testing::Combine(::testing::Values("gpt", "llama"), ::testing::Values(1, 2, 4, 8),
                                            ::testing::Values(""), ::testing::Values("fp32")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_tp" + std::to_string(std::get<1>(info.param));
                         });

// Placed on the inference topologies' first cores (inf2.48xlarge: tp 8 spans 4 chips of its one row;
// trn3-ultraserver: one chip's cores behind NeuronSwitch), in fp32 and bf16.
INSTANTIATE_TEST_SUITE_P(Topologies, PlannerVsEmulated,
                         ::testing::Values(PlannerCase{"llama", 8, "inf2.48xlarge", "fp32"},
                                           PlannerCase{"gpt", 4, "inf2.48xlarge", "bf16"},
                                           PlannerCase{"llama", 8, "trn3-ultraserver", "bf16"},
                                           PlannerCase{"gpt", 2, "trn3-ultraserver", "fp32"},
                                           PlannerCase{"llama", 2, "", "bf16"}),
                         [](const auto& info) {
                           std::string t = std::get<2>(info.param).empty() ? "emulated" : std::get<2>(info.param);
                           for (char& ch : t)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return std::get<0>(info.param) + "_tp" + std::to_string(std::get<1>(info.param)) + "_" + t +
                                  "_" + std::get<3>(info.param);
                         });

// ---- refusals ----

template <class F>
std::string error_of(const F& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

TEST(Generation, RefusesAPromptPastTheContext) {
  const ModelConfig cfg = tiny_llama();
  Device dev(DeviceSpec::preset("test-core"));
  const auto ps = layers::serial_state(&dev);
  Loaded l = load(cfg, ps);
  std::vector<models::GenerationRequest> q = requests(4);
  q[2].prompt.assign(13, 1);  // 13 + 4 new > 16
  const std::string e = error_of([&] { models::generate(*l.model, ps, q, {}); });
  EXPECT_NE(e.find("prompt 2: 13 tokens + 4 new exceed model 'tiny-llama''s context of 16"), std::string::npos) << e;
  // forward_cached itself, past the context on a cache large enough.
  layers::KvCache cache(&dev, cfg.layers, models::kv_cache_width(cfg, 1), {20});
  const std::vector<int32_t> toks(17, 1);
  const std::string f = error_of([&] { l.model->forward_cached(cache, toks.data(), {0}, {17}, false); });
  EXPECT_NE(f.find("sequence 0: 0 cached + 17 new tokens = 17 exceed model 'tiny-llama''s context of 16"),
            std::string::npos)
      << f;
}

TEST(Generation, RefusesABatchTheCacheCannotHold) {
  const ModelConfig cfg = tiny_gpt();
  DeviceSpec spec = DeviceSpec::preset("test-core");
  // Room for the weights and the activations of one small forward, not for the cache of 200 sequences (1.3 MB).
  spec.hbm_bytes = 1u << 20;
  Device dev(spec);
  const auto ps = layers::serial_state(&dev);
  Loaded l = load(cfg, ps);
  const std::vector<models::GenerationRequest> q(200, requests(4)[2]);  // 9 + 4 tokens each
  const std::string e = error_of([&] { models::generate(*l.model, ps, q, {}); });
  const uint64_t need = layers::KvCache::bytes_for(cfg.layers, models::kv_cache_width(cfg, 1), 2600, 4);
  EXPECT_NE(
      e.find("the batch does not fit the KV cache: 200 sequence(s) of up to 13 tokens (2600 cached tokens) need " +
             std::to_string(need) + " bytes"),
      std::string::npos)
      << e;
  EXPECT_NE(e.find("of 1048576 bytes free"), std::string::npos) << e;
  // The same device holds a batch of three.
  EXPECT_NO_THROW(models::generate(*l.model, ps, requests(4), {}));
}

}  // namespace
}  // namespace tessera
