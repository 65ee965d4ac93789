// `tessera ckpt` (parallel/checkpoint/ckpt_tool.h, the GPT layout of parallel/models/gpt/hf.h): shards are
// what a TP rank of GptModel holds, shard -> consolidate is bit-exact, reshard
// equals a direct shard, bad input is refused with nothing written.
#include "parallel/checkpoint/ckpt_tool.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>

#include "parallel/cost_model.h"
#include "parallel/layers/parallel_state.h"
#include "parallel/models/gpt/gpt_model.h"
#include "runtime/error.h"
#include "runtime/files.h"
#include "tests/checkpoint/gpt2_test_files.h"
#include "tests/checkpoint/manifest_edit.h"
#include "tests/checkpoint/test_util.h"

namespace tessera::parallel::checkpoint {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// vocab 67 does not divide over 2 or 4 (padding); 3 layers split unevenly over pp 2.
const ModelConfig kCfg = gpt2_config(67, 16, 32, 3, 4);

void make_gpt2_file(const std::string& path, const ModelConfig& c, DType dtype, uint32_t seed) {
  testing::write_random_gpt2(path, c, dtype, seed);
}

// The tensor's raw bytes as stored.
std::string raw(const SafetensorsReader& r, const std::string& name) {
  const SafetensorsEntry& e = r.entry(name);
  return std::string(reinterpret_cast<const char*>(r.bytes(e)), e.end - e.begin);
}

void expect_same_tensors(const std::string& a, const std::string& b) {
  SafetensorsReader ra(a), rb(b);
  ASSERT_EQ(ra.names().size(), rb.names().size()) << a << " vs " << b;
  for (const std::string& n : ra.names()) {
    ASSERT_TRUE(rb.contains(n)) << n;
    EXPECT_EQ(ra.entry(n).dtype, rb.entry(n).dtype) << n;
    EXPECT_EQ(ra.entry(n).shape, rb.entry(n).shape) << n;
    EXPECT_TRUE(raw(ra, n) == raw(rb, n)) << n << " differs between " << a << " and " << b;
  }
}

std::string shard_file(const std::string& dir, int tp, int pp) {
  return dir + "/" + rank_stem(0, tp, pp) + ".safetensors";
}

// The GptModel config of a test model (GptModel takes the one ModelConfig).
ModelConfig gpt_config(const ModelConfig& c) {
  ModelConfig g = c;
  return g;
}

// The layout derived from the model: sharding a known tensor (element i holds
// i + 1) with it gives what load_shard puts in the model's own parameter of
// that TP rank, and the ranks' shards together hold every element once.
TEST(Gpt2Layout, ShardsLikeGptModelParameters) {
  for (int tp : {1, 2, 4}) {
    std::vector<std::vector<parallel::layers::Parameter>> layouts;
    layouts.reserve(tp);
    for (int r = 0; r < tp; ++r) layouts.push_back(gpt2_tp_parameters(kCfg, tp, r));
    for (int r = 0; r < tp; ++r) {
      parallel::layers::ParallelState ps;
      ps.tp_size = tp;
      ps.tp_rank = r;
      parallel::models::gpt::GptModel model(gpt_config(kCfg), ps);
      std::vector<parallel::layers::Parameter*> want = model.parameters();
      const std::vector<parallel::layers::Parameter>& got = layouts[static_cast<size_t>(r)];
      ASSERT_EQ(got.size(), want.size());
      ASSERT_EQ(got.size(), gpt2_tensor_names(kCfg).size());
      for (size_t i = 0; i < got.size(); ++i) {
        SCOPED_TRACE(got[i].name + " tp " + std::to_string(tp) + " rank " + std::to_string(r));
        EXPECT_EQ(got[i].name, want[i]->name);
        EXPECT_EQ(got[i].name, gpt2_tensor_names(kCfg)[i]);
        EXPECT_EQ(got[i].full_shape, gpt2_tensor_shape(kCfg, got[i].name));
        std::vector<float> full(static_cast<size_t>(shape_numel(got[i].full_shape)));
        for (size_t k = 0; k < full.size(); ++k) full[k] = static_cast<float>(k + 1);
        parallel::layers::Parameter a = got[i], b = *want[i];
        ASSERT_EQ(a.numel(), b.numel());
        std::vector<float> va(static_cast<size_t>(a.numel()), -1.f), vb(va.size(), -2.f);
        a.value = va.data();
        b.value = vb.data();
        parallel::layers::load_shard(a, full.data());
        parallel::layers::load_shard(b, full.data());
        EXPECT_EQ(va, vb);
      }
    }
    // Coverage: every element of every tensor in exactly one rank's shard (or
    // in every rank's, when replicated).
    for (size_t i = 0; i < layouts[0].size(); ++i) {
      const parallel::layers::Parameter& p0 = layouts[0][i];
      std::vector<int> seen(static_cast<size_t>(shape_numel(p0.full_shape)), 0);
      for (int r = 0; r < tp; ++r)
        parallel::layers::for_each_shard_element(layouts[static_cast<size_t>(r)][i], [&](int64_t, int64_t f) {
          if (f >= 0) ++seen[static_cast<size_t>(f)];
        });
      const int want = p0.split_dim < 0 ? tp : 1;
      EXPECT_EQ(std::count(seen.begin(), seen.end(), want), static_cast<int64_t>(seen.size())) << p0.name;
    }
  }
}

TEST(Gpt2Layout, PipelineStages) {
  // 3 layers over 2 stages: [0, 1) and [1, 3) (the leftover layer to the later stage).
  const std::vector<int> two = gpt2_stages(kCfg, 2);
  EXPECT_EQ(two, (std::vector<int>{1, 2}));
  EXPECT_EQ(gpt2_pp_stage(two, "transformer.wte.weight"), 0);
  EXPECT_EQ(gpt2_pp_stage(two, "transformer.wpe.weight"), 0);
  EXPECT_EQ(gpt2_pp_stage(two, "transformer.h.0.ln_1.weight"), 0);
  EXPECT_EQ(gpt2_pp_stage(two, "transformer.h.1.mlp.c_fc.weight"), 1);
  EXPECT_EQ(gpt2_pp_stage(two, "transformer.h.2.attn.c_attn.bias"), 1);
  EXPECT_EQ(gpt2_pp_stage(two, "transformer.ln_f.bias"), 1);
  EXPECT_EQ(gpt2_pp_stage(gpt2_stages(kCfg, 1), "transformer.ln_f.bias"), 0);
  // An explicit partition overrides the rule.
  const std::vector<int> given = gpt2_stages(kCfg, 2, {2, 1});
  EXPECT_EQ(gpt2_pp_stage(given, "transformer.h.1.mlp.c_fc.weight"), 0);
  EXPECT_EQ(gpt2_pp_stage(given, "transformer.h.2.mlp.c_fc.weight"), 1);
  EXPECT_THROW(gpt2_stages(kCfg, 2, {1, 1}), InvalidArgument);     // sums to 2, not 3
  EXPECT_THROW(gpt2_stages(kCfg, 2, {3, 0}), InvalidArgument);     // empty stage
  EXPECT_THROW(gpt2_stages(kCfg, 2, {1, 1, 1}), InvalidArgument);  // 3 entries for pp 2
}

// The planner (cost model) and the checkpoint tool split layers the same way.
TEST(Gpt2Layout, StagesAgreeWithPlanner) {
  for (int64_t layers : {1, 3, 4, 7, 10, 12, 13, 24}) {
    for (int pp : {1, 2, 3, 4, 8}) {
      if (pp > layers) continue;
      ModelConfig c = kCfg;
      c.layers = static_cast<int>(layers);
      const std::vector<int> planner = parallel::partition_layers(static_cast<int>(layers), pp, false, 0.5);
      EXPECT_EQ(gpt2_stages(c, pp), planner) << layers << " layers, pp " << pp;
      int64_t first = 0;
      for (int s = 0; s < pp; ++s) {
        EXPECT_EQ(gpt2_pp_stage(planner, "transformer.h." + std::to_string(first) + ".ln_1.weight"), s);
        first += planner[static_cast<size_t>(s)];
        EXPECT_EQ(gpt2_pp_stage(planner, "transformer.h." + std::to_string(first - 1) + ".ln_1.weight"), s);
      }
    }
  }
}

// --stages 2,1: the first stage holds layers 0 and 1, the manifest says so,
// and consolidate and reshard read the partition back.
TEST(CkptTool, ExplicitStagesOverrideTheRule) {
  TempDir d;
  const std::string src = d.file("model.safetensors");
  make_gpt2_file(src, kCfg, DType::F32, 11);
  ShardOptions o{2, 2, 1, 0, {2, 1}};
  shard_gpt2(src, d.file("s"), o);
  SafetensorsReader s0(shard_file(d.file("s"), 1, 0)), s1(shard_file(d.file("s"), 1, 1));
  SafetensorsReader r0(shard_file(d.file("s"), 0, 0)), r1(shard_file(d.file("s"), 0, 1));
  EXPECT_TRUE(s0.contains("param/transformer.h.1.attn.c_attn.weight"));
  EXPECT_FALSE(s1.contains("param/transformer.h.1.attn.c_attn.weight"));
  EXPECT_TRUE(s1.contains("param/transformer.h.2.attn.c_attn.weight"));
  // Tensors replicated over TP are written by TP rank 0 only.
  EXPECT_TRUE(r1.contains("param/transformer.ln_f.weight"));
  EXPECT_FALSE(s1.contains("param/transformer.ln_f.weight"));
  // TP rank 1: wte, then per layer c_attn (w, b), attn c_proj w, c_fc (w, b), mlp c_proj w.
  EXPECT_EQ(s0.entries().size(), 1u + 2 * 6);
  EXPECT_EQ(s1.entries().size(), 6u);
  // TP rank 0 also: wpe, per layer 2 LayerNorms (2 each) and the 2 row-parallel biases, ln_f.
  EXPECT_EQ(r0.entries().size(), 2u + 2 * 12);
  EXPECT_EQ(r1.entries().size(), 12u + 2);
  auto m = nlohmann::json::parse(testing::read_bytes(d.file("s") + "/manifest.json"));
  EXPECT_EQ(m.at("layout").at("stages"), nlohmann::json({2, 1}));
  consolidate_gpt2(d.file("s"), d.file("back.safetensors"));
  expect_same_tensors(src, d.file("back.safetensors"));
  // Reshard to the default rule: [1, 2].
  reshard_gpt2(d.file("s"), d.file("r"), {2, 2, 1, 0});
  EXPECT_FALSE(SafetensorsReader(shard_file(d.file("r"), 0, 0)).contains("param/transformer.h.1.ln_1.weight"));
  EXPECT_TRUE(SafetensorsReader(shard_file(d.file("r"), 0, 1)).contains("param/transformer.h.1.ln_1.weight"));
  consolidate_gpt2(d.file("r"), d.file("back2.safetensors"));
  expect_same_tensors(src, d.file("back2.safetensors"));
  // Bad partitions are refused with nothing written.
  for (const std::vector<int>& bad : {std::vector<int>{1, 1}, {3, 0}, {1, 1, 1}, {4, -1}}) {
    o.stages = bad;
    EXPECT_THROW(shard_gpt2(src, d.file("x"), o), InvalidArgument);
  }
  EXPECT_FALSE(fs::exists(d.file("x")));
}

TEST(CkptTool, ShardConsolidateRoundTripIsBitExact) {
  TempDir d;
  const std::string src = d.file("model.safetensors");
  make_gpt2_file(src, kCfg, DType::F32, 1);
  for (int tp : {1, 2, 4}) {
    for (int pp : {1, 2}) {
      const std::string dir = d.file("s" + std::to_string(tp) + "_" + std::to_string(pp));
      shard_gpt2(src, dir, {tp, pp, 1, 0});
      for (int s = 0; s < pp; ++s)
        for (int r = 0; r < tp; ++r) EXPECT_TRUE(fs::exists(shard_file(dir, r, s))) << r << " " << s;
      const std::string back = d.file("back.safetensors");
      fs::remove(back);  // consolidate refuses to overwrite
      consolidate_gpt2(dir, back);
      SCOPED_TRACE("tp " + std::to_string(tp) + " pp " + std::to_string(pp));
      expect_same_tensors(src, back);
    }
  }
}

TEST(CkptTool, Bf16RoundTripKeepsDtype) {
  TempDir d;
  const std::string src = d.file("model.safetensors");
  make_gpt2_file(src, kCfg, DType::BF16, 2);
  shard_gpt2(src, d.file("s"), {2, 2, 1, 0});
  EXPECT_EQ(SafetensorsReader(shard_file(d.file("s"), 0, 1)).entry("param/transformer.ln_f.weight").dtype, DType::BF16);
  EXPECT_EQ(SafetensorsReader(shard_file(d.file("s"), 1, 1)).entry("param/transformer.h.2.mlp.c_fc.weight").dtype,
            DType::BF16);
  consolidate_gpt2(d.file("s"), d.file("back.safetensors"));
  expect_same_tensors(src, d.file("back.safetensors"));
}

// Each file holds what load_shard gives the GptModel parameter of its TP rank.
TEST(CkptTool, ShardsEqualLoadShardOfTpRank) {
  TempDir d;
  const std::string src = d.file("model.safetensors");
  make_gpt2_file(src, kCfg, DType::F32, 3);
  SafetensorsReader full(src);
  const parallel::ModelConfig g = gpt_config(kCfg);
  const int pp = 2;
  for (int tp : {1, 2, 4}) {
    const std::string dir = d.file("s" + std::to_string(tp));
    shard_gpt2(src, dir, {tp, pp, 1, 0});
    for (int r = 0; r < tp; ++r) {
      parallel::layers::ParallelState ps;
      ps.tp_size = tp;
      ps.tp_rank = r;
      parallel::models::gpt::GptModel model(g, ps);
      size_t seen = 0;
      for (parallel::layers::Parameter* mp : model.parameters()) {
        const int s = gpt2_pp_stage(gpt2_stages(kCfg, pp), mp->name);
        // Replicated over TP: TP rank 0's file holds it.
        SafetensorsReader f(shard_file(dir, mp->split_dim < 0 ? 0 : r, s));
        parallel::layers::Parameter p = *mp;
        std::vector<float> want(static_cast<size_t>(p.numel()), -1.f);
        p.value = want.data();
        Tensor whole = full.get(mp->name);
        parallel::layers::load_shard(p, whole.data<float>());
        Tensor got = f.get("param/" + mp->name);
        ASSERT_EQ(got.shape(), Shape{p.numel()}) << mp->name;
        EXPECT_EQ(0, std::memcmp(got.raw_data(), want.data(), want.size() * sizeof(float)))
            << mp->name << " rank " << r;
        ++seen;
      }
      EXPECT_EQ(seen, 2 + 12 * kCfg.layers + 2);
    }
  }
}

// Hand-computed slices (Tensor::slice/concat, not the layout code): Q, K and V
// column blocks each split over tp, and the padded vocab-parallel wte.
TEST(CkptTool, ShardsMatchHandComputedSlices) {
  TempDir d;
  const std::string src = d.file("model.safetensors");
  make_gpt2_file(src, kCfg, DType::F32, 7);
  shard_gpt2(src, d.file("s"), {4, 1, 1, 0});
  SafetensorsReader full(src);
  const int64_t C = kCfg.hidden, q = C / 4;
  Tensor w = full.get("transformer.h.1.attn.c_attn.weight");
  SafetensorsReader f0(shard_file(d.file("s"), 0, 0));
  for (int r = 0; r < 4; ++r) {
    SafetensorsReader f(shard_file(d.file("s"), r, 0));
    Tensor want = concat({w.slice(1, r * q, (r + 1) * q), w.slice(1, C + r * q, C + (r + 1) * q),
                          w.slice(1, 2 * C + r * q, 2 * C + (r + 1) * q)},
                         1);
    // Each shard is stored flat, row-major ("param/NAME").
    EXPECT_EQ(f.get("param/transformer.h.1.attn.c_attn.weight").to_float_vector(), want.to_float_vector()) << r;
    // Row-parallel c_proj: rows split, bias replicated (stored once, by TP rank 0).
    Tensor p = full.get("transformer.h.1.mlp.c_proj.weight");
    EXPECT_EQ(f.get("param/transformer.h.1.mlp.c_proj.weight").to_float_vector(),
              p.slice(0, r * C, (r + 1) * C).to_float_vector());
    EXPECT_EQ(f.contains("param/transformer.h.1.mlp.c_proj.bias"), r == 0);
  }
  EXPECT_EQ(f0.get("param/transformer.h.1.mlp.c_proj.bias").to_float_vector(),
            full.get("transformer.h.1.mlp.c_proj.bias").to_float_vector());
  // vocab 67 over 4: 17 rows each; rank 3 holds rows 51..66 and one zero row.
  const std::vector<float> wte =
      SafetensorsReader(shard_file(d.file("s"), 3, 0)).get("param/transformer.wte.weight").to_float_vector();
  ASSERT_EQ(wte.size(), static_cast<size_t>(17 * C));
  EXPECT_EQ(std::vector<float>(wte.begin(), wte.begin() + 16 * C),
            full.get("transformer.wte.weight").slice(0, 51, 67).to_float_vector());
  EXPECT_EQ(std::vector<float>(wte.begin() + 16 * C, wte.end()), std::vector<float>(static_cast<size_t>(C), 0.f));
}

// A killed shard or reshard leaves .OUT.tmp-PID behind; the next run writing
// OUT, or another --out in that directory, removes it when PID is dead,
// never while PID lives.
TEST(CkptTool, NextRunRemovesADeadRunsTempDirectoryAndKeepsALiveOnes) {
  TempDir d;
  const std::string src = d.file("model.safetensors");
  make_gpt2_file(src, kCfg, DType::F32, 4);
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  const pid_t live = ::fork();
  if (live == 0) {
    ::pause();
    ::_exit(0);
  }
  const std::string dead_tmp = d.file(".out.tmp-" + std::to_string(dead));
  const std::string live_tmp = d.file(".out.tmp-" + std::to_string(live));
  fs::create_directory(dead_tmp);
  fs::create_directory(live_tmp);
  std::ofstream(dead_tmp + "/rank_tp0_pp0.safetensors") << "half written";
  // Another --out's, from a killed consolidate to one file (write_file_atomic's temp) and a killed shard.
  const std::string dead_file = d.file(".m.safetensors.tmp." + std::to_string(dead) + ".Qx81Zp");
  const std::string dead_other = d.file(".other.tmp-" + std::to_string(dead));
  const std::string live_other = d.file(".other.tmp-" + std::to_string(live));
  std::ofstream(dead_file) << "half written";
  fs::create_directory(dead_other);
  fs::create_directory(live_other);
  shard_gpt2(src, d.file("out"), {2, 1, 1, 0});
  EXPECT_FALSE(fs::exists(dead_tmp));
  EXPECT_FALSE(fs::exists(dead_other));
  EXPECT_FALSE(fs::exists(dead_file));
  EXPECT_TRUE(fs::exists(live_tmp));
  EXPECT_TRUE(fs::exists(live_other));
  EXPECT_TRUE(fs::exists(d.file("out/manifest.json")));
  ::kill(live, SIGKILL);
  ::waitpid(live, nullptr, 0);
}

TEST(CkptTool, BadInputIsRefusedAndWritesNothing) {
  TempDir d;
  const std::string src = d.file("model.safetensors");
  make_gpt2_file(src, kCfg, DType::F32, 5);
  EXPECT_THROW(shard_gpt2(src, d.file("o"), {3, 1, 1, 0}), InvalidArgument);  // 4 heads over tp 3
  EXPECT_THROW(shard_gpt2(src, d.file("o"), {1, 4, 1, 0}), InvalidArgument);  // 3 layers over pp 4
  EXPECT_THROW(shard_gpt2(src, d.file("o"), {0, 1, 1, 0}), InvalidArgument);
  EXPECT_FALSE(fs::exists(d.file("o")));
  fs::create_directories(d.file("full"));
  testing::write_bytes(d.file("full/keep.txt"), "mine");
  EXPECT_THROW(shard_gpt2(src, d.file("full"), {2, 1, 1, 0}), InvalidArgument);
  EXPECT_TRUE(fs::exists(d.file("full/keep.txt")));
  // A truncated source names the file.
  // A header length of 16 and then 5 of those 16 bytes (std::string: the NULs are data).
  testing::write_bytes(d.file("bad.safetensors"), std::string("\x10\0\0\0\0\0\0\0{\"a\":", 13));
  try {
    shard_gpt2(d.file("bad.safetensors"), d.file("o"), {2, 1, 1, 0});
    ADD_FAILURE() << "no throw";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.safetensors"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(d.file("o")));
  // Consolidate: a missing shard and a shard of the wrong layout name the file.
  shard_gpt2(src, d.file("s"), {2, 1, 1, 0});
  // A shard of another layout (tp 4) in rank 1's place: wrong shapes.
  shard_gpt2(src, d.file("s4"), {4, 1, 1, 0});
  fs::copy_file(shard_file(d.file("s4"), 1, 0), shard_file(d.file("s"), 1, 0), fs::copy_options::overwrite_existing);
  try {
    consolidate_gpt2(d.file("s"), d.file("back.safetensors"));
    ADD_FAILURE() << "no throw";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(rank_stem(0, 1, 0)), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("the manifest says"), std::string::npos)
        << e.what();  // size differs from the manifest's
  }
  fs::remove(shard_file(d.file("s"), 1, 0));
  try {
    consolidate_gpt2(d.file("s"), d.file("back.safetensors"));
    ADD_FAILURE() << "no throw";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(rank_stem(0, 1, 0)), std::string::npos) << e.what();
  }
  EXPECT_THROW(consolidate_gpt2(d.file("nope"), d.file("back.safetensors")), FormatError);
  EXPECT_FALSE(fs::exists(d.file("back.safetensors")));
}

