#include "examples/gpt/sgemm_bench.h"

#include <algorithm>
#include <random>
#include <vector>

#include "runtime/bf16.h"
#include "runtime/error.h"
#include "runtime/kernels.h"
#include "runtime/sim_clock.h"

namespace tessera::gpt {

std::vector<GemmShape> model_gemm_shapes(const parallel::ModelConfig& cfg, int64_t rows) {
  const int64_t c = cfg.hidden;
  const int64_t q = cfg.q_dim(), kv = cfg.kv_dim(), f = cfg.ffn_hidden;
  struct W {
    const char* name;
    int64_t in, out;
  };
  // The model's weight shapes: QKV, attention output, the MLP's (gate and up fused for llama), down, the LM head.
  const std::vector<W> weights{{"qkv", c, q + 2 * kv},
                               {"attn out", q, c},
                               {"mlp up", c, (cfg.gated_mlp() ? 2 : 1) * f},
                               {"mlp down", f, c},
                               {"lm head", c, cfg.vocab}};
  std::vector<GemmShape> v;
  for (const W& w : weights) {
    // y = x W; dx = dy W^T; dW += x^T dy
    v.push_back({std::string(w.name) + " NN", false, false, false, rows, w.out, w.in});
    v.push_back({std::string(w.name) + " NT", false, true, false, rows, w.in, w.out});
    v.push_back({std::string(w.name) + " TN", true, false, true, w.in, w.out, rows});
  }
  return v;
}

double measure_gemm_flops(const std::vector<GemmShape>& shapes, DType dtype, double min_seconds) {
  TESSERA_ARG_CHECK(dtype == DType::F32 || dtype == DType::BF16, "GEMM benchmark of ", dtype_name(dtype));
  int64_t max_elems = 0;
  for (const auto& s : shapes) max_elems = std::max({max_elems, s.m * s.k, s.k * s.n, s.m * s.n});
  std::vector<float> a(static_cast<size_t>(max_elems)), b(a.size()), out(a.size());
  std::mt19937 g(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto* v : {&a, &b, &out})
    for (auto& x : *v) x = u(g);
  auto run_all = [&]() {
    double flops = 0;
    for (const auto& s : shapes) {
      const int64_t lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
      const float beta = s.accumulate ? 1.f : 0.f;
      if (dtype == DType::F32) {
        kern::gemm_raw(s.ta, s.tb, s.m, s.n, s.k, 1.f, a.data(), lda, b.data(), ldb, beta, out.data(), s.n);
      } else {
        bf16::gemm(s.ta, s.tb, s.m, s.n, s.k, 1.f, a.data(), lda, b.data(), ldb, beta, out.data(), s.n);
      }
      flops += 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
    }
    return flops;
  };
  run_all();  // warm-up: page in the buffers, let the library pick its kernels
  double flops = 0;
  Stopwatch sw;
  do {
    flops += run_all();
  } while (sw.seconds() < min_seconds);
  return flops / sw.seconds();
}

double measure_sgemm_flops(const parallel::ModelConfig& cfg, int64_t rows, double min_seconds) {
  return measure_gemm_flops(model_gemm_shapes(cfg, rows), DType::F32, min_seconds);
}

}  // namespace tessera::gpt
