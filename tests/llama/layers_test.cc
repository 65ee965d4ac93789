// The Llama layers against independent oracles and finite differences:
// rotary inverse frequencies (plain and Llama 3's "llama3" scaling), the
// rotation itself, RMSNorm and SwiGLU against values computed by hand (with
// python3's float64 math, formulas from Hugging Face's modeling_llama.py and
// modeling_rope_utils.py); grouped-query attention equal to multi-head
// attention with the K/V heads repeated (repeat_kv); the backward of every
// kernel against central finite differences, relative to the gradient's
// size, each check also shown to fail for a gradient 1% off.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "parallel/layers/attention.h"
#include "parallel/layers/linear.h"
#include "parallel/layers/rotary.h"
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

// f(x) is a scalar; grad its gradient at x. Checks the directional
// derivative along grad / |grad| and along a random unit direction (central
// differences with Richardson extrapolation) against backward, relative to
// |grad| within rel; and that a gradient 1% too large fails the first check.
void check_grad(const std::string& what, std::vector<float>& x, const std::function<double()>& f,
                const std::vector<float>& grad, double h = 1e-2, double rel = 1e-3) {
  ASSERT_EQ(x.size(), grad.size());
  const double gnorm = std::sqrt(dot(grad, grad));
  ASSERT_GT(gnorm, 1e-3) << what << ": gradient too small to check";
  const std::vector<float> x0 = x;
  std::vector<float> along(x.size()), random = randn(x.size(), 99);
  const double rnorm = std::sqrt(dot(random, random));
  for (size_t i = 0; i < x.size(); ++i) {
    along[i] = static_cast<float>(grad[i] / gnorm);
    random[i] = static_cast<float>(random[i] / rnorm);
  }
  for (const auto* d : {&along, &random}) {
    auto at = [&](double s) {
      for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(x0[i] + s * (*d)[i]);
      return f();
    };
    auto cd = [&](double s) { return (at(s) - at(-s)) / (2 * s); };
    const double fd = (4 * cd(h / 2) - cd(h)) / 3;
    x = x0;
    const double an = dot(grad, *d);
    EXPECT_LE(std::abs(fd - an), rel * gnorm) << what
                                              << (d == &along ? " along its gradient"
                                                              : " along a random "
                                                                "direction")
                                              << ": fd " << fd << ", backward " << an;
    if (d == &along) {
      EXPECT_GT(std::abs(fd - 1.01 * an), rel * gnorm) << what << ": check too loose";
    }
  }
}

// ---- oracles ----

TEST(LlamaLayers, RopeInvFreq) {
  // 1 / 10000^(2i / 8), i < 4.
  const std::vector<float> plain = parallel::layers::rope_inv_freq(8, 1e4, {});
  const double want[] = {1.0, 0.1, 0.01, 0.001};
  ASSERT_EQ(plain.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(plain[i], want[i], 1e-6 * want[i]) << i;
  // llama3 with factor 8, low 1, high 4, original 1000: wavelengths 2 pi / f =
  // 6.28 and 62.8 (< 250: kept), 628 (medium: smooth = (1000 / 628.3 - 1) / 3,
  // (1 - smooth) f / 8 + smooth f = 0.002975352507), 6283 (> 1000: f / 8).
  parallel::RopeScaling s;
  s.type = "llama3";
  s.factor = 8;
  s.low_freq_factor = 1;
  s.high_freq_factor = 4;
  s.original_max_position_embeddings = 1000;
  const std::vector<float> scaled = parallel::layers::rope_inv_freq(8, 1e4, s);
  const double want3[] = {1.0, 0.1, 0.002975352507, 0.000125};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(scaled[i], want3[i], 1e-6 * want3[i]) << i;
  EXPECT_THROW(parallel::layers::rope_inv_freq(7, 1e4, {}), InvalidArgument);
}

TEST(LlamaLayers, RopeRotation) {
  // head_dim 4, theta 1e4: inv_freq [1, 0.01]. Position 2 of q = [1, 2, 3, 4]
  // (x1 = [1, 2], x2 = [3, 4]): [x1 cos - x2 sin, x2 cos + x1 sin] with
  // angles [2, 0.02] = [-3.14403912, 1.91960535, -0.339143083, 4.03919736].
  parallel::layers::RotaryEmbedding rope(4, 3, 1e4, {}, nullptr);
  EXPECT_NEAR(rope.cos()[2 * 4 + 0], std::cos(2.0), 1e-7);
  EXPECT_EQ(rope.cos()[2 * 4 + 0], rope.cos()[2 * 4 + 2]);  // halves repeated
  EXPECT_EQ(rope.sin()[2 * 4 + 1], rope.sin()[2 * 4 + 3]);
  std::vector<float> x = {1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4};  // positions 0, 1, 2
  rope.forward(nullptr, x.data(), 4, 3, 3, 1);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(x[i], static_cast<float>(i + 1)) << "position 0 is the identity";
  const double want[] = {-3.14403912, 1.91960535, -0.339143083, 4.03919736};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(x[8 + i], want[i], 1e-6) << i;
  // The backward is the inverse of a rotation: it brings x back.
  rope.backward(nullptr, x.data(), 4, 3, 3, 1);
  for (int i = 0; i < 12; ++i) EXPECT_NEAR(x[i], static_cast<float>(i % 4 + 1), 1e-6) << i;
}

TEST(LlamaLayers, RmsNormValues) {
  // x = [1, 2, 3, 4], w = [1, 0.5, 2, -1], eps 1e-5: rstd = 1 / sqrt(7.5 + 1e-5) = 0.365148128.
  const std::vector<float> x = {1, 2, 3, 4}, w = {1, 0.5f, 2, -1};
  std::vector<float> y(4), rstd(1);
  kern::rmsnorm_forward(nullptr, x.data(), w.data(), y.data(), rstd.data(), 1, 4, 1e-5f);
  EXPECT_NEAR(rstd[0], 0.365148128, 1e-7);
  const double want[] = {0.365148128, 0.365148128, 2.19088877, -1.46059251};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y[i], want[i], 1e-6) << i;
}

