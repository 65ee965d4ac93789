// llama_bench: forward + backward of a Llama and a GPT-2 of the same width on
// one core (one BLAS thread), each reported as a fraction of sgemm FLOP/s at
// its own GEMM shapes (the projections and the LM head at the run's token
// count, in the layout the model multiplies them: Conv1D [in, out] for GPT,
// nn.Linear [out, in] for Llama) measured in the same run, between the
// steps (right before and after each, averaged). Models alternate (GPT step, sgemm, Llama step, sgemm, ...) so load
// from other processes falls on both alike; the medians are reported.
//
// FLOPs per step = tokens x (6 x matrix parameters (LM head included) +
// 6 x layers x seq x q_dim (causal attention: Q K^T and P V over seq / 2
// keys on average, forward and backward)), the same formula for both.
//
// Usage: llama_bench [--hidden 512] [--layers 4] [--heads 8] [--kv-heads 2]
//   [--ffn 0 (Llama: 8/3 hidden rounded up to 64, GPT: 4 hidden)] [--seq 256]
//   [--batch 2] [--vocab 8192] [--steps 9]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "parallel/models/gpt/gpt_model.h"
#include "parallel/models/llama/llama_model.h"
#include "parallel/optim/optimizer.h"
#include "runtime/device.h"
#include "runtime/kernels.h"
#include "runtime/sim_clock.h"

namespace tessera {
namespace {

struct Args {
  int64_t hidden = 512, layers = 4, heads = 8, kv_heads = 2, ffn = 0, seq = 256, batch = 2, vocab = 8192, steps = 9;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "llama_bench: %s\nusage: llama_bench [--hidden N] [--layers N] [--heads N] [--kv-heads N] [--ffn N] "
               "[--seq N] [--batch N] [--vocab N] [--steps N]\n",
               why);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "--help" || f == "-h") usage("forward+backward FLOP/s of Llama vs GPT-2 as fractions of sgemm");
    if (i + 1 >= argc) usage(("flag " + f + " needs a value").c_str());
    char* end = nullptr;
    const long long v = std::strtoll(argv[++i], &end, 10);
    if (*end != '\0' || v < 0) usage(("flag " + f + ": '" + argv[i] + "' is not a non-negative integer").c_str());
    if (f == "--hidden")
      a.hidden = v;
    else if (f == "--layers")
      a.layers = v;
    else if (f == "--heads")
      a.heads = v;
    else if (f == "--kv-heads")
      a.kv_heads = v;
    else if (f == "--ffn")
      a.ffn = v;
    else if (f == "--seq")
      a.seq = v;
    else if (f == "--batch")
      a.batch = v;
    else if (f == "--vocab")
      a.vocab = v;
    else if (f == "--steps")
      a.steps = v;
    else
      usage(("unknown flag " + f).c_str());
  }
  if (a.hidden <= 0 || a.layers <= 0 || a.heads <= 0 || a.kv_heads <= 0 || a.seq <= 0 || a.batch <= 0 || a.vocab <= 0 ||
      a.steps < 2)
    usage("sizes must be positive and --steps at least 2");
  return a;
}

// A projection y = x W of `in` -> `out` features.
struct Proj {
  int64_t in, out;
};

