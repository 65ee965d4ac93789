// `tessera ckpt` streaming and the Hugging Face sharded form (issue 13,
// items 5 and 6): bit-identical round trips over every small layout, HF
// sharded in and out, a chain of reshards against a direct shard, bad
// indexes naming the file, peak memory that does not grow with the model,
// and the pieces underneath (incremental SHA-256, several files at once,
// the background writer's error path).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "parallel/checkpoint/background_writer.h"
#include "parallel/checkpoint/ckpt_tool.h"
#include "runtime/error.h"
#include "runtime/files.h"
#include "tests/checkpoint/gpt2_test_files.h"
#include "tests/checkpoint/test_util.h"

namespace tessera::parallel::checkpoint {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::TempDir;

// 8 heads (tp up to 8), 4 layers (pp up to 4), vocab 67 (padding for tp 2, 4, 8).
const ModelConfig kCfg = gpt2_config(67, 16, 32, 4, 8);

std::string raw(const SafetensorsReader& r, const std::string& name) {
  const SafetensorsEntry& e = r.entry(name);
  return std::string(reinterpret_cast<const char*>(r.bytes(e)), e.end - e.begin);
}

std::string shard_file(const std::string& dir, int tp, int pp) {
  return dir + "/" + rank_stem(0, tp, pp) + ".safetensors";
}

// Consolidate writes exactly what write_gpt2_safetensors writes for the
// source tensors (the independent writer), with the directory's name in the
// metadata: the whole file is compared, header included.
TEST(CkptStream, ShardConsolidateIsBitIdenticalForEveryLayout) {
  TempDir d;
  for (DType dt : {DType::F32, DType::BF16}) {
    const std::string src = d.file("model.safetensors");
    fs::remove(src);
    const auto tensors = testing::random_gpt2_tensors(kCfg, dt, 11);
    write_gpt2_safetensors(src, kCfg, tensors);
    const std::string want = d.file("want.safetensors");
    fs::remove(want);
    write_gpt2_safetensors(want, kCfg, tensors, {{"tessera_consolidated_from", "s"}});
    const std::string want_bytes = testing::read_bytes(want);
    for (int tp : {1, 2, 4, 8}) {
      for (int pp : {1, 2, 4}) {
        if (dt == DType::BF16 && !(tp == 8 && pp == 4) && !(tp == 2 && pp == 1)) continue;
        SCOPED_TRACE(detail::concat(dtype_name(dt), " tp ", tp, " pp ", pp));
        fs::remove_all(d.file("s"));
        shard_gpt2(src, d.file("s"), {tp, pp, 1, 0});
        const std::string back = d.file("back.safetensors");
        fs::remove(back);
        consolidate_gpt2(d.file("s"), back);
        EXPECT_TRUE(testing::read_bytes(back) == want_bytes);
      }
    }
  }
}

// HF sharded out (consolidate --max-shard-size), in (shard of the index
// directory), and out again: the same files byte for byte; the index is
// right (every tensor once, total_size the sum of the data bytes).
TEST(CkptStream, HfShardedRoundTrip) {
  TempDir d;
  const std::string src = d.file("model.safetensors");
  write_gpt2_safetensors(src, kCfg, testing::random_gpt2_tensors(kCfg, DType::F32, 12));
  SafetensorsReader full(src);
  uint64_t data_bytes = 0;
  for (const SafetensorsEntry& e : full.entries()) data_bytes += e.end - e.begin;

  fs::create_directories(d.file("a"));
  fs::create_directories(d.file("b"));
  shard_gpt2(src, d.file("a/s"), {2, 2, 1, 0});
  const uint64_t max = 20000;  // wte (67 x 32 x 4 = 8576 bytes) and a few layers' tensors per file
  const std::vector<std::string> files = consolidate_gpt2_sharded(d.file("a/s"), d.file("hf1"), max);
  ASSERT_GT(files.size(), 2u);
  const json index = json::parse(testing::read_bytes(d.file("hf1/model.safetensors.index.json")));
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), data_bytes);
  std::map<std::string, int> seen;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    const std::string file = it.value().get<std::string>();
    EXPECT_EQ(file.rfind("model-", 0), 0u) << file;
    EXPECT_NE(file.find("-of-" + std::string(5 - std::to_string(files.size()).size(), '0') +
                        std::to_string(files.size()) + ".safetensors"),
              std::string::npos)
        << file;
    SafetensorsReader part(d.file("hf1/" + file));
    ASSERT_TRUE(part.contains(it.key())) << it.key() << " not in " << file;
    EXPECT_TRUE(raw(part, it.key()) == raw(full, it.key())) << it.key();
    ++seen[it.key()];
  }
  EXPECT_EQ(seen.size(), full.entries().size());
  for (size_t k = 0; k < files.size(); ++k) {
    uint64_t bytes = 0;
    SafetensorsReader part(d.file("hf1/" + files[k]));
    for (const SafetensorsEntry& e : part.entries()) bytes += e.end - e.begin;
    // At most max bytes, unless a single tensor is larger.
    EXPECT_TRUE(bytes <= max || part.entries().size() == 1) << files[k] << " holds " << bytes;
  }
  // In again and out again: identical files.
  shard_gpt2(d.file("hf1"), d.file("b/s"), {4, 1, 1, 0});
  consolidate_gpt2_sharded(d.file("b/s"), d.file("hf2"), max);
  for (const std::string& f : files)
    EXPECT_TRUE(testing::read_bytes(d.file("hf1/" + f)) == testing::read_bytes(d.file("hf2/" + f))) << f;
  EXPECT_TRUE(testing::read_bytes(d.file("hf1/model.safetensors.index.json")) ==
              testing::read_bytes(d.file("hf2/model.safetensors.index.json")));
  // reshard takes the HF sharded directory too.
  reshard_gpt2(d.file("hf2"), d.file("b/r"), {2, 2, 1, 0});
  for (int s = 0; s < 2; ++s)
    for (int r = 0; r < 2; ++r)
      EXPECT_TRUE(testing::read_bytes(shard_file(d.file("a/s"), r, s)) ==
                  testing::read_bytes(shard_file(d.file("b/r"), r, s)));
  // Everything in one file: model.safetensors alone, as save_pretrained writes it.
  EXPECT_EQ(consolidate_gpt2_sharded(d.file("a/s"), d.file("hf3/"), 1ull << 30),
            std::vector<std::string>{"model.safetensors"});
  EXPECT_FALSE(fs::exists(d.file("hf3/model.safetensors.index.json")));
  // An existing non-empty --out is refused and left alone.
  EXPECT_THROW(consolidate_gpt2_sharded(d.file("a/s"), d.file("hf1"), max), InvalidArgument);
  EXPECT_TRUE(fs::exists(d.file("hf1/model.safetensors.index.json")));
}

