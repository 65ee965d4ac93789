// Training checkpoints (parallel/checkpoint/checkpoint.h) through the
// Trainer, as forked ranks over the shared-memory communicator.
//
// Same layout: in every rank, run A trains 4 steps and saves after step 2;
// run B, a fresh Trainer in the same process, loads that checkpoint and
// trains steps 3 and 4. B's losses, flat parameter buffer and AdamW moments
// must equal A's bit for bit (compared as raw memory, not through the
// checkpoint reader).
// Another layout: run A (layout 1) saves after step 2 and trains on; run B
// (layout 2) loads it. Every rank reports its parameters and the moments it
// holds as full tensors (store_shard / the optimizer's moment runs, not the
// checkpoint reader); B's loaded state must equal A's step-2 state exactly,
// and B's losses of steps 3 and 4 must be within 1e-5 relative of A's.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>

#include "parallel/checkpoint/checkpoint.h"
#include "parallel/models/gpt/trainer.h"
#include "runtime/bf16.h"
#include "runtime/device.h"
#include "runtime/files.h"
#include "runtime/kernels.h"
#include "tests/collectives/fork_harness.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using parallel::layers::Parameter;
using parallel::models::gpt::Trainer;
using parallel::models::gpt::TrainOptions;

struct Layout {
  int tp = 1, dp = 1;
  bool zero1 = false, sp = false;
  // bf16 parameters: with fp32 master weights unless pure, stochastic rounding when sr.
  bool bf16 = false, pure = false, sr = false;
};

std::string name(const Layout& l) {
  return "tp" + std::to_string(l.tp) + "dp" + std::to_string(l.dp) + (l.zero1 ? "zero1" : "") + (l.sp ? "sp" : "") +
         (l.bf16 ? (l.pure ? "_purebf16" : "_bf16") : "") + (l.sr ? "sr" : "");
}

TrainOptions tiny(const Layout& l, int64_t vocab = 257) {
  TrainOptions o;
  o.model.vocab = static_cast<int>(vocab);  // 257 does not divide over tp: the last wte shard is padded
  o.model.max_seq = 16;
  o.model.hidden = 32;
  o.model.heads = 8;
  o.model.layers = 2;
  o.seq = 16;
  o.micro_batch = 1;
  o.global_batch = 8;
  o.steps = 4;
  o.lr = 3e-3;
  o.warmup = 1;
  o.seed = 11;
  o.adamw.bucket_elems = 5000;  // several buckets
  o.tp = l.tp;
  o.dp = l.dp;
  o.adamw.zero1 = l.zero1;
  o.sequence_parallel = l.sp;
  if (l.bf16) o.precision = DType::BF16;
  o.master_weights = !l.pure;
  o.stochastic_rounding = l.sr;
  return o;
}

// The fp32 master weights a rank holds, in the order of its runs.
std::vector<float> masters_of(Trainer& t) {
  std::vector<float> out;
  t.optimizer().for_each_master_run([&](int64_t, int64_t n, const float* m) { out.insert(out.end(), m, m + n); });
  return out;
}

std::shared_ptr<const parallel::data::ByteDataset> dataset() {
  static auto ds = std::make_shared<const parallel::data::ByteDataset>(parallel::data::ByteDataset::default_files());
  return ds;
}

// Shared memory made before fork: 8 doubles of losses, then per slot
// (run 0/1) and kind (param, exp_avg, exp_avg_sq) the full tensors as floats,
// NaN where no rank wrote.
class Shared {
 public:
  explicit Shared(const std::vector<std::pair<std::string, int64_t>>& sizes) {
    for (const auto& [n, numel] : sizes) {
      off_[n] = per_;
      per_ += static_cast<size_t>(numel);
    }
    bytes_ = 16 * sizeof(double) + 6 * per_ * sizeof(float);
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
    base_ = static_cast<char*>(p);
    std::fill(losses(), losses() + 16, std::nan(""));
    std::fill(floats(0, 0), floats(0, 0) + 6 * per_, std::nanf(""));
  }
  ~Shared() { ::munmap(base_, bytes_); }
  double* losses() { return reinterpret_cast<double*>(base_); }
  float* floats(int slot, int kind) {
    return reinterpret_cast<float*>(base_ + 16 * sizeof(double)) + (static_cast<size_t>(slot) * 3 + kind) * per_;
  }
  float* at(int slot, int kind, const std::string& n) { return floats(slot, kind) + off_.at(n); }
  size_t per() const { return per_; }

