// Finite-difference gradient checks: every kernel's backward against its
// forward, and every parameter of a small GPT (each layer's weights and,
// through them, every activation gradient) against the loss, relative to the
// gradient's size within 0.1% (so a gradient 1% off fails).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "parallel/layers/cross_entropy.h"
#include "parallel/models/gpt/gpt_model.h"
#include "parallel/optim/optimizer.h"
#include "runtime/device.h"
#include "runtime/kernels.h"

namespace tessera {
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}

// Checks the directional derivative of f at x along a random direction
// against <grad, dir> and a few single coordinates.
void check_grad(const std::string& what, std::vector<float>& x, const std::function<double()>& f,
                const std::vector<float>& grad, float eps = 1e-2f, double tol = 2e-3) {
  ASSERT_EQ(x.size(), grad.size());
  auto dir = randn(x.size(), 99);
  std::vector<float> x0 = x;
  for (size_t i = 0; i < x.size(); ++i) x[i] = x0[i] + eps * dir[i];
  double fp = f();
  for (size_t i = 0; i < x.size(); ++i) x[i] = x0[i] - eps * dir[i];
  double fm = f();
  x = x0;
  double fd = (fp - fm) / (2 * eps);
  double an = dot(grad, dir);
  EXPECT_NEAR(fd, an, tol * std::max(1.0, std::abs(an))) << what << " directional";
  for (size_t i : {size_t{0}, x.size() / 2, x.size() - 1}) {
    x[i] = x0[i] + eps;
    double a = f();
    x[i] = x0[i] - eps;
    double b = f();
    x = x0;
    EXPECT_NEAR((a - b) / (2 * eps), grad[i], tol * std::max(1.0, std::abs(double(grad[i]))))
        << what << " [" << i << "]";
  }
}

TEST(GradCheck, LayerNorm) {
  const int rows = 5, cols = 16, n = rows * cols;
  auto x = randn(n, 1), gamma = randn(cols, 2), beta = randn(cols, 3), w = randn(n, 4);
  std::vector<float> y(n), mean(rows), rstd(rows);
  auto f = [&]() {
    kern::layernorm_forward(nullptr, x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(), rows,
                            cols, 1e-5f);
    return dot(y, w);
  };
  f();
  std::vector<float> dx(n, 0.f), dg(cols, 0.f), db(cols, 0.f);
  kern::layernorm_backward(nullptr, w.data(), x.data(), gamma.data(), mean.data(), rstd.data(), dx.data(), dg.data(),
                           db.data(), rows, cols);
  check_grad("layernorm dx", x, f, dx);
  check_grad("layernorm dgamma", gamma, f, dg);
  check_grad("layernorm dbeta", beta, f, db);
}

TEST(GradCheck, Gelu) {
  const int n = 64;
  auto x = randn(n, 5, 2.f), w = randn(n, 6);
  std::vector<float> y(n), dx(n);
  auto f = [&]() {
    kern::gelu_forward(nullptr, x.data(), y.data(), n);
    return dot(y, w);
  };
  // Spot value: gelu_tanh(1) = 0.8411920.
  float one = 1.f, out = 0;
  kern::gelu_forward(nullptr, &one, &out, 1);
  EXPECT_NEAR(out, 0.841192, 1e-6);
  kern::gelu_backward(nullptr, w.data(), x.data(), dx.data(), n);
  check_grad("gelu", x, f, dx, 1e-3f);
}

TEST(GradCheck, CausalSoftmax) {
  const int t = 7, n = t * t;
  auto s = randn(n, 7), w = randn(n, 8);
  std::vector<float> p(n);
  auto f = [&]() {
    p = s;
    kern::causal_softmax_forward(p.data(), t, t, 0.5f);
    return dot(p, w);
  };
  f();
  for (int i = 0; i < t; ++i) {
    double sum = 0;
    for (int j = 0; j < t; ++j) {
      sum += p[i * t + j];
      if (j > i) {
        EXPECT_EQ(p[i * t + j], 0.f);
      }
    }
    EXPECT_NEAR(sum, 1.0, 1e-6);
  }
  std::vector<float> d = w;
  kern::causal_softmax_backward(p.data(), d.data(), t, t, 0.5f);
  for (int i = 0; i < t; ++i)
    for (int j = i + 1; j < t; ++j) d[i * t + j] = 0;  // masked scores have no gradient
  check_grad("softmax", s, f, d);
}