TEST(CkptStream, ChainOfReshardsEqualsDirectShard) {
  TempDir d;
  const std::string src = d.file("model.safetensors");
  write_gpt2_safetensors(src, kCfg, testing::random_gpt2_tensors(kCfg, DType::F32, 13));
  shard_gpt2(src, d.file("c0"), {1, 1, 1, 0});
  reshard_gpt2(d.file("c0"), d.file("c1"), {2, 2, 1, 0});
  reshard_gpt2(d.file("c1"), d.file("c2"), {8, 1, 1, 0});
  reshard_gpt2(d.file("c2"), d.file("c3"), {1, 4, 1, 0});
  reshard_gpt2(d.file("c3"), d.file("c4/"), {4, 4, 1, 0, {1, 1, 1, 1}});
  shard_gpt2(src, d.file("direct"), {4, 4, 1, 0});
  for (int s = 0; s < 4; ++s)
    for (int r = 0; r < 4; ++r)
      EXPECT_TRUE(testing::read_bytes(shard_file(d.file("direct"), r, s)) ==
                  testing::read_bytes(shard_file(d.file("c4"), r, s)))
          << r << " " << s;
  json a = json::parse(testing::read_bytes(d.file("direct/manifest.json")));
  json b = json::parse(testing::read_bytes(d.file("c4/manifest.json")));
  a.erase("source");
  b.erase("source");
  EXPECT_EQ(a, b);
}