 private:
  std::map<std::string, size_t> off_;
  size_t per_ = 0, bytes_ = 0;
  char* base_ = nullptr;
};

std::vector<std::pair<std::string, int64_t>> tensor_sizes() {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const Parameter& p : parallel::models::parameter_layout(tiny({}).model, 1, 0))
    out.emplace_back(p.name, shape_numel(p.full_shape));
  return out;
}

// Writes what this rank holds (parameters; the moments it keeps) as full tensors.
void report(Trainer& t, Shared& sh, int slot) {
  std::map<int64_t, Parameter*> by_offset;
  for (Parameter* p : t.model().parameters()) {
    by_offset[p->offset] = p;
    float* out = sh.at(slot, 0, p->name);
    parallel::layers::for_each_shard_element(*p, [&](int64_t li, int64_t gi) {
      if (gi >= 0) out[gi] = p->value[li];
    });
  }
  t.optimizer().for_each_moment_run([&](int64_t off, int64_t n, const float* m, const float* v) {
    Parameter* p = std::prev(by_offset.upper_bound(off))->second;
    std::vector<int64_t> full(static_cast<size_t>(p->numel()));
    parallel::layers::for_each_shard_element(*p, [&](int64_t li, int64_t gi) { full[li] = gi; });
    for (int64_t i = 0; i < n; ++i) {
      const int64_t gi = full[static_cast<size_t>(off - p->offset + i)];
      if (gi < 0) continue;
      sh.at(slot, 1, p->name)[gi] = m[i];
      sh.at(slot, 2, p->name)[gi] = v[i];
    }
  });
}

struct Rank {
  std::unique_ptr<Device> dev;
  std::shared_ptr<collectives::Communicator> world;
  parallel::layers::ParallelState ps;
};

Rank join(const Layout& l, int rank, int size, std::shared_ptr<collectives::Store> store) {
  Rank r;
  r.dev = std::make_unique<Device>(DeviceSpec::preset("test-core"), rank);
  collectives::CommOptions co;
  co.device = r.dev.get();
  r.world = collectives::Communicator::create(std::move(store), rank, size, co);
  r.ps = parallel::layers::make_parallel_state(r.world, l.tp, l.dp, r.dev.get(), l.sp);
  return r;
}

std::string temp_dir() {
  std::string d = collectives::test::make_temp_dir();
  return d;
}

class SameLayout : public ::testing::TestWithParam<Layout> {};

