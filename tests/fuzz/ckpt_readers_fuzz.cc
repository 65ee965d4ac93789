// libFuzzer target over the checkpoint readers (issue 13, item 7): the
// safetensors reader, the Hugging Face index reader and the `tessera ckpt`
// manifest reader. The first input byte picks the reader; the rest is the
// file. Built with clang (-fsanitize=fuzzer,address) by ckpt_readers_fuzz.sh.
//
// Every input must end in success or a tessera::Error (FormatError,
// InvalidArgument); anything else (a crash, std::bad_alloc, an ASan report,
// a hang caught by -timeout) is a finding.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "parallel/checkpoint/ckpt_tool.h"
#include "parallel/models/families.h"
#include "parallel/models/gpt/hf.h"
#include "runtime/error.h"
#include "runtime/files.h"

namespace fs = std::filesystem;
namespace ck = tessera::parallel::checkpoint;
namespace gpt = tessera::parallel::models::gpt;

namespace {

std::string g_dir;  // per-process work directory

void put(const std::string& path, const uint8_t* p, size_t n) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(p), static_cast<std::streamsize>(n));
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void seed(const std::string& dir, const std::string& name, char mode, const std::string& body) {
  std::ofstream(dir + "/" + name, std::ios::binary) << mode << body;
}

// A tiny GPT-2 (2 layers), its tp-2 shard directory and a 2-file HF sharded copy.
void make_fixtures() {
  const tessera::parallel::ModelConfig c = gpt::gpt2_config(11, 4, 8, 2, 2);
  std::mt19937 gen(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<std::pair<std::string, tessera::Tensor>> t;
  for (const std::string& name : gpt::gpt2_tensor_names(c)) {
    tessera::Shape s = gpt::gpt2_tensor_shape(c, name);
    std::vector<float> v(static_cast<size_t>(tessera::shape_numel(s)));
    for (float& x : v) x = nd(gen);
    t.emplace_back(name, tessera::Tensor::from_vector(v, s, tessera::DType::F32));
  }
  gpt::write_gpt2_safetensors(g_dir + "/model.safetensors", c, t);
  ck::ShardOptions o;
  o.tp = 2;
  ck::shard(g_dir + "/model.safetensors", g_dir + "/shards", o, tessera::parallel::models::model_families());
  fs::create_directories(g_dir + "/hf");
  ck::write_sharded_safetensors(g_dir + "/hf", t, 600, {{"format", "pt"}});
}

void drain(const ck::TensorSource& src) {
  for (const std::string& n : src.names()) {
    tessera::Tensor x = src.get(n);
    (void)x;
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  char tmpl[] = "/tmp/tessera_fuzz_XXXXXX";
  if (!::mkdtemp(tmpl)) std::abort();
  g_dir = tmpl;
  std::atexit([] {
    std::error_code ec;
    fs::remove_all(g_dir, ec);
  });
  make_fixtures();
  // TESSERA_FUZZ_SEEDS=DIR: write the seed corpus (valid files of each kind) there.
  if (const char* s = std::getenv("TESSERA_FUZZ_SEEDS")) {
    fs::create_directories(s);
    seed(s, "safetensors", 0, slurp(g_dir + "/model.safetensors"));
    seed(s, "shard", 0, slurp(g_dir + "/shards/" + ck::rank_file_name(0, 1, 0)));
    seed(s, "index", 1, slurp(g_dir + "/hf/model.safetensors.index.json"));
    seed(s, "manifest", 2, slurp(g_dir + "/shards/manifest.json"));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int mode = data[0] % 3;
  ++data;
  --size;
  try {
    if (mode == 0) {
      const std::string p = g_dir + "/in.safetensors";
      put(p, data, size);
      ck::SafetensorsReader r(p);
      drain(r);
    } else if (mode == 1) {
      // The index beside the two valid shards of hf/.
      const std::string p = g_dir + "/hf/fuzz.index.json";
      put(p, data, size);
      drain(*ck::open_safetensors(p));
    } else {
      // A manifest over the valid shard files: a lying manifest must be refused.
      const std::string dir = g_dir + "/m";
      fs::create_directories(dir);
      for (int r = 0; r < 2; ++r) {
        const std::string f = ck::rank_file_name(0, r, 0);
        if (!fs::exists(dir + "/" + f)) fs::copy_file(g_dir + "/shards/" + f, dir + "/" + f);
      }
      put(dir + "/manifest.json", data, size);
      // The marker matches the fuzzed manifest, so the manifest's own checks are what is fuzzed.
      const std::string text(reinterpret_cast<const char*>(data), size);
      tessera::write_file_atomic(dir + "/done",
                                 "{\"manifest_sha256\": \"" + tessera::sha256_hex(text) + "\", \"step\": 0}\n");
      const std::string out = g_dir + "/back.safetensors";
      fs::remove(out);
      ck::consolidate_path(dir, out, 0, false, false, tessera::parallel::models::model_families());
    }
  } catch (const tessera::Error&) {
  }
  return 0;
}