// A valid HF sharded directory at `dir` made by consolidate; returns its files.
std::vector<std::string> make_hf_sharded(TempDir& d, const std::string& dir) {
  const std::string src = d.file("src.safetensors");
  if (!fs::exists(src)) write_gpt2_safetensors(src, kCfg, testing::random_gpt2_tensors(kCfg, DType::F32, 14));
  fs::remove_all(d.file("tmp_s"));
  shard_gpt2(src, d.file("tmp_s"), {1, 1, 1, 0});
  fs::remove_all(dir);
  return consolidate_gpt2_sharded(d.file("tmp_s"), dir, 60000);
}

// `fn` throws FormatError whose message holds every one of `says`.
template <typename Fn>
void expect_format_error(Fn fn, const std::vector<std::string>& says) {
  try {
    fn();
    ADD_FAILURE() << "no FormatError; expected one saying " << says.front();
  } catch (const FormatError& e) {
    for (const std::string& s : says) EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what();
  }
}

TEST(CkptStream, BadHfIndexNamesTheFile) {
  TempDir d;
  const std::string hf = d.file("hf"), index = d.file("hf/model.safetensors.index.json");
  auto edit = [&](const std::function<void(json&)>& f) {
    make_hf_sharded(d, hf);
    json j = json::parse(testing::read_bytes(index));
    f(j);
    testing::write_bytes(index, j.dump(2));
  };
  auto shard = [&] { shard_gpt2(hf, d.file("out"), {2, 1, 1, 0}); };
  const std::vector<std::string> files = make_hf_sharded(d, hf);
  ASSERT_GE(files.size(), 3u);
  const std::string& f1 = files[0];
  const std::string& f2 = files[1];
  {  // a shard file missing
    make_hf_sharded(d, hf);
    fs::remove(d.file("hf/" + f2));
    expect_format_error(shard, {index, f2, "does not exist"});
  }
  {  // a name with ../ (the file exists one level up)
    edit([&](json& j) { j["weight_map"]["transformer.ln_f.bias"] = "../" + f2; });
    expect_format_error(shard, {index, "../" + f2, "plain file name"});
  }
  {  // a name with a directory
    edit([&](json& j) { j["weight_map"]["transformer.ln_f.bias"] = "sub/x.safetensors"; });
    expect_format_error(shard, {index, "sub/x.safetensors"});
  }
  {  // a tensor missing from the weight_map (its shard still holds it)
    edit([&](json& j) { j["weight_map"].erase("transformer.h.1.ln_1.weight"); });
    expect_format_error(shard, {index, "transformer.h.1.ln_1.weight", "does not list"});
  }
  {  // a tensor missing everywhere: no shard holds what the weight_map names
    edit([&](json& j) { j["weight_map"]["transformer.h.9.ln_1.weight"] = f1; });
    expect_format_error(shard, {index, "transformer.h.9.ln_1.weight", "does not hold it"});
  }
  {  // a tensor in two files: a second file also holds ln_f.bias
    make_hf_sharded(d, hf);
    json j = json::parse(testing::read_bytes(index));
    const std::string owner = j["weight_map"]["transformer.ln_f.bias"].get<std::string>();
    const std::string other = owner == f2 ? f1 : f2;
    std::vector<std::pair<std::string, Tensor>> t;
    SafetensorsReader o(d.file("hf/" + other));
    for (const std::string& n : o.names()) t.emplace_back(n, o.get(n));
    t.emplace_back("transformer.ln_f.bias", SafetensorsReader(d.file("hf/" + owner)).get("transformer.ln_f.bias"));
    const std::string rewritten = d.file("rewritten.safetensors");
    write_safetensors(rewritten, t);
    fs::rename(rewritten, d.file("hf/" + other));
    expect_format_error(shard, {index, "transformer.ln_f.bias", "is in both", other});
  }
  {  // a FIFO named by the index: refused, not waited on
    make_hf_sharded(d, hf);
    fs::remove(d.file("hf/" + f2));
    ASSERT_EQ(::mkfifo(d.file("hf/" + f2).c_str(), 0644), 0);
    expect_format_error(shard, {f2, "FIFO"});
  }
  EXPECT_FALSE(fs::exists(d.file("out")));
  // reshard reports the same (it shards an HF directory directly).
  expect_format_error([&] { reshard_gpt2(hf, d.file("out"), {2, 1, 1, 0}); }, {f2, "FIFO"});
  EXPECT_FALSE(fs::exists(d.file("out")));
}