TEST_P(SameLayout, ResumeIsBitForBit) {
  kern::default_blas_threads();
  const Layout l = GetParam();
  const std::string root = temp_dir() + "/ckpt";
  auto res = collectives::test::run_ranks(l.tp * l.dp, [&](int rank, int size, std::shared_ptr<collectives::Store> st) {
    Rank r = join(l, rank, size, std::move(st));
    std::vector<double> losses_a, losses_b;
    std::vector<float> values_a, moments_a, masters_a;
    int64_t total = 0;
    {
      Trainer a(tiny(l), r.ps, dataset());
      a.init_random();
      for (int s = 1; s <= 4; ++s) {
        losses_a.push_back(a.step().loss);
        if (s == 2) a.save_checkpoint(root);
      }
      total = a.optimizer().total_elems();
      values_a.assign(a.optimizer().values(), a.optimizer().values() + total);
      a.optimizer().for_each_moment_run([&](int64_t, int64_t n, const float* m, const float* v) {
        moments_a.insert(moments_a.end(), m, m + n);
        moments_a.insert(moments_a.end(), v, v + n);
      });
      masters_a = masters_of(a);
    }
    Trainer b(tiny(l), r.ps, dataset());
    b.load_checkpoint(root + "/step_00000002");
    COLL_REQUIRE(b.steps_done() == 2, "resumed at step ", b.steps_done());
    for (int s = 3; s <= 4; ++s) losses_b.push_back(b.step().loss);
    for (int i = 0; i < 2; ++i)
      COLL_REQUIRE(losses_b[i] == losses_a[2 + i], "step ", 3 + i, " loss ", losses_b[i], " vs uninterrupted ",
                   losses_a[2 + i]);
    COLL_REQUIRE(b.optimizer().total_elems() == total);
    COLL_REQUIRE(std::memcmp(b.optimizer().values(), values_a.data(), sizeof(float) * total) == 0,
                 "parameters differ from the uninterrupted run");
    std::vector<float> moments_b;
    b.optimizer().for_each_moment_run([&](int64_t, int64_t n, const float* m, const float* v) {
      moments_b.insert(moments_b.end(), m, m + n);
      moments_b.insert(moments_b.end(), v, v + n);
    });
    COLL_REQUIRE(moments_b.size() == moments_a.size() && !moments_a.empty());
    COLL_REQUIRE(std::memcmp(moments_b.data(), moments_a.data(), sizeof(float) * moments_a.size()) == 0,
                 "AdamW moments differ from the uninterrupted run");
    const std::vector<float> masters_b = masters_of(b);
    COLL_REQUIRE(masters_b.size() == masters_a.size() && masters_a.empty() == (!l.bf16 || l.pure));
    COLL_REQUIRE(
        masters_a.empty() || std::memcmp(masters_b.data(), masters_a.data(), sizeof(float) * masters_a.size()) == 0,
        "fp32 master weights differ from the uninterrupted run");
    r.world->barrier();
  });
  std::string f = collectives::test::failures(res);
  EXPECT_TRUE(f.empty()) << f;
  // The checkpoint is complete and the only one.
  auto done = parallel::checkpoint::complete_checkpoints(root);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].first, 2);
  fs::remove_all(fs::path(root).parent_path());
}

INSTANTIATE_TEST_SUITE_P(Layouts, SameLayout,
                         ::testing::Values(Layout{1, 1}, Layout{2, 2}, Layout{2, 2, true}, Layout{1, 4, true},
                                           Layout{2, 1, false, true}, Layout{1, 1, false, false, true},
                                           Layout{2, 2, true, false, true, false, true},
                                           Layout{1, 2, false, false, true, true, true}),
                         [](const auto& info) { return name(info.param); });

struct Change {
  Layout from, to;
};

class OtherLayout : public ::testing::TestWithParam<Change> {};

TEST_P(OtherLayout, ReshardsOnLoad) {
  kern::default_blas_threads();
  const Change c = GetParam();
  const std::string root = temp_dir() + "/ckpt";
  Shared sh(tensor_sizes());
  // Run A: save after step 2 (reporting that state), then steps 3 and 4.
  auto res = collectives::test::run_ranks(c.from.tp * c.from.dp,
                                          [&](int rank, int size, std::shared_ptr<collectives::Store> st) {
                                            Rank r = join(c.from, rank, size, std::move(st));
                                            Trainer a(tiny(c.from), r.ps, dataset());
                                            a.init_random();
                                            for (int s = 1; s <= 4; ++s) {
                                              double loss = a.step().loss;
                                              if (rank == 0) sh.losses()[s] = loss;
                                              if (s == 2) {
                                                a.save_checkpoint(root);
                                                report(a, sh, 0);
                                              }
                                            }
                                            r.world->barrier();
                                          });
  std::string f = collectives::test::failures(res);
  ASSERT_TRUE(f.empty()) << f;
  res =
      collectives::test::run_ranks(c.to.tp * c.to.dp, [&](int rank, int size, std::shared_ptr<collectives::Store> st) {
        Rank r = join(c.to, rank, size, std::move(st));
        Trainer b(tiny(c.to), r.ps, dataset());
        b.load_checkpoint(root + "/step_00000002");
        report(b, sh, 1);
        for (int s = 3; s <= 4; ++s) {
          double loss = b.step().loss;
          if (rank == 0) sh.losses()[8 + s] = loss;
        }
        r.world->barrier();
      });
  f = collectives::test::failures(res);
  ASSERT_TRUE(f.empty()) << f;
  for (int kind = 0; kind < 3; ++kind) {
    const float* a = sh.floats(0, kind);
    const float* b = sh.floats(1, kind);
    size_t bad = 0, holes = 0;
    for (size_t i = 0; i < sh.per(); ++i) {
      if (std::isnan(a[i]) || std::isnan(b[i])) ++holes;
      // Bit for bit: a NaN payload or the sign of a zero counts too.
      if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) ++bad;
    }
    EXPECT_EQ(holes, 0u) << "kind " << kind << ": elements no rank held";
    EXPECT_EQ(bad, 0u) << "kind " << kind << ": loaded state differs from the saved one";
  }
  for (int s = 3; s <= 4; ++s) {
    const double a = sh.losses()[s], b = sh.losses()[8 + s];
    EXPECT_NEAR(b, a, 1e-5 * std::abs(a)) << "step " << s;
  }
  fs::remove_all(fs::path(root).parent_path());
}