TEST(LlamaLayers, SwiGluValues) {
  // silu(g) u = g u / (1 + e^-g): g = [-1, 0, 2], u = [3, 5, -0.5].
  const std::vector<float> g = {-1, 0, 2}, u = {3, 5, -0.5f};
  std::vector<float> out(3);
  kern::swiglu_forward(nullptr, g.data(), u.data(), out.data(), 3);
  const double want[] = {-0.806824264, 0, -0.880797078};
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(out[i], want[i], 1e-6) << i;
}

// ---- finite differences ----

TEST(LlamaLayers, RmsNormGradient) {
  const int rows = 5, cols = 16, n = rows * cols;
  auto x = randn(n, 1), w = randn(cols, 2), probe = randn(n, 3);
  std::vector<float> y(n), rstd(rows);
  auto f = [&]() {
    kern::rmsnorm_forward(nullptr, x.data(), w.data(), y.data(), rstd.data(), rows, cols, 1e-5f);
    return dot(y, probe);
  };
  f();
  std::vector<float> dx(n, 0.f), dw(cols, 0.f);
  kern::rmsnorm_backward(nullptr, probe.data(), x.data(), w.data(), rstd.data(), dx.data(), dw.data(), rows, cols);
  check_grad("rmsnorm dx", x, f, dx);
  check_grad("rmsnorm dw", w, f, dw);
  // dx accumulates: a second backward adds the same again.
  std::vector<float> dx2 = dx, dw2(cols, 0.f);
  kern::rmsnorm_backward(nullptr, probe.data(), x.data(), w.data(), rstd.data(), dx2.data(), dw2.data(), rows, cols);
  for (int i = 0; i < n; ++i) EXPECT_NEAR(dx2[i], 2 * dx[i], 1e-5 * (1 + std::abs(dx[i])));
}

TEST(LlamaLayers, RopeGradient) {
  const int batch = 2, seq = 5, heads = 3, hd = 8, ld = heads * hd + 4;  // a padded row stride
  const int n = batch * seq * ld;
  parallel::RopeScaling s;
  s.type = "llama3";
  s.factor = 4;
  s.original_max_position_embeddings = 16;
  parallel::layers::RotaryEmbedding rope(hd, 7, 500.0, s, nullptr);
  auto x = randn(n, 4), probe = randn(n, 5);
  std::vector<float> y;
  auto f = [&]() {
    y = x;
    rope.forward(nullptr, y.data(), ld, int64_t{batch} * seq, seq, heads);
    return dot(y, probe);
  };
  std::vector<float> g = probe;
  rope.backward(nullptr, g.data(), ld, int64_t{batch} * seq, seq, heads);
  // The padding columns are not touched: their gradient is the probe itself, as f's.
  check_grad("rope", x, f, g);
}