TEST(CkptStream, ParseShardSize) {
  EXPECT_EQ(parse_shard_size("500MB"), 500'000'000u);
  EXPECT_EQ(parse_shard_size("2GB"), 2'000'000'000u);
  EXPECT_EQ(parse_shard_size("5gb"), 5'000'000'000u);
  EXPECT_EQ(parse_shard_size("1GiB"), 1ull << 30);
  EXPECT_EQ(parse_shard_size("64KiB"), 65536u);
  EXPECT_EQ(parse_shard_size("123"), 123u);
  EXPECT_EQ(parse_shard_size("10B"), 10u);
  for (const char* bad : {"", "0", "0MB", "-1", "1.5GB", "5XB", "MB", "99999999999999999999"})
    EXPECT_THROW(parse_shard_size(bad), InvalidArgument) << bad;
}

// A GPT-2-shaped f32 file of `layers` layers written by streaming (finite values).
void write_big(const std::string& path, const ModelConfig& c) {
  std::vector<TensorSpec> specs;
  for (const std::string& n : gpt2_tensor_names(c)) specs.push_back({n, DType::F32, gpt2_tensor_shape(c, n)});
  const std::string header = safetensors_header(specs, {{"format", "pt"}, {"n_head", std::to_string(c.heads)}});
  write_file_atomic(path, [&](FileSink& s) {
    s.write(header);
    std::vector<float> buf(1 << 16);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i % 1000) * 1e-4f;
    for (const TensorSpec& t : specs)
      for (uint64_t left = static_cast<uint64_t>(shape_numel(t.shape)); left > 0;) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(left, buf.size()));
        s.write(buf.data(), n * 4);
        left -= n;
      }
  });
}

// Peak RSS (KiB) of `argv` run as a child.
long child_peak_kib(const std::vector<std::string>& argv) {
#if defined(__SANITIZE_ADDRESS__)
  // ASan holds freed blocks in a quarantine (256 MB by default), which would
  // count as the command's own memory.
  const char* o = std::getenv("ASAN_OPTIONS");
  const std::string opts = std::string(o ? o : "") + ":quarantine_size_mb=0";
  ::setenv("ASAN_OPTIONS", opts.c_str(), 1);
#endif
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> a;
    a.reserve(argv.size() + 1);
    for (const std::string& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::execv(a[0], a.data());
    ::_exit(127);
  }
  int status = 0;
  struct rusage ru {};
  if (::wait4(pid, &status, 0, &ru) != pid) return -1;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return -2;
  return ru.ru_maxrss;
}

// The commands hold a few fixed buffers, not the model: a model 4.7x as
// large (13.5 MB -> 63 MB of weights) moves each command's peak RSS by less
// than 24 MiB (the old `shard` held the model in f32 and the shards: its
// peak grew by 2x the model, ~100 MB here).
TEST(CkptStream, PeakMemoryDoesNotGrowWithTheModel) {
  TempDir d;
  const std::string bin = TESSERA_BIN;
  std::vector<long> peaks[2];
  for (int k = 0; k < 2; ++k) {
    const ModelConfig c = gpt2_config(4096, 64, 384, k == 0 ? 1 : 8, 8);
    const std::string dir = d.file(std::to_string(k));
    fs::create_directories(dir);
    write_big(dir + "/m.safetensors", c);
    peaks[k].push_back(
        child_peak_kib({bin, "ckpt", "shard", "--tp", "4", "--out", dir + "/s", dir + "/m.safetensors"}));
    peaks[k].push_back(
        child_peak_kib({bin, "ckpt", "reshard", "--tp", "2", "--pp", "1", "--out", dir + "/r", dir + "/s"}));
    peaks[k].push_back(child_peak_kib({bin, "ckpt", "consolidate", "--out", dir + "/b.safetensors", dir + "/r"}));
    peaks[k].push_back(
        child_peak_kib({bin, "ckpt", "consolidate", "--max-shard-size", "10MB", "--out", dir + "/hf", dir + "/r"}));
  }
  const char* what[] = {"shard", "reshard", "consolidate", "consolidate --max-shard-size"};
  for (size_t i = 0; i < peaks[0].size(); ++i) {
    ASSERT_GT(peaks[0][i], 0) << what[i];
    ASSERT_GT(peaks[1][i], 0) << what[i];
    EXPECT_LT(peaks[1][i] - peaks[0][i], 24 * 1024)
        << what[i] << ": " << peaks[0][i] << " KiB -> " << peaks[1][i] << " KiB";
  }
}