TEST(GradCheck, CrossEntropy) {
  Device dev(DeviceSpec::preset("test-core"));
  auto ps = parallel::layers::serial_state(&dev);
  const int rows = 4, v = 11, n = rows * v;
  auto logits = randn(n, 9, 3.f);
  std::vector<int32_t> tgt{0, 3, 10, 5};
  std::vector<float> loss(rows), scratch(size_t{3} * rows), work, tmp;
  auto f = [&]() {
    tmp = logits;
    parallel::layers::vocab_parallel_cross_entropy(ps, tmp.data(), rows, v, v, 0, tgt.data(), false, 0, loss.data(),
                                                   scratch.data());
    double s = 0;
    for (float l : loss) s += l;
    return s;
  };
  // Row 0 by hand: logsumexp - logit[target].
  f();
  double m = -1e30, se = 0;
  for (int j = 0; j < v; ++j) m = std::max(m, double(logits[j]));
  for (int j = 0; j < v; ++j) se += std::exp(logits[j] - m);
  EXPECT_NEAR(loss[0], std::log(se) + m - logits[0], 1e-5);
  work = logits;
  parallel::layers::vocab_parallel_cross_entropy(ps, work.data(), rows, v, v, 0, tgt.data(), true, 1.f, loss.data(),
                                                 scratch.data());
  check_grad("cross-entropy", logits, f, work);
}

// Central difference of f along d at step h, refined by Richardson
// extrapolation ((4 D(h/2) - D(h)) / 3 cancels the h^2 term), so the step can
// be large enough that float rounding of the loss stays small beside it.
double directional(const std::function<double(double)>& f, double h) {
  auto d = [&](double s) { return (f(s) - f(-s)) / (2 * s); };
  return (4 * d(h / 2) - d(h)) / 3;
}

// Whole model, every parameter tensor: the directional derivative of the loss
// along the tensor's own gradient (where it is largest: |g|) and along a
// random unit direction, each against backward, *relative* to |g| within
// kRelTol. The parameters are drawn well away from init (N(0, 0.3), LayerNorm
// gains around 1) so that no tensor's gradient is tiny next to the float
// rounding of the loss. A gradient 1% off fails: that is checked too.
constexpr double kRelTol = 1e-3;  // measured errors here: up to 1.1e-4