// Rewrites a shard file with `edit` applied to its tensors (in file order).
void rewrite_shard(const std::string& path,
                   const std::function<void(std::vector<std::pair<std::string, Tensor>>&)>& edit) {
  std::vector<std::pair<std::string, Tensor>> ts;
  std::map<std::string, std::string> md;
  {
    SafetensorsReader r(path);
    for (const SafetensorsEntry& e : r.entries()) ts.emplace_back(e.name, r.get(e.name));
    md = r.metadata();
  }
  edit(ts);
  write_safetensors(path, ts, md);
  // Record the new file's size and hash, so the checks after the hash check are what is tested.
  const std::string mpath = (fs::path(path).parent_path() / kManifestName).string();
  auto m = nlohmann::json::parse(testing::read_bytes(mpath));
  for (auto& f : m["files"])
    if (f["name"] == fs::path(path).filename().string()) {
      f["bytes"] = fs::file_size(path);
      f["sha256"] = sha256_file_hex(path);
    }
  testing::write_bytes(mpath, m.dump(1));
  testing::rehash_marker(fs::path(path).parent_path().string());
}

// Consolidate refuses with a FormatError that names `file` and contains `rule`; writes nothing.
void expect_consolidate_refused(const std::string& dir, const std::string& file, const std::string& rule) {
  const std::string out = dir + ".back.safetensors";
  try {
    consolidate_gpt2(dir, out);
    ADD_FAILURE() << "consolidate accepted a checkpoint that breaks: " << rule;
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(rule), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(out));
}

