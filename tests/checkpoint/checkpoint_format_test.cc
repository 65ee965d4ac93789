// The one checkpoint format on a synthetic model that no family defines
// (so a new family, Llama with tp > kv_heads among them, works unchanged):
// a fused tensor of 3 chunks, a 2-chunk tensor whose pieces are replicated
// over TP ranks (tp_parts < tp: only replica 0 writes, every replica
// reads), a padded vocabulary-style split and a replicated tensor, over
// tp x pp x dp; coverage, reads against load_shard (the layers' own code)
// and hand-computed elements, consolidate and reshard; the directory commit
// through FileOps.
#include <gtest/gtest.h>

#include <array>
#include <cerrno>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "parallel/checkpoint/checkpoint.h"
#include "parallel/checkpoint/safetensors.h"
#include "runtime/error.h"
#include "runtime/files.h"
#include "tests/checkpoint/test_util.h"

namespace tessera::parallel::checkpoint {
namespace {

namespace fs = std::filesystem;
using parallel::layers::Parameter;
using testing::TempDir;

// "kv" has 2 chunks of 2 columns; with tp > 2 its 2 pieces per chunk are
// replicated over tp / 2 ranks each (as Llama's KV heads when tp > kv_heads).
class Synthetic : public ModelLayout {
 public:
  std::string model_json() const override { return R"({"synthetic": 1})"; }
  std::string describe() const override { return "synthetic"; }
  int64_t layers() const override { return 2; }
  std::vector<Parameter> tensors(int tp, int r) const override {
    auto make = [&](const std::string& n, Shape s, int split, int chunks, int layer, int parts = 0) {
      Parameter p = parallel::layers::make_parameter(n, std::move(s), split, chunks, tp, r,
                                                     parallel::layers::Init::Zeros, 0.f, false, parts);
      p.layer = layer;
      return p;
    };
    const int kv_parts = std::min(tp, 2);
    std::vector<Parameter> v;
    v.push_back(make("emb", {10, 6}, 0, 1, parallel::layers::kEmbeddingLayer));  // padded for tp 3, 4, 8
    for (int l = 0; l < 2; ++l) {
      v.push_back(make("blk." + std::to_string(l) + ".qkv", {6, 24}, 1, 3, l));  // fused q | k | v
      v.push_back(make("blk." + std::to_string(l) + ".kv", {6, 4}, 1, 2, l, kv_parts));
    }
    v.push_back(make("norm", {6}, -1, 1, parallel::layers::kHeadLayer));
    return v;
  }
  std::map<std::string, std::string> file_metadata(DType /*weights*/) const override { return {{"format", "pt"}}; }
};

// Tensor k's element i holds 1000 k + i.
std::vector<std::pair<std::string, Tensor>> source_tensors(DType dt) {
  std::vector<std::pair<std::string, Tensor>> t;
  int k = 0;
  for (const Parameter& p : Synthetic().tensors(1, 0)) {
    std::vector<float> v(static_cast<size_t>(shape_numel(p.full_shape)));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(1000 * k + static_cast<int>(i));
    t.emplace_back(p.name, Tensor::from_vector(v, p.full_shape, DType::F32).to(dt));
    ++k;
  }
  return t;
}

std::map<std::string, std::string> names_as_stored() {
  std::map<std::string, std::string> m;
  for (const Parameter& p : Synthetic().tensors(1, 0)) m[p.name] = p.name;
  return m;
}

// Every shard of every TP rank read back equals load_shard of the full tensor.
void expect_every_shard(const Checkpoint& ck, int tp, const std::vector<std::pair<std::string, Tensor>>& full) {
  std::map<std::string, std::vector<float>> f32;
  for (const auto& [n, t] : full) f32[n] = t.to_float_vector();
  for (int r = 0; r < tp; ++r) {
    for (Parameter p : Synthetic().tensors(tp, r)) {
      SCOPED_TRACE(p.name + " tp rank " + std::to_string(r) + " of " + std::to_string(tp));
      std::vector<float> got(static_cast<size_t>(p.numel()), -1.f), want(got.size(), -2.f);
      ck.read_f32(p, StateKind::Param, 0, p.numel(), got.data());
      p.value = want.data();
      parallel::layers::load_shard(p, f32.at(p.name).data());
      EXPECT_EQ(got, want);
    }
  }
}

TEST(CheckpointFormat, ReplicatedPiecesAndFusedChunksOverEveryLayout) {
  TempDir d;
  const auto tensors = source_tensors(DType::F32);
  write_safetensors(d.file("src.safetensors"), tensors, {{"format", "pt"}});
  SafetensorsReader src(d.file("src.safetensors"));
  const WholeTensors whole(src, names_as_stored());
  const Synthetic model;
  const std::string want = testing::read_bytes(d.file("src.safetensors"));
  int n = 0;
  for (int tp : {1, 2, 4, 8}) {
    for (int pp : {1, 2}) {
      for (int dp : {1, 2}) {
        SCOPED_TRACE(detail::concat("tp ", tp, " pp ", pp, " dp ", dp));
        const std::string dir = d.file("c" + std::to_string(n++));
        WriteOptions o;
        o.layout.tp = tp;
        o.layout.pp = pp;
        o.layout.dp = dp;
        write_checkpoint(whole, model, dir, o);
        const Checkpoint ck(dir);
        ck.verify_model(model);
        ck.verify_all();
        // Replica 0 of each piece writes, nobody else: every element once.
        for (const PieceInfo& pc : ck.pieces()) {
          if (pc.tensor.find(".kv") != std::string::npos && tp > 2) {
            EXPECT_EQ(pc.tp_parts, 2);
            EXPECT_EQ(pc.tp_rank % (tp / 2), 0) << "a replica other than 0 wrote " << pc.tensor;
          }
          if (pc.tensor == "norm") {
            EXPECT_EQ(ck.files()[pc.file].name.find("tp_rank_00"), 11u) << ck.files()[pc.file].name;
          }
        }
        expect_every_shard(ck, tp, tensors);
        // consolidate gives the source file back, byte for byte.
        const std::string back = dir + ".safetensors";
        consolidate(ck, model, back, 0, false, false);
        EXPECT_TRUE(testing::read_bytes(back) == want);
      }
    }
  }
  // Hand-computed: tp 4, kv [6, 4] of 2 chunks in 2 parts. Ranks 0 and 1 hold
  // columns 0 and 2 (part 0 of each chunk), ranks 2 and 3 columns 1 and 3.
  {
    WriteOptions o;
    o.layout.tp = 4;
    write_checkpoint(whole, model, d.file("hand"), o);
    const Checkpoint ck(d.file("hand"));
    const int kv = 2;  // "blk.0.kv" is the third tensor: 1000 x 2 + flat index
    for (int r = 0; r < 4; ++r) {
      const Parameter p = model.tensors(4, r)[2];
      ASSERT_EQ(p.name, "blk.0.kv");
      ASSERT_EQ(p.shape, (Shape{6, 2}));
      std::vector<float> got(12);
      ck.read_f32(p, StateKind::Param, 0, 12, got.data());
      const int c0 = r < 2 ? 0 : 1;
      for (int row = 0; row < 6; ++row) {
        EXPECT_EQ(got[static_cast<size_t>(row * 2)], 1000 * kv + row * 4 + c0) << r;
        EXPECT_EQ(got[static_cast<size_t>(row * 2 + 1)], 1000 * kv + row * 4 + 2 + c0) << r;
      }
    }
    // qkv [6, 24], 3 chunks of 8 columns over 4: rank 1 holds columns 2-3, 10-11, 18-19.
    const Parameter q = model.tensors(4, 1)[1];
    std::vector<float> got(static_cast<size_t>(q.numel()));
    ck.read_f32(q, StateKind::Param, 0, q.numel(), got.data());
    EXPECT_EQ(got[0], 1000 * 1 + 2);
    EXPECT_EQ(got[2], 1000 * 1 + 10);
    EXPECT_EQ(got[5], 1000 * 1 + 19);
    EXPECT_EQ(got[6], 1000 * 1 + 24 + 2);  // row 1
  }
}

// A bf16 source stays bf16, byte for byte, through a reshard chain, and the
// chain's files equal a direct write of the last layout.
TEST(CheckpointFormat, Bf16KeptAndReshardChainEqualsDirect) {
  TempDir d;
  const auto tensors = source_tensors(DType::BF16);
  write_safetensors(d.file("src.safetensors"), tensors, {{"format", "pt"}});
  SafetensorsReader src(d.file("src.safetensors"));
  const WholeTensors whole(src, names_as_stored());
  const Synthetic model;
  WriteOptions o;
  std::string prev;
  const std::vector<std::array<int, 3>> chain = {{1, 1, 1}, {8, 2, 1}, {2, 1, 2}, {4, 2, 1}};
  for (size_t i = 0; i < chain.size(); ++i) {
    o.layout.tp = chain[i][0];
    o.layout.pp = chain[i][1];
    o.layout.dp = chain[i][2];
    const std::string dir = d.file("chain" + std::to_string(i));
    if (prev.empty()) {
      write_checkpoint(whole, model, dir, o);
    } else {
      const Checkpoint ck(prev);
      ck.verify_all();
      write_checkpoint(ck, model, dir, o);
    }
    prev = dir;
  }
  write_checkpoint(whole, model, d.file("direct"), o);
  for (const auto& e : fs::directory_iterator(d.file("direct")))
    EXPECT_TRUE(testing::read_bytes(e.path().string()) ==
                testing::read_bytes(prev + "/" + e.path().filename().string()))
        << e.path().filename();
  const Checkpoint ck(prev);
  for (const auto& [name, t] : ck.tensors()) EXPECT_EQ(t.dtype, DType::BF16) << name;
  consolidate(ck, model, d.file("back.safetensors"), 0, false, false);
  EXPECT_TRUE(testing::read_bytes(d.file("back.safetensors")) == testing::read_bytes(d.file("src.safetensors")));
}

// commit_directory goes through FileOps: a failing rename leaves the temp
// directory and no target; a failing fsync of the parent is raised after the rename.
class FailOps : public FileOps {
 public:
  int fail_rename = 0, fail_fsync_after_rename = 0;
  bool renamed = false;
  int rename(const char* from, const char* to) override {
    if (fail_rename) {
      errno = fail_rename;
      return -1;
    }
    renamed = true;
    return FileOps::rename(from, to);
  }
  int fsync(int fd) override {
    if (renamed && fail_fsync_after_rename) {
      errno = fail_fsync_after_rename;
      return -1;
    }
    return FileOps::fsync(fd);
  }
};

TEST(CheckpointFormat, DirectoryCommitGoesThroughFileOps) {
  TempDir d;
  fs::create_directories(d.file("tmp"));
  testing::write_bytes(d.file("tmp/a"), "a");
  FailOps ops;
  ops.fail_rename = EXDEV;
  CommitOptions o;
  o.ops = &ops;
  try {
    commit_directory(d.file("tmp"), d.file("out"), o);
    ADD_FAILURE() << "no throw";
  } catch (const IoError& e) {
    EXPECT_EQ(e.step(), FileStep::Rename);
    EXPECT_NE(std::string(e.what()).find(d.file("out")), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::exists(d.file("tmp/a")));
  EXPECT_FALSE(fs::exists(d.file("out")));
  ops.fail_rename = 0;
  ops.fail_fsync_after_rename = EIO;
  EXPECT_THROW(commit_directory(d.file("tmp"), d.file("out"), o), IoError);
  EXPECT_TRUE(fs::exists(d.file("out/a")));  // renamed, then the parent's fsync failed
  // A non-empty target is not replaced unless it may be moved aside.
  fs::create_directories(d.file("tmp2"));
  EXPECT_THROW(commit_directory(d.file("tmp2"), d.file("out")), InvalidArgument);
  EXPECT_TRUE(fs::exists(d.file("out/a")));
  CommitOptions aside;
  aside.aside = d.file(".out.old");
  commit_directory(d.file("tmp2"), d.file("out"), aside);
  EXPECT_TRUE(fs::exists(d.file(".out.old/a")));
  EXPECT_TRUE(fs::is_empty(d.file("out")));
}

}  // namespace
}  // namespace tessera::parallel::checkpoint