TEST(GradCheck, GptEveryParameter) {
  Device dev(DeviceSpec::preset("test-core"));
  auto ps = parallel::layers::serial_state(&dev);
  parallel::ModelConfig cfg;
  cfg.family = "gpt";
  cfg.vocab = 13;
  cfg.max_seq = 6;
  cfg.hidden = 8;
  cfg.layers = 2;
  cfg.heads = 2;
  parallel::models::gpt::GptModel model(cfg, ps);
  parallel::optim::DistributedOptimizer opt(ps, model.parameters_in_grad_order(), {});
  model.init(5);
  uint32_t seed = 100;
  for (parallel::layers::Parameter* p : model.parameters()) {
    const bool gain = p->name.find("ln_") != std::string::npos && p->name.find(".weight") != std::string::npos;
    auto r = randn(static_cast<size_t>(p->numel()), seed++, 0.3f);
    for (int64_t i = 0; i < p->numel(); ++i) p->value[i] = (gain ? 1.f : 0.f) + r[static_cast<size_t>(i)];
  }
  const int batch = 2, seq = 5, tokens = batch * seq;
  std::vector<int32_t> in(tokens), tg(tokens);
  std::mt19937 g(3);
  for (auto& t : in) t = static_cast<int32_t>(g() % cfg.vocab);
  for (auto& t : tg) t = static_cast<int32_t>(g() % cfg.vocab);
  const float scale = 1.0f / (batch * seq);
  opt.zero_grad();
  model.forward(in.data(), tg.data(), batch, seq, true, scale);
  int ready = 0;
  model.backward([&](parallel::layers::Parameter*) { ++ready; });
  EXPECT_EQ(ready, static_cast<int>(model.parameters().size()));
  for (parallel::layers::Parameter* p : model.parameters()) {
    const size_t n = static_cast<size_t>(p->numel());
    std::vector<float> val(p->value, p->value + n), grad(p->grad, p->grad + n);
    const double gnorm = std::sqrt(dot(grad, grad));
    ASSERT_GT(gnorm, 1e-3) << p->name << ": gradient too small to check relatively";
    std::vector<float> along(n), random = randn(n, 99);
    const double rnorm = std::sqrt(dot(random, random));
    for (size_t i = 0; i < n; ++i) {
      along[i] = static_cast<float>(grad[i] / gnorm);
      random[i] = static_cast<float>(random[i] / rnorm);
    }
    for (const auto* d : {&along, &random}) {
      auto loss_at = [&](double h) {
        for (size_t i = 0; i < n; ++i) p->value[i] = static_cast<float>(val[i] + h * (*d)[i]);
        return model.forward(in.data(), tg.data(), batch, seq, false, 0) * scale;
      };
      const double fd = directional(loss_at, 0.05);
      const double an = dot(grad, *d);
      const char* which = d == &along ? "along its gradient" : "along a random direction";
      EXPECT_LE(std::abs(fd - an), kRelTol * gnorm)
          << p->name << " " << which << ": finite difference " << fd << ", backward " << an << ", |g| " << gnorm;
      // The same check fails for a gradient 1% too large (along it: 1% of |g| off).
      if (d == &along) {
        EXPECT_GT(std::abs(fd - 1.01 * an), kRelTol * gnorm) << p->name << ": check too loose";
      }
    }
    std::copy(val.begin(), val.end(), p->value);
  }
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// Sequences longer than one causal attention block (64 query rows): the
// blocked attention's gradients match finite differences, and it stays
// causal: per-token losses of a prefix do not depend on later tokens.
TEST(GradCheck, GptLongSequenceBlockedAttention) {
  Device dev(DeviceSpec::preset("test-core"));
  auto ps = parallel::layers::serial_state(&dev);
  parallel::ModelConfig cfg;
  cfg.family = "gpt";
  cfg.vocab = 13;
  cfg.max_seq = 160;
  cfg.hidden = 8;
  cfg.layers = 1;
  cfg.heads = 2;
  parallel::models::gpt::GptModel model(cfg, ps);
  parallel::optim::DistributedOptimizer opt(ps, model.parameters_in_grad_order(), {});
  model.init(11);
  const auto params = model.parameters();
  parallel::layers::Parameter* qkv = params[4];  // transformer.h.0.attn.c_attn.weight [C, 3C]
  ASSERT_EQ(qkv->name, "transformer.h.0.attn.c_attn.weight");
  // Large q/k weights so attention is peaked and every block of dS matters.
  for (int64_t i = 0; i < qkv->numel(); ++i) qkv->value[i] *= 40.f;
  const int seq = 150;
  std::vector<int32_t> in(seq), tg(seq);
  std::mt19937 g(5);
  for (auto& t : in) t = static_cast<int32_t>(g() % cfg.vocab);
  for (auto& t : tg) t = static_cast<int32_t>(g() % cfg.vocab);
  const float scale = 1.0f / seq;
  opt.zero_grad();
  model.forward(in.data(), tg.data(), 1, seq, true, scale);
  model.backward(nullptr);
  // Directional derivatives along the q, k and v columns separately, each
  // against central finite differences (relative 2%).
  const int64_t c = cfg.hidden;
  std::vector<float> val(qkv->value, qkv->value + qkv->numel()), grad(qkv->grad, qkv->grad + qkv->numel());
  auto dir = randn(val.size(), 17);
  for (int part = 0; part < 3; ++part) {
    std::vector<float> d(val.size(), 0.f);
    for (int64_t r = 0; r < c; ++r)
      for (int64_t j = part * c; j < (part + 1) * c; ++j) d[r * 3 * c + j] = dir[r * 3 * c + j];
    auto loss_at = [&](float eps) {
      for (size_t i = 0; i < val.size(); ++i) qkv->value[i] = val[i] + eps * d[i];
      return model.forward(in.data(), tg.data(), 1, seq, false, 0) * scale;
    };
    const float eps = 1e-2f;
    double fd = (loss_at(eps) - loss_at(-eps)) / (2 * eps);
    double an = dot(grad, d);
    EXPECT_GT(std::abs(an), 1e-4) << "part " << part << " has no gradient to check";
    EXPECT_NEAR(fd, an, 2e-2 * std::abs(an) + 1e-4) << "q/k/v part " << part;
  }
  std::copy(val.begin(), val.end(), qkv->value);
  // Causality across blocks: the first 100 positions alone give the same per-token losses.
  model.forward(in.data(), tg.data(), 1, seq, false, 0);
  std::vector<float> full(model.token_losses(), model.token_losses() + seq);
  model.forward(in.data(), tg.data(), 1, 100, false, 0);
  for (int i = 0; i < 100; ++i) EXPECT_NEAR(model.token_losses()[i], full[i], 1e-5f * std::abs(full[i])) << i;
}

}  // namespace
}  // namespace tessera