INSTANTIATE_TEST_SUITE_P(Layouts, OtherLayout,
                         ::testing::Values(Change{{2, 2}, {4, 1}}, Change{{2, 2}, {1, 4}},
                                           Change{{1, 4, true}, {1, 2, true}}, Change{{2, 2, true}, {1, 1}},
                                           Change{{1, 1}, {2, 2, true, true}}),
                         [](const auto& info) { return name(info.param.from) + "_to_" + name(info.param.to); });

// The done marker's write fails as on a full disk (ENOSPC); every other call
// of the save goes through.
class FullDiskAtMarker : public FileOps {
 public:
  int open(const char* path, int flags, mode_t mode) override {
    const int fd = FileOps::open(path, flags, mode);
    if (fd >= 0 && std::string(path).find("/.done.tmp.") != std::string::npos) marker_fd_ = fd;
    return fd;
  }
  ssize_t write(int fd, const void* data, size_t bytes) override {
    if (fd >= 0 && fd == marker_fd_) {
      ++failed;
      errno = ENOSPC;
      return -1;
    }
    return FileOps::write(fd, data, bytes);
  }
  int close(int fd) override {
    if (fd == marker_fd_) marker_fd_ = -1;
    return FileOps::close(fd);
  }
  int failed = 0;

 private:
  int marker_fd_ = -1;
};

// Issue 32: a step directory whose `done` could not be written (ENOSPC)
// stayed: never loadable, it held the space the next save needed. Now the
// failed save removes it (and puts back the complete checkpoint of that
// step it was replacing), says so on every rank, and the next save succeeds.
TEST(SaveFailure, AMarkerTheDiskRefusedLeavesNoStepDirectoryAndTheNextSaveSucceeds) {
  kern::default_blas_threads();
  const Layout l{2, 1};
  const std::string root = temp_dir() + "/ckpt";
  const std::string step3 = root + "/step_00000003";
  auto listing = [&] {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(root)) v.push_back(e.path().filename().string());
    std::sort(v.begin(), v.end());
    return v;
  };
  auto joined = [](const std::vector<std::string>& v) {
    std::string out;
    for (const std::string& x : v) out += (out.empty() ? "" : " ") + x;
    return out;
  };
  auto res = collectives::test::run_ranks(2, [&](int rank, int size, std::shared_ptr<collectives::Store> st) {
    Rank r = join(l, rank, size, std::move(st));
    Trainer a(tiny(l), r.ps, dataset());
    a.init_random();
    a.step();
    a.step();
    a.save_checkpoint(root);
    a.step();
    auto failing_save = [&] {
      FullDiskAtMarker full;
      std::string what;
      try {
        a.save_checkpoint(root, 0, &full);
      } catch (const Error& e) {
        what = e.what();
      }
      COLL_REQUIRE(what.find("No space left on device") != std::string::npos && what.find(step3) != std::string::npos,
                   "rank ", rank, ": the save's error: '", what, "'");
      COLL_REQUIRE(rank != 0 || full.failed > 0, "the marker was never written");
      r.world->barrier();
    };
    // 1. A new step: the marker-less step_00000003 is gone, nothing else is left.
    failing_save();
    if (rank == 0) {
      const std::vector<std::string> want{"step_00000002"};
      COLL_REQUIRE(listing() == want, "left in ", root, ": ", joined(listing()));
    }
    r.world->barrier();
    // 2. The next save of that step succeeds.
    a.save_checkpoint(root);
    const auto done = parallel::checkpoint::complete_checkpoints(root);
    COLL_REQUIRE(done.size() == 2 && done[1].first == 3, done.size(), " complete checkpoints");
    r.world->barrier();
    // 3. Replacing the complete step 3: the failed save puts it back.
    failing_save();
    if (rank == 0) {
      const std::vector<std::string> want{"step_00000002", "step_00000003"};
      COLL_REQUIRE(listing() == want, "left in ", root, ": ", joined(listing()));
      parallel::checkpoint::Checkpoint ck(step3);
      ck.verify_all();
    }
    r.world->barrier();
    Trainer b(tiny(l), r.ps, dataset());
    b.load_checkpoint(step3);
    COLL_REQUIRE(b.steps_done() == 3, "resumed at step ", b.steps_done());
    r.world->barrier();
  });
  const std::string f = collectives::test::failures(res);
  EXPECT_TRUE(f.empty()) << f;
  fs::remove_all(fs::path(root).parent_path());
}

