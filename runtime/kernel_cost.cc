#include "runtime/kernel_cost.h"

#include <algorithm>

#include "runtime/device.h"

namespace tessera::cost {

namespace {
constexpr double kF = 4.0;  // bytes per fp32 element
double d(int64_t v) { return static_cast<double>(v); }
}  // namespace

double sustained_flops(const DeviceSpec& spec, DType dtype) { return spec.peak_flops(dtype) * spec.sustained_fraction; }

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
// Of the output tiles' slots over whole waves, the share doing useful work.
double wave_fill(int64_t m, int64_t n, int64_t batch, int64_t tm, int64_t tn, int64_t units) {
  const int64_t tiles = batch * ceil_div(m, tm) * ceil_div(n, tn);
  const int64_t waves = ceil_div(tiles, units);
  return d(m) * d(n) * d(batch) / (d(waves) * d(units) * d(tm) * d(tn));
}
}  // namespace

double gemm_efficiency(const DeviceSpec& spec, int64_t m, int64_t n, int64_t k, int64_t batch, DType dtype) {
  (void)dtype;  // the tiles are the 16-bit ones for either dtype; the dtype's peak is kernel_seconds'
  if (spec.compute_units <= 0 || spec.gemm_tile_m <= 0 || spec.gemm_tile_n <= 0 || m <= 0 || n <= 0 || k <= 0)
    return spec.sustained_fraction;
  const int64_t tm = spec.gemm_tile_m, tn = spec.gemm_tile_n, units = spec.compute_units;
  const int64_t b = std::max<int64_t>(1, batch);
  const double fill = std::max(wave_fill(m, n, b, tm, tn, units), wave_fill(m, n, b, tn, tm, units));
  const int64_t tk = std::max(1, spec.gemm_tile_k);
  const double kfill = d(k) / d(ceil_div(k, tk) * tk);
  return spec.sustained_fraction * fill * kfill;
}

double kernel_seconds(const DeviceSpec& spec, const Kernel& k, DType dtype) {
  const double rate = k.m > 0 ? spec.peak_flops(dtype) * gemm_efficiency(spec, k.m, k.n, k.k, k.batch, dtype)
                              : sustained_flops(spec, dtype);
  const double t_flops = rate > 0 ? k.flops / rate : 0;
  const double bw = spec.sustained_hbm_bandwidth();
  const double t_bytes = bw > 0 ? k.bytes / bw : 0;
  return spec.kernel_launch_s + std::max(t_flops, t_bytes);
}

Kernel in_dtype(Kernel k, DType dtype) {
  k.bytes *= static_cast<double>(dtype_size(dtype)) / kF;
  return k;
}

Kernel gemm(int64_t m, int64_t n, int64_t k, bool accumulate) {
  return {2.0 * d(m) * d(n) * d(k), kF * (d(m) * d(k) + d(k) * d(n) + d(m) * d(n) * (accumulate ? 2 : 1)), m, n, k, 1};
}

Kernel layernorm_forward(int64_t rows, int64_t cols) {
  return {8.0 * d(rows) * d(cols), kF * (2.0 * d(rows) * d(cols) + 2.0 * d(cols))};
}

Kernel layernorm_backward(int64_t rows, int64_t cols) {
  return {16.0 * d(rows) * d(cols), kF * (4.0 * d(rows) * d(cols) + 4.0 * d(cols))};
}

Kernel broadcast_rows(int64_t rows, int64_t cols) { return {0, kF * (d(rows) * d(cols) + d(cols))}; }

Kernel add_rows(int64_t rows, int64_t cols, bool bias) {
  return {(bias ? 2.0 : 1.0) * d(rows) * d(cols), kF * 3.0 * d(rows) * d(cols)};
}

Kernel bias_grad(int64_t rows, int64_t cols) { return {d(rows) * d(cols), kF * (d(rows) * d(cols) + 2.0 * d(cols))}; }

Kernel gelu_forward(int64_t n) { return {10.0 * d(n), kF * 2.0 * d(n)}; }