// sgemm FLOP/s over the forward, input-gradient and weight-gradient products
// of every projection, in the model's layout, for at least min_s seconds.
double sgemm_flops(const std::vector<Proj>& shapes, int64_t rows, bool linear_layout, double min_s) {
  int64_t max_elems = 0;
  for (const auto& s : shapes) max_elems = std::max({max_elems, rows * s.in, rows * s.out, s.in * s.out});
  std::vector<float> a(max_elems), b(max_elems), c(max_elems);
  std::mt19937 g(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto* v : {&a, &b, &c})
    for (auto& x : *v) x = u(g);
  auto once = [&]() {
    double flops = 0;
    for (const auto& s : shapes) {
      if (linear_layout) {  // W [out, in]: y = x W^T, dx = dy W, dW += dy^T x
        kern::gemm_raw(false, true, rows, s.out, s.in, 1.f, a.data(), s.in, b.data(), s.in, 0.f, c.data(), s.out);
        kern::gemm_raw(false, false, rows, s.in, s.out, 1.f, a.data(), s.out, b.data(), s.in, 0.f, c.data(), s.in);
        kern::gemm_raw(true, false, s.out, s.in, rows, 1.f, a.data(), s.out, b.data(), s.in, 1.f, c.data(), s.in);
      } else {  // W [in, out]: y = x W, dx = dy W^T, dW += x^T dy
        kern::gemm_raw(false, false, rows, s.out, s.in, 1.f, a.data(), s.in, b.data(), s.out, 0.f, c.data(), s.out);
        kern::gemm_raw(false, true, rows, s.in, s.out, 1.f, a.data(), s.out, b.data(), s.out, 0.f, c.data(), s.in);
        kern::gemm_raw(true, false, s.in, s.out, rows, 1.f, a.data(), s.in, b.data(), s.out, 1.f, c.data(), s.out);
      }
      flops += 3 * 2.0 * rows * s.in * s.out;
    }
    return flops;
  };
  once();  // warm-up
  double flops = 0;
  Stopwatch sw;
  do flops += once();
  while (sw.seconds() < min_s);
  return flops / sw.seconds();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One model under test: its parameters bound, a step = zero_grad + forward + backward.
struct Runner {
  std::string name;
  std::vector<Proj> shapes;
  bool linear_layout = false;
  double flops_per_step = 0;
  std::function<void()> step;
  std::vector<double> step_s, fraction;
};

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  using namespace tessera;
  const Args a = parse(argc, argv);
  kern::default_blas_threads();
  const int64_t c = a.hidden, tokens = a.batch * a.seq;
  const int64_t llama_ffn = a.ffn > 0 ? a.ffn : (8 * c / 3 + 63) / 64 * 64;
  const int64_t gpt_ffn = 4 * c;  // GPT-2's MLP is 4 x hidden
  // trn1-core: 16 GiB of device memory (test-core's 256 MiB is too small for these activations).
  Device dev_g(DeviceSpec::preset("trn1-core")), dev_l(DeviceSpec::preset("trn1-core"));
  auto ps_g = parallel::layers::serial_state(&dev_g);
  auto ps_l = parallel::layers::serial_state(&dev_l);

  parallel::ModelConfig gc;
  gc.name = "bench-gpt2";
  gc.family = "gpt";
  gc.vocab = static_cast<int>(a.vocab);
  gc.max_seq = static_cast<int>(a.seq);
  gc.hidden = static_cast<int>(c);
  gc.layers = static_cast<int>(a.layers);
  gc.heads = gc.kv_heads = static_cast<int>(a.heads);
  gc.ffn_hidden = static_cast<int>(gpt_ffn);
  parallel::models::gpt::GptModel gpt(gc, ps_g);
  parallel::optim::DistributedOptimizer opt_g(ps_g, gpt.parameters_in_grad_order(), {});
  gpt.init(1);

  parallel::ModelConfig lc;
  lc.name = "bench-llama";
  lc.family = "llama";
  lc.layers = static_cast<int>(a.layers);
  lc.hidden = static_cast<int>(c);
  lc.heads = static_cast<int>(a.heads);
  lc.kv_heads = static_cast<int>(a.kv_heads);
  lc.ffn_hidden = static_cast<int>(llama_ffn);
  lc.vocab = static_cast<int>(a.vocab);
  lc.max_seq = static_cast<int>(a.seq);
  lc.rope_theta = 5e5;
  parallel::models::llama::LlamaModel llama(lc, ps_l);
  parallel::optim::DistributedOptimizer opt_l(ps_l, llama.parameters_in_grad_order(), {});
  llama.init(1);

  std::vector<int32_t> in(tokens), tg(tokens);
  std::mt19937 g(7);
  for (auto& t : in) t = static_cast<int32_t>(g() % a.vocab);
  for (auto& t : tg) t = static_cast<int32_t>(g() % a.vocab);
  const float scale = 1.0f / static_cast<float>(tokens);

  const int64_t kvd = lc.kv_dim(), qd = lc.q_dim();
  std::vector<Runner> runners(2);
  Runner& rg = runners[0];
  rg.name = "gpt2";
  rg.shapes = {{c, 3 * c}, {c, c}, {c, gpt_ffn}, {gpt_ffn, c}};
  rg.step = [&]() {
    opt_g.zero_grad();
    gpt.forward(in.data(), tg.data(), a.batch, a.seq, true, scale);
    gpt.backward(nullptr);
  };
  Runner& rl = runners[1];
  rl.name = "llama";
  rl.linear_layout = true;
  rl.shapes = {{c, qd}, {c, kvd}, {c, kvd}, {qd, c}, {c, llama_ffn}, {c, llama_ffn}, {llama_ffn, c}};
  rl.step = [&]() {
    opt_l.zero_grad();
    llama.forward(in.data(), tg.data(), a.batch, a.seq, true, scale);
    llama.backward(nullptr);
  };
  for (Runner* r : {&rg, &rl}) {
    double per_layer = 0;
    for (const Proj& p : r->shapes) per_layer += static_cast<double>(p.in * p.out);
    const double matrix_params = a.layers * per_layer + static_cast<double>(a.vocab * c);  // + LM head
    r->flops_per_step = static_cast<double>(tokens) * (6.0 * matrix_params + 6.0 * a.layers * a.seq * qd);
    // The LM head is a GEMM of the step too: the yardstick includes it.
    r->shapes.push_back({c, a.vocab});
  }
  std::printf(
      "llama_bench: hidden %lld, layers %lld, heads %lld (llama kv_heads %lld), ffn gpt %lld / llama %lld, "
      "vocab %lld, %lld x %lld tokens, 1 BLAS thread\n",
      (long long)c, (long long)a.layers, (long long)a.heads, (long long)a.kv_heads, (long long)gpt_ffn,
      (long long)llama_ffn, (long long)a.vocab, (long long)a.batch, (long long)a.seq);
  for (Runner& r : runners) r.step();  // warm-up: allocates every buffer
  for (int64_t s = 0; s < a.steps; ++s) {
    for (Runner& r : runners) {
      // sgemm right before and right after the step: their mean tracks the
      // load the step ran under.
      const double before = sgemm_flops(r.shapes, tokens, r.linear_layout, 0.3);
      Stopwatch sw;
      r.step();
      const double t = sw.seconds();
      const double sg = 0.5 * (before + sgemm_flops(r.shapes, tokens, r.linear_layout, 0.3));
      r.step_s.push_back(t);
      r.fraction.push_back(r.flops_per_step / t / sg);
    }
  }
  for (const Runner& r : runners) {
    const double t = median(r.step_s);
    std::printf(
        "%-6s %.3f GFLOP/step, median step %.3f s, %.2f GFLOP/s, fraction of sgemm: median %.1f%% (min %.1f%%, "
        "max %.1f%%)\n",
        r.name.c_str(), r.flops_per_step / 1e9, t, r.flops_per_step / t / 1e9, 100 * median(r.fraction),
        100 * *std::min_element(r.fraction.begin(), r.fraction.end()),
        100 * *std::max_element(r.fraction.begin(), r.fraction.end()));
  }
  const double ratio = median(rl.fraction) / median(rg.fraction);
  std::printf("llama / gpt2 fraction: %.3f (target >= 0.90)\n", ratio);
  return 0;
}
