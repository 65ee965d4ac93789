// gpt2_random: writes a GPT-2-shaped f32 safetensors file of random weights,
// streaming (a few MiB of memory whatever the size), for benchmarks of
// `tessera ckpt` on checkpoints too large to build in memory
// (scripts/bench_ckpt.sh).
//
//   build/bin/gpt2_random --vocab 50257 --seq 1024 --hidden 2048 --layers 9 --heads 16 --out FILE [--seed S]
//
// Values are uniform in [-0.05, 0.05) from a counter-based generator (the
// same file for the same flags). The file is what write_gpt2_safetensors
// writes: Hugging Face names in order, metadata format=pt and the config.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "parallel/checkpoint/safetensors.h"
#include "parallel/models/gpt/hf.h"
#include "runtime/files.h"

namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s --vocab V --seq T --hidden C --layers L --heads H --out FILE [--seed S]\n"
               "  all sizes positive; H divides C\n",
               argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tessera::parallel::checkpoint;
  using namespace tessera::parallel::models::gpt;
  int64_t vocab = 0, positions = 0, hidden = 0, layers = 0, heads = 0;
  std::string out;
  uint64_t seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage(argv[0]);
    const char* v = argv[++i];
    char* end = nullptr;
    const long long n = std::strtoll(v, &end, 10);
    const bool num = end && *end == '\0' && n > 0;
    if (a != "--out" && !num) return usage(argv[0]);  // every other flag takes a positive number
    if (a == "--out") {
      out = v;
    } else if (a == "--vocab") {
      vocab = n;
    } else if (a == "--seq") {
      positions = n;
    } else if (a == "--hidden") {
      hidden = n;
    } else if (a == "--layers") {
      layers = n;
    } else if (a == "--heads") {
      heads = n;
    } else if (a == "--seed") {
      seed = static_cast<uint64_t>(n);
    } else {
      return usage(argv[0]);
    }
  }
  if (out.empty() || vocab <= 0 || positions <= 0 || hidden <= 0 || layers <= 0 || heads <= 0 || hidden % heads != 0)
    return usage(argv[0]);
  const tessera::parallel::ModelConfig c = gpt2_config(vocab, positions, hidden, layers, heads);
  try {
    std::vector<TensorSpec> specs;
    for (const std::string& name : gpt2_tensor_names(c))
      specs.push_back({name, tessera::DType::F32, gpt2_tensor_shape(c, name)});
    const std::string header = safetensors_header(specs, gpt2_file_metadata(c));
    uint64_t total = 0;
    tessera::write_file_atomic(out, [&](tessera::FileSink& sink) {
      sink.write(header.data(), header.size());
      std::vector<float> buf(size_t{1} << 20);
      uint64_t counter = seed << 40;
      for (const TensorSpec& s : specs) {
        for (uint64_t left = static_cast<uint64_t>(tessera::shape_numel(s.shape)); left > 0;) {
          const size_t n = static_cast<size_t>(std::min<uint64_t>(left, buf.size()));
          for (size_t k = 0; k < n; ++k)
            buf[k] = static_cast<float>(static_cast<double>(splitmix(++counter) >> 11) * 0x1p-53 * 0.1 - 0.05);
          sink.write(buf.data(), n * sizeof(float));
          left -= n;
          total += n * sizeof(float);
        }
      }
    });
    std::printf("wrote %s: GPT-2 %s, %llu bytes of tensor data\n", out.c_str(), gpt2_config_str(c).c_str(),
                static_cast<unsigned long long>(total));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt2_random: %s\n", e.what());
    return 1;
  }
  return 0;
}