Kernel gelu_backward(int64_t n) { return {16.0 * d(n), kF * 3.0 * d(n)}; }

namespace {
// Score entries of a causal [seq, seq] block: the lower triangle with the diagonal.
double causal_entries(int64_t seq) { return d(seq) * (d(seq) + 1) / 2; }
}  // namespace

Kernel attention_forward(int64_t batch, int64_t heads, int64_t seq, int64_t head_dim) {
  const double bh = d(batch) * d(heads), tri = causal_entries(seq), sd = d(seq) * d(head_dim);
  // Q K^T and P V (2 hd FLOPs per entry each), softmax 5 per entry; reads Q,
  // K, V, writes Y and the probabilities (kept for the backward).
  // Shaped as its score GEMM, seq x seq over head_dim, one per (batch, head).
  return {bh * (4.0 * d(head_dim) * tri + 5.0 * tri), kF * bh * (4.0 * sd + tri), seq, seq, head_dim, batch * heads};
}

Kernel attention_backward(int64_t batch, int64_t heads, int64_t seq, int64_t head_dim) {
  const double bh = d(batch) * d(heads), tri = causal_entries(seq), sd = d(seq) * d(head_dim);
  // dP = dY V^T, dV = P^T dY, dQ = dS K, dK = dS^T Q (2 hd each per entry),
  // softmax backward 4 per entry; reads Q, K, V, dY and P, writes dQ, dK, dV
  // (and the dP scratch once).
  return {
      bh * (8.0 * d(head_dim) * tri + 4.0 * tri), kF * bh * (7.0 * sd + 2.0 * tri), seq, seq, head_dim, batch * heads};
}

Kernel batched_gemm(int64_t batch, int64_t m, int64_t n, int64_t k) {
  const double b = d(batch);
  return {2.0 * b * d(m) * d(n) * d(k), kF * b * (d(m) * d(k) + d(k) * d(n) + d(m) * d(n)), m, n, k, batch};
}

Kernel softmax_forward(int64_t rows, int64_t cols) { return {5.0 * d(rows) * d(cols), kF * 2.0 * d(rows) * d(cols)}; }

Kernel softmax_backward(int64_t rows, int64_t cols) { return {4.0 * d(rows) * d(cols), kF * 3.0 * d(rows) * d(cols)}; }

Kernel dropout_forward(int64_t n) { return {2.0 * d(n), kF * 2.5 * d(n)}; }

Kernel dropout_backward(int64_t n) { return {d(n), kF * 2.5 * d(n)}; }

Kernel embedding_forward(int64_t rows, int64_t dim) { return {0, 2.0 * kF * d(rows) * d(dim)}; }

Kernel embedding_backward(int64_t rows, int64_t dim) { return {d(rows) * d(dim), 3.0 * kF * d(rows) * d(dim)}; }

Kernel position_add(int64_t rows, int64_t dim) { return {d(rows) * d(dim), 3.0 * kF * d(rows) * d(dim)}; }

Kernel cross_entropy(int64_t rows, int64_t n_local, bool want_grad) {
  return {8.0 * d(rows) * d(n_local), kF * (want_grad ? 4.0 : 2.0) * d(rows) * d(n_local)};
}

std::vector<Kernel> megatron_cross_entropy_forward(int64_t rows, int64_t n_local, int logit_bytes, int ce_bytes) {
  const double e = d(rows) * d(n_local), c = ce_bytes;
  std::vector<Kernel> ks;
  if (logit_bytes != ce_bytes) ks.push_back({0, (logit_bytes + c) * e});  // logits.float()
  ks.push_back({e, c * e});                                               // max over the row
  ks.push_back({e, 2 * c * e});                                           // sub_(max)
  ks.push_back({e, 2 * c * e});                                           // exp(out=)
  ks.push_back({e, c * e});                                               // sum over the row
  ks.push_back({e, 2 * c * e});                                           // div_(sum): the softmax
  return ks;
}