TEST(LlamaLayers, SwiGluGradient) {
  const int n = 64;
  auto gate = randn(n, 6, 2.f), up = randn(n, 7), probe = randn(n, 8);
  std::vector<float> out(n), dg(n), du(n);
  auto f = [&]() {
    kern::swiglu_forward(nullptr, gate.data(), up.data(), out.data(), n);
    return dot(out, probe);
  };
  kern::swiglu_backward(nullptr, probe.data(), gate.data(), up.data(), dg.data(), du.data(), n);
  check_grad("swiglu dgate", gate, f, dg, 1e-2);
  check_grad("swiglu dup", up, f, du, 1e-2);
  // In place on dout, as the model calls it.
  std::vector<float> d = probe, du2(n);
  kern::swiglu_backward(nullptr, d.data(), gate.data(), up.data(), d.data(), du2.data(), n);
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(d[i], dg[i]);
    EXPECT_EQ(du2[i], du[i]);
  }
}

struct Attn {
  parallel::layers::AttentionShape s;
  std::vector<float> q, k, v, probs, y;
  Attn(int64_t batch, int64_t seq, int64_t heads, int64_t kv, int64_t hd) {
    s = {batch, seq, heads, kv, hd, heads * hd, kv * hd, heads * hd};
    q.resize(batch * seq * heads * hd);
    k.resize(batch * seq * kv * hd);
    v.resize(k.size());
    probs.resize(batch * heads * seq * seq);
    y.resize(q.size());
  }
  void forward() {
    parallel::layers::gqa_attention_forward(nullptr, s, q.data(), k.data(), v.data(), probs.data(), y.data());
  }
  void backward(const std::vector<float>& dy, std::vector<float>& dq, std::vector<float>& dk, std::vector<float>& dv) {
    std::vector<float> dp(s.seq * s.seq);
    dq.assign(q.size(), 0.f);
    dk.assign(k.size(), 0.f);
    dv.assign(v.size(), 0.f);
    parallel::layers::gqa_attention_backward(nullptr, s, q.data(), k.data(), v.data(), probs.data(), dy.data(),
                                             dp.data(), dq.data(), dk.data(), dv.data());
  }
};

TEST(LlamaLayers, GqaEqualsMhaWithRepeatedKv) {
  // 6 query heads over 2 K/V heads (groups of 3), seq 70 (two row blocks).
  const int64_t batch = 2, seq = 70, heads = 6, kv = 2, hd = 4, group = heads / kv;
  Attn g(batch, seq, heads, kv, hd), m(batch, seq, heads, heads, hd);
  g.q = randn(g.q.size(), 10);
  g.k = randn(g.k.size(), 11);
  g.v = randn(g.v.size(), 12);
  m.q = g.q;
  // repeat_kv: MHA head h is K/V head h / group.
  for (int64_t r = 0; r < batch * seq; ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t j = 0; j < hd; ++j) {
        m.k[(r * heads + h) * hd + j] = g.k[(r * kv + h / group) * hd + j];
        m.v[(r * heads + h) * hd + j] = g.v[(r * kv + h / group) * hd + j];
      }
  g.forward();
  m.forward();
  for (size_t i = 0; i < g.y.size(); ++i) ASSERT_EQ(g.y[i], m.y[i]) << i;
  // Backward: dq equal, dk / dv of a K/V head = the sum over its group's MHA heads.
  const auto dy = randn(g.y.size(), 13);
  std::vector<float> gq, gk, gv, mq, mk, mv;
  g.backward(dy, gq, gk, gv);
  m.backward(dy, mq, mk, mv);
  for (size_t i = 0; i < gq.size(); ++i) ASSERT_EQ(gq[i], mq[i]) << i;
  for (int64_t r = 0; r < batch * seq; ++r)
    for (int64_t kh = 0; kh < kv; ++kh)
      for (int64_t j = 0; j < hd; ++j) {
        double sk = 0, sv = 0;
        for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
          sk += mk[(r * heads + h) * hd + j];
          sv += mv[(r * heads + h) * hd + j];
        }
        const size_t at = (r * kv + kh) * hd + j;
        EXPECT_NEAR(gk[at], sk, 1e-5 * (1 + std::abs(sk))) << r << " " << kh;
        EXPECT_NEAR(gv[at], sv, 1e-5 * (1 + std::abs(sv))) << r << " " << kh;
      }
}

TEST(LlamaLayers, GqaGradient) {
  // MQA (kv 1), GQA (kv 2) and MHA (kv 4), seq 67 (a partial second block).
  for (int64_t kv : {1, 2, 4}) {
    Attn a(2, 67, 4, kv, 4);
    a.q = randn(a.q.size(), 20, 1.5f);
    a.k = randn(a.k.size(), 21, 1.5f);
    a.v = randn(a.v.size(), 22);
    const auto probe = randn(a.y.size(), 23);
    auto f = [&]() {
      a.forward();
      return dot(a.y, probe);
    };
    f();
    std::vector<float> dq, dk, dv;
    a.backward(probe, dq, dk, dv);
    const std::string w = "kv_heads " + std::to_string(kv);
    check_grad(w + " dq", a.q, f, dq);
    check_grad(w + " dk", a.k, f, dk);
    check_grad(w + " dv", a.v, f, dv);
  }
}

