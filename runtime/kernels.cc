#include "runtime/kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "runtime/bf16.h"
#include "runtime/device.h"

namespace tessera::kern {

void default_blas_threads() {
  if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr) openblas_set_num_threads(1);
}

namespace {
bool bf16_acts(const Device* dev) { return dev && dev->act_dtype() == DType::BF16; }
bool bf16_grads(const Device* dev) { return dev && dev->grad_dtype() == DType::BF16; }
// Rows of `cols` values, `ld` apart, rounded to bf16.
void round_rows(float* x, int64_t rows, int64_t cols, int64_t ld) {
  if (ld == cols) {
    bf16::round_inplace(x, rows * cols);
    return;
  }
  for (int64_t r = 0; r < rows; ++r) bf16::round_inplace(x + r * ld, cols);
}
}  // namespace

void charge(Device* dev, double flops, double bytes) {
  if (!dev) return;
  const DType t = dev->act_dtype();
  dev->clock().charge_compute(flops, bytes * static_cast<double>(dtype_size(t)) / 4.0, t);
}

void charge(Device* dev, const cost::Kernel& k) {
  if (dev) charge(dev, cost::in_dtype(k, dev->act_dtype()), dev->act_dtype());
}

void charge(Device* dev, const cost::Kernel& k, DType dtype) {
  if (dev) dev->clock().charge_kernel(k, dtype);  // with the shape, for a GEMM's efficiency
}

void round_activations(Device* dev, float* x, int64_t n) {
  if (bf16_acts(dev)) bf16::round_inplace(x, n);
}

void round_grads(Device* dev, float* x, int64_t n) {
  if (bf16_grads(dev)) bf16::round_inplace(x, n);
}

void round_activations(Device* dev, float* x, int64_t rows, int64_t cols, int64_t ld) {
  if (bf16_acts(dev)) round_rows(x, rows, cols, ld);
}

void gemm_raw(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

namespace {
// bf16 inputs with fp32 accumulation under bf16 activations, else sgemm.
void gemm_at(const Device* dev, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
             int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (bf16_acts(dev)) {
    bf16::gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    gemm_raw(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}
}  // namespace

void gemm(Device* dev, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  gemm_at(dev, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  round_activations(dev, c, m, n, ldc);
  charge(dev, cost::gemm(m, n, k, beta != 0.f));
}

void gemm_grad(Device* dev, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  gemm_at(dev, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (bf16_grads(dev)) round_rows(c, m, n, ldc);
  charge(dev, cost::gemm(m, n, k, beta != 0.f));
}

void layernorm_forward(Device* dev, const float* x, const float* gamma, const float* beta, float* y, float* mean,
                       float* rstd, int64_t rows, int64_t cols, float eps) {
  const float inv_n = 1.0f / static_cast<float>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    float s = 0;
    for (int64_t j = 0; j < cols; ++j) s += xr[j];
    const float mu = s * inv_n;
    float ss = 0;
    for (int64_t j = 0; j < cols; ++j) {
      float d = xr[j] - mu;
      ss += d * d;
    }
    const float rs = 1.0f / std::sqrt(ss * inv_n + eps);
    for (int64_t j = 0; j < cols; ++j) yr[j] = (xr[j] - mu) * rs * gamma[j] + beta[j];
    mean[r] = mu;
    rstd[r] = rs;
  }
  round_activations(dev, y, rows * cols);
  charge(dev, cost::layernorm_forward(rows, cols));
}

void layernorm_backward(Device* dev, const float* dy, const float* x, const float* gamma, const float* mean,
                        const float* rstd, float* dx, float* dgamma, float* dbeta, int64_t rows, int64_t cols) {
  const float inv_n = 1.0f / static_cast<float>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* dyr = dy + r * cols;
    const float* xr = x + r * cols;
    float* dxr = dx + r * cols;
    const float mu = mean[r], rs = rstd[r];
    // dxhat = dy * gamma; dx = rs * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
    float sum_g = 0, sum_gx = 0;
    for (int64_t j = 0; j < cols; ++j) {
      float xh = (xr[j] - mu) * rs;
      float g = dyr[j] * gamma[j];
      sum_g += g;
      sum_gx += g * xh;
      dgamma[j] += dyr[j] * xh;
      dbeta[j] += dyr[j];
    }
    const float mg = sum_g * inv_n, mgx = sum_gx * inv_n;
    for (int64_t j = 0; j < cols; ++j) {
      float xh = (xr[j] - mu) * rs;
      dxr[j] += rs * (dyr[j] * gamma[j] - mg - xh * mgx);
    }
  }
  round_activations(dev, dx, rows * cols);
  round_grads(dev, dgamma, cols);
  round_grads(dev, dbeta, cols);
  charge(dev, cost::layernorm_backward(rows, cols));
}

void broadcast_rows(Device* dev, const float* bias, float* out, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) std::copy(bias, bias + cols, out + r * cols);
  charge(dev, cost::broadcast_rows(rows, cols));
}

void add_rows(Device* dev, const float* a, const float* b, const float* bias, float* out, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* ar = a + r * cols;
    const float* br = b ? b + r * cols : nullptr;
    float* o = out + r * cols;
    if (!b) {
      for (int64_t j = 0; j < cols; ++j) o[j] = ar[j] + bias[j];
    } else if (bias) {
      for (int64_t j = 0; j < cols; ++j) o[j] = ar[j] + br[j] + bias[j];
    } else {
      for (int64_t j = 0; j < cols; ++j) o[j] = ar[j] + br[j];
    }
  }
  round_activations(dev, out, rows * cols);
  charge(dev, cost::add_rows(rows, cols, bias != nullptr));
}

void bias_grad(Device* dev, const float* dy, float* db, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* d = dy + r * cols;
    for (int64_t j = 0; j < cols; ++j) db[j] += d[j];
  }
  round_grads(dev, db, cols);
  charge(dev, cost::bias_grad(rows, cols));
}