std::vector<Kernel> megatron_cross_entropy_backward(int64_t rows, int64_t n_local, int logit_bytes, int ce_bytes) {
  const double e = d(rows) * d(n_local), c = ce_bytes;
  std::vector<Kernel> ks{{e, 2 * c * e}};                                 // mul_(grad_output)
  if (logit_bytes != ce_bytes) ks.push_back({0, (c + logit_bytes) * e});  // the cast's backward
  return ks;
}

Kernel adamw(int64_t n) { return {14.0 * d(n), kF * 7.0 * d(n)}; }

Kernel sum_squares(int64_t n) { return {2.0 * d(n), kF * d(n)}; }

Kernel fill(int64_t n) { return {0, kF * d(n)}; }

// ---- Llama-family kernels ----

// Per element: square and sum (2), scale by rstd and w (2); reads x, writes y, reads w.
Kernel rmsnorm_forward(int64_t rows, int64_t cols) {
  return {4.0 * d(rows) * d(cols), kF * (2.0 * d(rows) * d(cols) + d(cols))};
}

// Per element: xhat, g = dy w, the two sums, dx (+=) and dw (+=): about 8;
// reads dy, x, dx, writes dx; reads and writes dw.
Kernel rmsnorm_backward(int64_t rows, int64_t cols) {
  return {8.0 * d(rows) * d(cols), kF * (4.0 * d(rows) * d(cols) + 2.0 * d(cols))};
}

// Per element: one multiply by cos, one by sin, one add; reads and writes
// the activations, reads a cos and a sin row per row.
Kernel rope(int64_t rows, int64_t heads, int64_t head_dim) {
  const double e = d(rows) * d(heads) * d(head_dim);
  return {3.0 * e, kF * (2.0 * e + 2.0 * d(rows) * d(head_dim))};
}

// silu(g) u = g u / (1 + exp(-g)): about 8 FLOPs; reads gate and up, writes out.
Kernel swiglu_forward(int64_t n) { return {8.0 * d(n), kF * 3.0 * d(n)}; }

// s = sigmoid(g), du = dout silu(g), dg = dout u s (1 + g (1 - s)): about 14;
// reads dout, gate, up, writes dgate, dup.
Kernel swiglu_backward(int64_t n) { return {14.0 * d(n), kF * 5.0 * d(n)}; }

Kernel gqa_attention_forward(int64_t batch, int64_t heads, int64_t kv_heads, int64_t seq, int64_t head_dim) {
  const double tri = causal_entries(seq), sd = d(seq) * d(head_dim);
  // As attention_forward, with K and V read once per K/V head: Q and Y per
  // query head, the probabilities per query head.
  return {d(batch) * d(heads) * (4.0 * d(head_dim) * tri + 5.0 * tri),
          kF * d(batch) * (2.0 * d(heads) * sd + 2.0 * d(kv_heads) * sd + d(heads) * tri)};
}

Kernel gqa_attention_backward(int64_t batch, int64_t heads, int64_t kv_heads, int64_t seq, int64_t head_dim) {
  const double tri = causal_entries(seq), sd = d(seq) * d(head_dim);
  // Q, dY, dQ per query head; K, V, dK, dV per K/V head; P and dP per query head.
  return {d(batch) * d(heads) * (8.0 * d(head_dim) * tri + 4.0 * tri),
          kF * d(batch) * (3.0 * d(heads) * sd + 4.0 * d(kv_heads) * sd + 2.0 * d(heads) * tri)};
}

Kernel cached_attention(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t q_rows, int64_t scores,
                        int64_t kv_rows) {
  const double qd = d(q_rows) * d(head_dim);
  return {d(heads) * d(scores) * (4.0 * d(head_dim) + 5.0),
          kF * (2.0 * d(heads) * qd + 2.0 * d(kv_heads) * d(kv_rows) * d(head_dim) + 4.0 * d(kv_heads) * qd)};
}

}  // namespace tessera::cost