// consolidate's checks on what each rank's file holds (docs/checkpoint.md).
TEST(CkptTool, ConsolidateChecksEveryRanksTensors) {
  TempDir d;
  const std::string src = d.file("model.safetensors");
  make_gpt2_file(src, kCfg, DType::F32, 7);
  const std::string base = d.file("base");
  shard_gpt2(src, base, {2, 1, 1, 0});
  const size_t per_rank = SafetensorsReader(shard_file(base, 1, 0)).entries().size();
  auto fresh = [&](const std::string& name) {
    std::string dir = d.file(name);
    fs::copy(base, dir, fs::copy_options::recursive);
    return dir;
  };
  const std::string rank1 = rank_stem(0, 1, 0) + ".safetensors";
  // A tensor stored in another dtype than the manifest says.
  {
    const std::string dir = fresh("dtype");
    rewrite_shard(shard_file(dir, 1, 0), [](std::vector<std::pair<std::string, Tensor>>& ts) {
      for (auto& [n, t] : ts)
        if (n == "param/transformer.h.1.mlp.c_fc.weight") t = t.to(DType::BF16);
    });
    expect_consolidate_refused(dir, rank1, "the pieces need more than the file's");
  }
  // A tensor missing from rank 1's file.
  {
    const std::string dir = fresh("missing");
    rewrite_shard(shard_file(dir, 1, 0), [](std::vector<std::pair<std::string, Tensor>>& ts) { ts.pop_back(); });
    expect_consolidate_refused(dir, rank1, "the pieces need more than the file's");
  }
  // An extra tensor in rank 1's file.
  {
    const std::string dir = fresh("extra");
    rewrite_shard(shard_file(dir, 1, 0),
                  [](auto& ts) { ts.emplace_back("extra.weight", Tensor::from_vector({1.f}, {1})); });
    expect_consolidate_refused(
        dir, rank1,
        "holds " + std::to_string(per_rank + 1) + " tensors, the manifest lists " + std::to_string(per_rank));
  }
  // The right count, but one tensor under another name.
  {
    const std::string dir = fresh("renamed");
    rewrite_shard(shard_file(dir, 1, 0), [](std::vector<std::pair<std::string, Tensor>>& ts) {
      for (auto& [n, t] : ts)
        if (n == "param/transformer.h.1.mlp.c_fc.bias") n = "param/transformer.h.1.mlp.c_fc.bias_renamed";
    });
    expect_consolidate_refused(dir, rank1, "lacks param/transformer.h.1.mlp.c_fc.bias");
  }
  // A corrupt manifest: not JSON, another format (the marker not re-hashed: refused either way).
  const std::string manifest = "manifest.json";
  {
    const std::string dir = fresh("garbage");
    testing::write_bytes(dir + "/" + manifest, "{\"format\": ");
    testing::rehash_marker(dir);  // the marker vouches for it: the parse is what is tested
    expect_consolidate_refused(dir, dir + "/" + manifest, "not valid JSON");
  }
  {
    const std::string dir = fresh("format");
    auto j = nlohmann::json::parse(testing::read_bytes(dir + "/" + manifest));
    j["format"] = "something-else";
    testing::write_bytes(dir + "/" + manifest, j.dump());
    testing::rehash_marker(dir);
    expect_consolidate_refused(dir, dir + "/" + manifest, "not a tessera-checkpoint manifest");
  }
  {
    const std::string dir = fresh("edited");
    auto j = nlohmann::json::parse(testing::read_bytes(dir + "/" + manifest));
    j["step"] = 7;
    testing::write_bytes(dir + "/" + manifest, j.dump());
    expect_consolidate_refused(dir, dir + "/" + manifest, "the manifest was changed after the save");
  }
  // Lying model fields and layouts, with the marker re-hashed (issue 32 item 4).
  {
    const std::string dir = fresh("config");
    testing::edit_manifest_rehashed(dir, [](nlohmann::json& j) { j["model"]["heads"] = 5; });  // does not divide 32
    expect_consolidate_refused(dir, dir, "5 heads do not divide hidden size 32");
  }
  {
    const std::string dir = fresh("heads");
    testing::edit_manifest_rehashed(dir, [](nlohmann::json& j) { j["model"]["heads"] = j["model"]["kv_heads"] = 8; });
    expect_consolidate_refused(dir, rank_stem(0, 0, 0), "the manifest's model was changed after the save");
  }
  {
    const std::string dir = fresh("layers");
    testing::edit_manifest_rehashed(dir, [](nlohmann::json& j) { j["model"]["layers"] = 4; });
    expect_consolidate_refused(dir, dir, "has 4 layers; the files hold layers 0..2");
  }
  {
    const std::string dir = fresh("tp");
    testing::edit_manifest_rehashed(dir, [](nlohmann::json& j) { j["layout"]["tp"] = 3; });
    expect_consolidate_refused(dir, dir, "is not the layout's tp 3");
  }
  // The untouched copy still consolidates (the checks above are the edits').
  consolidate_gpt2(base, d.file("ok.safetensors"));
  expect_same_tensors(src, d.file("ok.safetensors"));
}