namespace {
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;
}  // namespace

namespace {
// exp in plain float arithmetic so loops around it vectorise (libm's expf is
// a scalar call): Cody-Waite range reduction to |r| <= ln2/2 and Cephes'
// degree-6 polynomial, about 1 ulp over the clamped range.
inline float exp_fast(float x) {
  // As selects, not std::min/max of references: GCC if-converts these (with
  // -fno-trapping-math, runtime/CMakeLists.txt) and vectorises the callers' loops.
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  const float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  float n = (x * 1.44269504088896341f + kMagic) - kMagic;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}
}  // namespace

// gelu_tanh(x) = 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3);
// the sigmoid form has no cancellation for negative x.
void gelu_forward(Device* dev, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i];
    float s = 1.0f / (1.0f + exp_fast(-2.0f * kGeluC * (v + kGeluA * v * v * v)));
    y[i] = v * s;
  }
  round_activations(dev, y, n);
  charge(dev, cost::gelu_forward(n));
}

// d/dx [x s(2u)] = s + 2 x s (1 - s) du/dx.
void gelu_backward(Device* dev, const float* dy, const float* x, float* dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i];
    float s = 1.0f / (1.0f + exp_fast(-2.0f * kGeluC * (v + kGeluA * v * v * v)));
    float du = kGeluC * (1.0f + 3.0f * kGeluA * v * v);
    dx[i] = dy[i] * (s + 2.0f * v * s * (1.0f - s) * du);
  }
  round_activations(dev, dx, n);
  charge(dev, cost::gelu_backward(n));
}

void causal_softmax_forward(float* s, int64_t t, int64_t ld, float scale) {
  for (int64_t i = 0; i < t; ++i) {
    float* row = s + i * ld;
    float mx = row[0];
    for (int64_t j = 1; j <= i; ++j) mx = std::max(mx, row[j]);
    float sum = 0;
    for (int64_t j = 0; j <= i; ++j) {
      float e = std::exp((row[j] - mx) * scale);
      row[j] = e;
      sum += e;
    }
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j <= i; ++j) row[j] *= inv;
    for (int64_t j = i + 1; j < t; ++j) row[j] = 0.f;
  }
}

void causal_softmax_backward(const float* p, float* dp, int64_t t, int64_t ld, float scale) {
  for (int64_t i = 0; i < t; ++i) {
    const float* pr = p + i * ld;
    float* dr = dp + i * ld;
    float dot = 0;
    for (int64_t j = 0; j <= i; ++j) dot += pr[j] * dr[j];
    for (int64_t j = 0; j <= i; ++j) dr[j] = scale * pr[j] * (dr[j] - dot);
    for (int64_t j = i + 1; j < t; ++j) dr[j] = 0.f;
  }
}

void adamw_update(Device* dev, float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, float bias1, float bias2, float grad_scale) {
  const float decay = 1.0f - lr * weight_decay;
  const float step = lr / bias1;
  const float inv_sqrt_b2 = 1.0f / std::sqrt(bias2);
  for (int64_t i = 0; i < n; ++i) {
    float gi = g[i] * grad_scale;
    float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step * mi / (std::sqrt(vi) * inv_sqrt_b2 + eps);
  }
  charge(dev, cost::adamw(n), DType::F32);
}

double sum_squares(Device* dev, const float* x, int64_t n) {
  // Blocks of float partial sums folded into double: fast and accurate enough.
  double total = 0;
  constexpr int64_t kBlock = 4096;
  for (int64_t i = 0; i < n; i += kBlock) {
    int64_t e = std::min(n, i + kBlock);
    float s = 0;
    for (int64_t j = i; j < e; ++j) s += x[j] * x[j];
    total += s;
  }
  charge(dev, cost::sum_squares(n), DType::F32);
  return total;
}

// ---- Llama-family kernels ----