// A checkpoint resumed at another precision gives the run the most precise
// weights it holds: an fp32 run loading a bf16 run's checkpoint takes its
// fp32 master weights, not the bf16 parameters; a bf16 run loading an fp32
// run's takes the fp32 values as its masters and their round-to-nearest-even
// bf16 as its parameters. The moments come across exactly either way.
TEST(PrecisionChange, OnLoadTheRunGetsTheMostPreciseWeights) {
  kern::default_blas_threads();
  const std::string root = temp_dir();
  const Layout fp32{}, bf16{1, 1, false, false, true};
  Device dev(DeviceSpec::preset("test-core"));
  auto ps = parallel::layers::serial_state(&dev);
  auto moments = [](Trainer& t) {
    std::vector<float> out;
    t.optimizer().for_each_moment_run([&](int64_t, int64_t n, const float* m, const float* v) {
      out.insert(out.end(), m, m + n);
      out.insert(out.end(), v, v + n);
    });
    return out;
  };
  // Serial: the masters' runs cover values() in order.
  auto values = [](Trainer& t) {
    return std::vector<float>(t.optimizer().values(), t.optimizer().values() + t.optimizer().total_elems());
  };
  std::vector<float> a_masters, a_values, a_moments, c_values, c_moments;
  {
    Trainer a(tiny(bf16), ps, dataset());
    a.init_random();
    a.step();
    a.step();
    a.save_checkpoint(root + "/bf16");
    a_masters = masters_of(a);
    a_values = values(a);
    a_moments = moments(a);
    Trainer c(tiny(fp32), ps, dataset());
    c.init_random();
    c.step();
    c.step();
    c.save_checkpoint(root + "/fp32");
    c_values = values(c);
    c_moments = moments(c);
  }
  ASSERT_EQ(a_masters.size(), a_values.size());
  // The masters are more than their bf16 roundings (else the test shows nothing).
  ASSERT_NE(a_masters, a_values);
  {
    Trainer b(tiny(fp32), ps, dataset());
    b.load_checkpoint(root + "/bf16/step_00000002");
    EXPECT_EQ(values(b), a_masters) << "the fp32 run did not take the bf16 run's master weights";
    EXPECT_EQ(moments(b), a_moments);
  }
  {
    Trainer d(tiny(bf16), ps, dataset());
    d.load_checkpoint(root + "/fp32/step_00000002");
    std::vector<float> rounded = c_values;
    for (float& x : rounded) x = bf16::round_nearest(x);
    ASSERT_NE(rounded, c_values);
    EXPECT_EQ(values(d), rounded) << "the bf16 run's parameters are not the fp32 values rounded to nearest even";
    EXPECT_EQ(masters_of(d), c_values) << "the bf16 run's masters are not the fp32 run's values";
    EXPECT_EQ(moments(d), c_moments);
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace tessera