// The nn.Linear layout is the Conv1D layout transposed: with W_linear =
// W_conv1d^T both give the same outputs, input gradients and (transposed)
// weight gradients; without a bias a row-parallel layer adds only the residual.
TEST(LlamaLayers, LinearLayoutIsConv1DTransposed) {
  auto ps = parallel::layers::serial_state(nullptr);
  const int64_t rows = 5, in = 6, out = 4;
  auto w = randn(in * out, 30), x = randn(rows * in, 31), dy = randn(rows * out, 32), b = randn(out, 33);
  std::vector<float> wt(in * out);
  for (int64_t i = 0; i < in; ++i)
    for (int64_t o = 0; o < out; ++o) wt[o * in + i] = w[i * out + o];
  auto bind = [](parallel::layers::Parameter& p, std::vector<float>& value, std::vector<float>& grad) {
    grad.assign(value.size(), 0.f);
    p.value = value.data();
    p.grad = grad.data();
  };
  parallel::layers::LinearOptions lin;
  lin.layout = parallel::layers::WeightLayout::kLinear;
  {  // column-parallel with a bias
    parallel::layers::ColumnParallelLinear conv("c", in, out, 1, ps, 0.02f), linear("l", in, out, 1, ps, 0.02f, lin);
    EXPECT_EQ(linear.weight().full_shape, (Shape{out, in}));
    std::vector<float> w1 = w, w2 = wt, b1 = b, b2 = b, g1, g2, gb1, gb2;
    bind(conv.weight(), w1, g1);
    bind(linear.weight(), w2, g2);
    bind(conv.bias(), b1, gb1);
    bind(linear.bias(), b2, gb2);
    std::vector<float> y1(rows * out), y2(rows * out), dx1(rows * in), dx2(rows * in);
    conv.forward(x.data(), rows, y1.data());
    linear.forward(x.data(), rows, y2.data());
    for (size_t i = 0; i < y1.size(); ++i) EXPECT_NEAR(y1[i], y2[i], 1e-5) << i;
    conv.backward(dy.data(), rows, dx1.data());
    linear.backward(dy.data(), rows, dx2.data());
    for (size_t i = 0; i < dx1.size(); ++i) EXPECT_NEAR(dx1[i], dx2[i], 1e-5) << i;
    for (int64_t i = 0; i < in; ++i)
      for (int64_t o = 0; o < out; ++o) EXPECT_NEAR(g1[i * out + o], g2[o * in + i], 1e-5);
    for (int64_t o = 0; o < out; ++o) EXPECT_EQ(gb1[o], gb2[o]);
  }
  {  // row-parallel: Conv1D with a zero bias against Linear without one
    lin.bias = false;
    parallel::layers::RowParallelLinear conv("c", in, out, ps, 0.02f), linear("l", in, out, ps, 0.02f, lin);
    EXPECT_EQ(linear.params().size(), 1u);
    EXPECT_EQ(linear.weight().split_dim, -1);  // tp 1
    std::vector<float> w1 = w, w2 = wt, zero(out, 0.f), g1, g2, gb;
    bind(conv.weight(), w1, g1);
    bind(linear.weight(), w2, g2);
    bind(conv.bias(), zero, gb);
    const auto residual = randn(rows * out, 34);
    std::vector<float> y1(rows * out), y2(rows * out), dx1(rows * in), dx2(rows * in);
    conv.forward(x.data(), rows, residual.data(), y1.data());
    linear.forward(x.data(), rows, residual.data(), y2.data());
    for (size_t i = 0; i < y1.size(); ++i) EXPECT_NEAR(y1[i], y2[i], 1e-5) << i;
    conv.backward(dy.data(), rows, dx1.data());
    linear.backward(dy.data(), rows, dx2.data());
    for (size_t i = 0; i < dx1.size(); ++i) EXPECT_NEAR(dx1[i], dx2[i], 1e-5) << i;
    for (int64_t i = 0; i < in; ++i)
      for (int64_t o = 0; o < out; ++o) EXPECT_NEAR(g1[i * out + o], g2[o * in + i], 1e-5);
  }
}

}  // namespace
}  // namespace tessera