int run(const std::string& cmd) {
  int rc = std::system((cmd + " >/dev/null 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST(CkptCli, ExitCodes) {
  TempDir d;
  const std::string src = d.file("model.safetensors");
  make_gpt2_file(src, kCfg, DType::F32, 6);
  const std::string bin = TESSERA_BIN;
  EXPECT_EQ(run(bin + " ckpt inspect " + src), 0);
  EXPECT_EQ(run(bin + " ckpt shard --tp 2 --pp 2 --out " + d.file("s") + " " + src), 0);
  EXPECT_EQ(run(bin + " ckpt inspect " + d.file("s")), 0);
  EXPECT_EQ(run(bin + " ckpt consolidate --out " + d.file("b.safetensors") + " " + d.file("s")), 0);
  expect_same_tensors(src, d.file("b.safetensors"));
  EXPECT_EQ(run(bin + " ckpt reshard --tp 4 --out " + d.file("r") + " " + d.file("s")), 0);
  // The CLI's reshard output equals a direct shard of the source: every file's
  // tensors bit for bit, and the manifest but for its source path.
  shard_gpt2(src, d.file("direct"), {4, 1, 1, 0});
  for (int r = 0; r < 4; ++r) expect_same_tensors(shard_file(d.file("direct"), r, 0), shard_file(d.file("r"), r, 0));
  EXPECT_FALSE(fs::exists(shard_file(d.file("r"), 0, 1)));
  auto mr = nlohmann::json::parse(testing::read_bytes(d.file("r") + "/manifest.json"));
  auto md = nlohmann::json::parse(testing::read_bytes(d.file("direct") + "/manifest.json"));
  EXPECT_EQ(mr, md);
  EXPECT_EQ(run(bin + " ckpt"), 2);
  EXPECT_EQ(run(bin + " ckpt shard --tp 3 --out " + d.file("x") + " " + src), 2);         // heads
  EXPECT_EQ(run(bin + " ckpt shard --tp 1 --pp 4 --out " + d.file("x") + " " + src), 2);  // layers
  EXPECT_EQ(run(bin + " ckpt shard --tp 0 --out " + d.file("x") + " " + src), 2);
  EXPECT_EQ(run(bin + " ckpt shard --tp 1 --pp 2 --stages 1,1 --out " + d.file("x") + " " + src), 2);  // sum
  EXPECT_EQ(run(bin + " ckpt shard --tp 1 --pp 2 --stages 3,0 --out " + d.file("x") + " " + src), 2);  // empty
  EXPECT_EQ(run(bin + " ckpt shard --tp 1 --pp 2 --stages 2 --out " + d.file("x") + " " + src), 2);    // length
  EXPECT_EQ(run(bin + " ckpt shard --tp 1 --pp 2 --stages 2,x --out " + d.file("x") + " " + src), 2);  // not a list
  EXPECT_EQ(run(bin + " ckpt reshard --tp 1 --pp 2 --stages 1,1 --out " + d.file("x") + " " + d.file("s")), 2);
  EXPECT_EQ(run(bin + " ckpt shard --tp 1 --pp 2 --stages 2,1 --out " + d.file("st") + " " + src), 0);
  EXPECT_TRUE(SafetensorsReader(shard_file(d.file("st"), 0, 0)).contains("param/transformer.h.1.ln_1.weight"));
  EXPECT_EQ(run(bin + " ckpt shard --out " + d.file("x") + " " + src), 2);  // --tp missing
  EXPECT_EQ(run(bin + " ckpt shard --tp 2 --out " + d.file("x") + " " + d.file("missing.safetensors")), 2);
  EXPECT_EQ(run(bin + " ckpt shard --tp 2 --out " + d.file("s") + " " + src), 2);  // exists
  fs::create_directories(d.file("empty"));
  EXPECT_EQ(run(bin + " ckpt consolidate --out " + d.file("y.safetensors") + " " + d.file("empty")), 2);  // nothing
  EXPECT_EQ(run(bin + " ckpt inspect " + d.file("missing.safetensors")), 2);
  EXPECT_FALSE(fs::exists(d.file("x")));
}

// Exit code and everything the command printed.
std::pair<int, std::string> run_out(const std::string& cmd) {
  auto r = tessera::testing::run_command(cmd);
  return {r.code, r.out};
}

// Bad manifests and values exit 2 and say, in words, what is wrong and where.
TEST(CkptCli, BadInputSaysWhatIsWrong) {
  TempDir d;
  const std::string bin = TESSERA_BIN;
  const std::string src = d.file("model.safetensors");
  make_gpt2_file(src, kCfg, DType::F32, 7);
  fs::create_directories(d.file("m"));
  fs::create_directories(d.file("empty"));
  fs::create_directory_symlink(d.file("empty"), d.file("link"));
  const std::string manifest = d.file("m") + "/" + kManifestName;
  struct Case {
    std::string manifest_text, cmd, says;
  };
  for (const Case& c : {
           Case{"[1, 2]", "consolidate --out " + d.file("o.safetensors") + " " + d.file("m"),
                manifest + ": expected a JSON object, found array"},
           Case{R"({"format": "tessera-gpt2-tp-pp-shards", "version": 2, "config": []})", "inspect " + d.file("m"),
                "regenerate it from the Hugging Face file it was cut from: `build/bin/tessera ckpt shard --tp T --pp P "
                "--out NEW_DIR MODEL.safetensors`"},
           Case{R"({"format": "tessera-gpt2-tp-pp-shards", "version": 2})",
                "reshard --tp 1 --out " + d.file("r") + " " + d.file("m"), "is a shard set of an earlier tessera"},
           Case{R"({"format": "other"})", "inspect " + d.file("m"), manifest + ": not a tessera-checkpoint manifest"},
           Case{"{\"format\": ", "inspect " + d.file("m"), manifest + " is not valid JSON"},
           Case{"{\"format\": \"tessera-checkpoint\", \"step\": 1e400}",
                "consolidate --out " + d.file("o.safetensors") + " " + d.file("m"),
                manifest + " is not valid JSON: number overflow parsing '1e400'"},
           Case{"", "shard --tp 0 --out " + d.file("x") + " " + src, "--tp: must be a positive integer, got 0"},
           Case{"", "shard --tp 2147483648 --out " + d.file("x") + " " + src,
                "--tp: must be a positive integer no larger than 2147483647, got 2147483648"},
           Case{"", "consolidate --out " + d.file("no/such/dir/o.safetensors") + " " + d.file("m"),
                "--out: cannot write '" + d.file("no/such/dir/o.safetensors") + "': directory '" +
                    d.file("no/such/dir") + "' does not exist"},
           // A directory --out: its parent must exist, and it must not be a symbolic link.
           Case{"", "shard --tp 2 --out " + d.file("no/such/dir") + " " + src,
                "--out " + d.file("no/such/dir") + ": directory '" + d.file("no/such") + "' does not exist"},
           Case{"", "consolidate --max-shard-size 1MB --out " + d.file("no/such/hf/") + " " + src,
                "directory '" + d.file("no/such") + "' does not exist"},
           Case{"", "shard --tp 2 --out " + d.file("link") + " " + src,
                "--out " + d.file("link") + " is a symbolic link"},
       }) {
    SCOPED_TRACE(c.cmd);
    if (!c.manifest_text.empty()) std::ofstream(manifest, std::ios::trunc) << c.manifest_text;
    auto [code, out] = run_out(bin + " ckpt " + c.cmd);
    EXPECT_EQ(code, 2) << out;
    EXPECT_NE(out.find(c.says), std::string::npos) << out;
    EXPECT_EQ(out.find("json.exception"), std::string::npos) << out;
    EXPECT_EQ(out.find("0.000000"), std::string::npos) << out;
  }
  EXPECT_FALSE(fs::exists(d.file("x")));
  EXPECT_FALSE(fs::exists(d.file("r")));
  EXPECT_FALSE(fs::exists(d.file("o.safetensors")));
}

// A file written by train_gpt --export shards and consolidates back exactly.
TEST(CkptCli, TrainGptExportShards) {
  TempDir d;
  const std::string out = d.file("trained.safetensors");
  ASSERT_EQ(run(std::string("OPENBLAS_NUM_THREADS=1 ") + TRAIN_GPT_BIN +
                " --steps 1 --layers 2 --hidden 64 --heads 4 --seq 32 --vocab 256 --micro-batch 2 --export " + out),
            0);
  shard_gpt2(out, d.file("s"), {2, 2, 1, 0});
  consolidate_gpt2(d.file("s"), d.file("back.safetensors"));
  expect_same_tensors(out, d.file("back.safetensors"));
}

}  // namespace
}  // namespace tessera::parallel::checkpoint