// ---- the pieces underneath ----

TEST(CkptStream, IncrementalSha256AndSeveralFilesAtOnce) {
  TempDir d;
  std::string text;
  for (int i = 0; i < 100000; ++i) text += static_cast<char>('a' + i % 23);
  Sha256 h;
  for (size_t at = 0; at < text.size(); at += 777) h.update(text.data() + at, std::min<size_t>(777, text.size() - at));
  EXPECT_EQ(h.hex_digest(), sha256_hex(text));
  std::vector<std::string> shas;
  const std::vector<std::string> paths = {d.file("x"), d.file("y"), d.file("z")};
  write_files_atomic(
      paths,
      [&](const std::vector<FileSink*>& s) {
        for (size_t at = 0; at < text.size(); at += 1000)
          for (size_t k = 0; k < s.size(); ++k)
            s[k]->write(text.data() + at, std::min<size_t>(1000, text.size() - at) / (k + 1));
      },
      &shas);
  ASSERT_EQ(shas.size(), 3u);
  for (size_t k = 0; k < 3; ++k) EXPECT_EQ(shas[k], sha256_file_hex(paths[k])) << k;
  EXPECT_EQ(testing::read_bytes(paths[0]), text);
  // A failing fill leaves none of the files.
  EXPECT_THROW(write_files_atomic({d.file("p"), d.file("q")},
                                  [&](const std::vector<FileSink*>& s) {
                                    s[1]->write("abc");
                                    throw Error("stop");
                                  }),
               Error);
  EXPECT_FALSE(fs::exists(d.file("p")));
  EXPECT_FALSE(fs::exists(d.file("q")));
}

// A disk that fills after 1 MiB: the background thread's IoError reaches the
// caller unchanged and the temp file is removed.
class FullDiskOps : public FileOps {
 public:
  ssize_t write(int fd, const void* data, size_t bytes) override {
    if (written_ + bytes > (1u << 20)) {
      errno = ENOSPC;
      return -1;
    }
    written_ += bytes;
    return FileOps::write(fd, data, bytes);
  }

 private:
  size_t written_ = 0;
};

TEST(CkptStream, BackgroundWriterReportsTheSinksError) {
  TempDir d;
  FullDiskOps ops;
  AtomicWriteOptions o;
  o.ops = &ops;
  std::vector<char> block(100000, 'x');
  try {
    write_file_atomic(
        d.file("f"),
        [&](FileSink& s) {
          BackgroundWriter bw(2, 1 << 16);
          const size_t out = bw.add(&s);
          for (int i = 0; i < 100; ++i) bw.write(out, block.data(), block.size());
          bw.drain();
        },
        o);
    ADD_FAILURE() << "no IoError";
  } catch (const IoError& e) {
    EXPECT_EQ(e.os_error(), ENOSPC);
    EXPECT_NE(std::string(e.what()).find(d.file("f")), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_empty(d.path()));
  // And the bytes of a good run arrive in order.
  write_file_atomic(d.file("g"), [&](FileSink& s) {
    BackgroundWriter bw(2, 4096);
    const size_t a = bw.add(&s);
    for (int i = 0; i < 5000; ++i) bw.write(a, std::to_string(i).data(), std::to_string(i).size());
    bw.zeros(a, 3);
    bw.drain();
  });
  std::string want;
  for (int i = 0; i < 5000; ++i) want += std::to_string(i);
  want += std::string(3, '\0');
  EXPECT_TRUE(testing::read_bytes(d.file("g")) == want);
}

}  // namespace
}  // namespace tessera::parallel::checkpoint
