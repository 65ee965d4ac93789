// bench_gemm: bf16 GEMM (runtime/bf16.h, fp32 accumulation) against OpenBLAS
// sgemm at the trainer's GEMM shapes, measured in the same run in
// alternating rounds (sgemm first in odd rounds, bf16 first in even ones),
// single-threaded. Prints each shape's FLOP/s per round and the median ratio.
// Usage: bench_gemm [--family gpt|llama] [--rows N] [--rounds R] [--seconds S]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <exception>
#include <vector>

#include "examples/gpt/sgemm_bench.h"
#include "parallel/models/causal_lm.h"
#include "runtime/bf16.h"
#include "runtime/kernels.h"

using namespace tessera;

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
}  // namespace

int run(int argc, char** argv) {
  CLI::App app{"bf16 GEMM against sgemm at the trainer's GEMM shapes"};
  std::string family = "gpt";
  int64_t rows = int64_t{8} * 256;  // train_gpt's default micro-batch x seq
  int rounds = 3;
  double seconds = 0.5;
  app.add_option("--family", family, "the default model of this family (gpt: train_gpt's)")
      ->check(CLI::IsMember({"gpt", "llama"}));
  app.add_option("--rows", rows, "tokens per micro-batch")->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "alternating rounds")->check(CLI::PositiveNumber);
  app.add_option("--seconds", seconds, "seconds per shape and dtype per round")->check(CLI::PositiveNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  kern::default_blas_threads();
  parallel::ModelConfig cfg = parallel::models::default_train_model();
  if (family == "llama") {
    cfg.family = "llama";
    cfg.kv_heads = 2;
    cfg.ffn_hidden = 0;
  }
  parallel::models::complete_model_config(cfg);
  const std::vector<gpt::GemmShape> shapes = gpt::model_gemm_shapes(cfg, rows);
  std::printf("bench_gemm: %s model hidden %lld, %lld rows, bf16 backend %s, %d rounds\n", family.c_str(),
              static_cast<long long>(cfg.hidden), static_cast<long long>(rows),
              bf16::gemm_backend_name(bf16::gemm_backend()).c_str(), rounds);
  std::vector<std::vector<double>> ratio(shapes.size() + 1);
  std::vector<std::vector<double>> f32(shapes.size() + 1), b16(shapes.size() + 1);
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i <= shapes.size(); ++i) {
      // The last entry: all shapes together (the trainer's mix).
      const std::vector<gpt::GemmShape> one = i < shapes.size() ? std::vector<gpt::GemmShape>{shapes[i]} : shapes;
      double s = 0, b = 0;
      if (r % 2 == 0) {
        s = gpt::measure_gemm_flops(one, DType::F32, seconds);
        b = gpt::measure_gemm_flops(one, DType::BF16, seconds);
      } else {
        b = gpt::measure_gemm_flops(one, DType::BF16, seconds);
        s = gpt::measure_gemm_flops(one, DType::F32, seconds);
      }
      f32[i].push_back(s);
      b16[i].push_back(b);
      ratio[i].push_back(b / s);
    }
  }
  std::printf("%-14s %6s %6s %6s %12s %12s %8s\n", "gemm", "m", "n", "k", "sgemm GF/s", "bf16 GF/s", "ratio");
  for (size_t i = 0; i <= shapes.size(); ++i) {
    const bool all = i == shapes.size();
    const gpt::GemmShape s = all ? gpt::GemmShape{"all", false, false, false, 0, 0, 0} : shapes[i];
    std::printf("%-14s %6lld %6lld %6lld %12.1f %12.1f %8.2f\n", s.what.c_str(), static_cast<long long>(s.m),
                static_cast<long long>(s.n), static_cast<long long>(s.k), median(f32[i]) / 1e9, median(b16[i]) / 1e9,
                median(ratio[i]));
  }
  std::printf("bench_gemm: bf16 / sgemm FLOP/s over all shapes: %.2f (median of %d rounds)\n", median(ratio.back()),
              rounds);
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gemm: %s\n", e.what());
    return 1;
  }
}