void rmsnorm_forward(Device* dev, const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t cols,
                     float eps) {
  const float inv_n = 1.0f / static_cast<float>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    float ss = 0;
    for (int64_t j = 0; j < cols; ++j) ss += xr[j] * xr[j];
    const float rs = 1.0f / std::sqrt(ss * inv_n + eps);
    for (int64_t j = 0; j < cols; ++j) yr[j] = w[j] * (xr[j] * rs);
    rstd[r] = rs;
  }
  round_activations(dev, y, rows * cols);
  charge(dev, cost::rmsnorm_forward(rows, cols));
}

// xhat = x rs, g = dy w: dx = rs (g - xhat mean(g xhat)).
void rmsnorm_backward(Device* dev, const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                      float* dw, int64_t rows, int64_t cols) {
  const float inv_n = 1.0f / static_cast<float>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* dyr = dy + r * cols;
    const float* xr = x + r * cols;
    float* dxr = dx + r * cols;
    const float rs = rstd[r];
    float sum_gx = 0;
    for (int64_t j = 0; j < cols; ++j) {
      const float xh = xr[j] * rs;
      sum_gx += dyr[j] * w[j] * xh;
      dw[j] += dyr[j] * xh;
    }
    const float mgx = sum_gx * inv_n;
    for (int64_t j = 0; j < cols; ++j) dxr[j] += rs * (dyr[j] * w[j] - xr[j] * rs * mgx);
  }
  round_activations(dev, dx, rows * cols);
  round_grads(dev, dw, cols);
  charge(dev, cost::rmsnorm_backward(rows, cols));
}

namespace {
// Per pair (a, b) = (x[i], x[i + half]) with c1, s1 = cos/sin[i], c2, s2 =
// cos/sin[i + half]: forward [a c1 - b s1, b c2 + a s2], i.e. the matrix
// [[c1, -s1], [s2, c2]]; transpose [[c1, s2], [-s1, c2]].
// Row r is at position positions[r], or r % seq without positions.
void rope_apply(float* x, int64_t ld, int64_t rows, int64_t seq, const int64_t* positions, int64_t heads, int64_t hd,
                const float* cos, const float* sin, bool transpose) {
  const int64_t half = hd / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t pos = positions ? positions[r] : r % seq;
    const float* c = cos + pos * hd;
    const float* s = sin + pos * hd;
    for (int64_t h = 0; h < heads; ++h) {
      float* x1 = x + r * ld + h * hd;
      float* x2 = x1 + half;
      // The two loops differ in their signs; clang-tidy 14 sees identical branches through the pragma.
      if (!transpose) {  // NOLINT(bugprone-branch-clone)
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float a = x1[i], b = x2[i];
          x1[i] = a * c[i] - b * s[i];
          x2[i] = b * c[i + half] + a * s[i + half];
        }
      } else {
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float a = x1[i], b = x2[i];
          x1[i] = a * c[i] + b * s[i + half];
          x2[i] = b * c[i + half] - a * s[i];
        }
      }
    }
  }
}
}  // namespace

void rope_forward(Device* dev, float* x, int64_t ld, int64_t rows, int64_t seq, int64_t heads, int64_t head_dim,
                  const float* cos, const float* sin) {
  rope_apply(x, ld, rows, seq, nullptr, heads, head_dim, cos, sin, false);
  round_activations(dev, x, rows, heads * head_dim, ld);
  charge(dev, cost::rope(rows, heads, head_dim));
}

void rope_backward(Device* dev, float* dx, int64_t ld, int64_t rows, int64_t seq, int64_t heads, int64_t head_dim,
                   const float* cos, const float* sin) {
  rope_apply(dx, ld, rows, seq, nullptr, heads, head_dim, cos, sin, true);
  round_activations(dev, dx, rows, heads * head_dim, ld);
  charge(dev, cost::rope(rows, heads, head_dim));
}

void rope_forward_at(Device* dev, float* x, int64_t ld, int64_t rows, const int64_t* positions, int64_t heads,
                     int64_t head_dim, const float* cos, const float* sin) {
  rope_apply(x, ld, rows, 1, positions, heads, head_dim, cos, sin, false);
  round_activations(dev, x, rows, heads * head_dim, ld);
  charge(dev, cost::rope(rows, heads, head_dim));
}

void swiglu_forward(Device* dev, const float* gate, const float* up, float* out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + exp_fast(-g)) * up[i];
  }
  round_activations(dev, out, n);
  charge(dev, cost::swiglu_forward(n));
}

// silu'(g) = s (1 + g (1 - s)), s = sigmoid(g).
void swiglu_backward(Device* dev, const float* dout, const float* gate, const float* up, float* dgate, float* dup,
                     int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i], u = up[i], d = dout[i];
    const float s = 1.0f / (1.0f + exp_fast(-g));
    dgate[i] = d * u * s * (1.0f + g * (1.0f - s));
    dup[i] = d * g * s;
  }
  round_activations(dev, dgate, n);
  round_activations(dev, dup, n);
  charge(dev, cost::swiglu_backward(n));
}

}  // namespace tessera::kern
