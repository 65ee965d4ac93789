#include "examples/gpt/sgemm_bench.h"

#include <algorithm>
#include <random>
#include <vector>

#include "runtime/kernels.h"
#include "runtime/sim_clock.h"

namespace tessera::gpt {

double measure_sgemm_flops(const parallel::ModelConfig& cfg, int64_t rows, double min_seconds) {
  const int64_t c = cfg.hidden;
  struct Shape {
    int64_t in, out;
  };
  const int64_t q = cfg.q_dim(), kv = cfg.kv_dim(), f = cfg.ffn_hidden;
  // The model's weight shapes: QKV, attention output, the MLP's (gate and up fused for llama), down, the LM head.
  const std::vector<Shape> shapes{{c, q + 2 * kv}, {q, c}, {c, (cfg.gated_mlp() ? 2 : 1) * f}, {f, c}, {c, cfg.vocab}};
  int64_t max_elems = 0;
  for (const auto& s : shapes) max_elems = std::max({max_elems, rows * s.in, rows * s.out, s.in * s.out});
  std::vector<float> a(max_elems), b(max_elems), out(max_elems);
  std::mt19937 g(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto* v : {&a, &b, &out})
    for (auto& x : *v) x = u(g);
  auto run_all = [&]() {
    double flops = 0;
    for (const auto& s : shapes) {
      // y = x W; dx = dy W^T; dW = x^T dy
      kern::gemm_raw(false, false, rows, s.out, s.in, 1.f, a.data(), s.in, b.data(), s.out, 0.f, out.data(), s.out);
      kern::gemm_raw(false, true, rows, s.in, s.out, 1.f, a.data(), s.out, b.data(), s.out, 0.f, out.data(), s.in);
      kern::gemm_raw(true, false, s.in, s.out, rows, 1.f, a.data(), s.in, b.data(), s.out, 1.f, out.data(), s.out);
      flops += 3 * 2.0 * rows * s.in * s.out;
    }
    return flops;
  };
  run_all();  // warm-up: page in the buffers, let OpenBLAS pick its kernels
  double flops = 0;
  Stopwatch sw;
  do {
    flops += run_all();
  } while (sw.seconds() < min_seconds);
  return flops / sw.seconds();
}

}  // namespace tessera::gpt
