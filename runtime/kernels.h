// CPU compute kernels of an emulated core.
//
// Every kernel works on fp32 row-major buffers the caller owns (normally the
// storage of Tensors allocated on `dev`) and charges `dev`'s SimClock with
// the FLOPs and HBM bytes the same kernel would cost on the accelerator
// (runtime/kernel_cost.h, the figures the planner sums too), so modeled step
// times follow the real work. `dev` may be
// nullptr (nothing charged). Kernels allocate nothing; GEMMs go through
// OpenBLAS cblas_sgemm (set OPENBLAS_NUM_THREADS=1 per rank).
//
// Mixed precision (Device::set_precision with bf16 activations): the
// buffers are bf16 values in float containers (runtime/bf16.h). Kernels
// compute in fp32 as before (norm statistics, softmax, exp, sums) and round
// what they write to bf16 (to nearest even): activations and activation
// gradients to act_dtype, parameter gradients (dgamma, dbeta, bias and
// weight gradients, gemm_grad) to grad_dtype, so an accumulation into a
// bf16 gradient rounds after each kernel as a bf16 buffer would. GEMMs take
// bf16 inputs with fp32 accumulation (bf16::gemm). Charges use the bf16
// peak and half the bytes (cost::in_dtype). gemm_raw, causal_softmax_* and
// adamw_update neither round nor charge: their callers do.
//
// Thread-safety: kernels are reentrant; concurrent calls on one Device only
// contend on its clock's atomics.
#pragma once

#include <cstdint>

#include "runtime/kernel_cost.h"

namespace tessera {

class Device;

namespace kern {

// One BLAS thread per rank unless OPENBLAS_NUM_THREADS says otherwise (ranks
// are the parallelism; BLAS threads would oversubscribe the cores).
void default_blas_threads();

// Charges `dev` (if not null) for one kernel of `flops` FLOPs touching
// `bytes` bytes, or for one kernel of runtime/kernel_cost.h.
// Charged at the device's activation dtype (its peak, cost::in_dtype bytes).
void charge(Device* dev, double flops, double bytes);
void charge(Device* dev, const cost::Kernel& k);
// Charged at `dtype` whatever the device's precision (the optimizer's fp32 kernels).
void charge(Device* dev, const cost::Kernel& k, DType dtype);

// In place: n elements rounded to the device's activation (or gradient)
// dtype; nothing for F32 or without a device. For code that writes
// activations outside these kernels (attention, embeddings, the loss).
void round_activations(Device* dev, float* x, int64_t n);
void round_grads(Device* dev, float* x, int64_t n);
// Rows x cols of a strided buffer (row stride ld).
void round_activations(Device* dev, float* x, int64_t rows, int64_t cols, int64_t ld);

// C[M,N] = alpha * op(A) * op(B) + beta * C, op = transpose when ta/tb.
// lda/ldb/ldc are the row strides of A, B, C as stored. Charges 2*M*N*K.
void gemm(Device* dev, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
// gemm whose C is a parameter gradient (rounded to the device's grad dtype).
void gemm_grad(Device* dev, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
// The same without charging (for callers that charge a batch once).
void gemm_raw(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// y[r, :] = layernorm(x[r, :]) * gamma + beta; saves mean and 1/std per row.
void layernorm_forward(Device* dev, const float* x, const float* gamma, const float* beta, float* y, float* mean,
                       float* rstd, int64_t rows, int64_t cols, float eps);
// dx += dLN/dx (accumulates: the residual stream's gradient flows through);
// dgamma += sum_r dy*xhat, dbeta += sum_r dy.
void layernorm_backward(Device* dev, const float* dy, const float* x, const float* gamma, const float* mean,
                        const float* rstd, float* dx, float* dgamma, float* dbeta, int64_t rows, int64_t cols);

// out[r, :] = bias (broadcast), so a following GEMM with beta = 1 adds the bias for free.
void broadcast_rows(Device* dev, const float* bias, float* out, int64_t rows, int64_t cols);
// out[r, :] = a[r, :] + b[r, :] (+ bias[:] when not null); b may be null when bias is not.
// out may alias a or b.
void add_rows(Device* dev, const float* a, const float* b, const float* bias, float* out, int64_t rows, int64_t cols);
// db[j] += sum_r dy[r, j].
void bias_grad(Device* dev, const float* dy, float* db, int64_t rows, int64_t cols);

// GELU, tanh approximation (GPT-2's "gelu_new"): y = gelu(x).
void gelu_forward(Device* dev, const float* x, float* y, int64_t n);
// dx = dy * gelu'(x); dx may alias dy.
void gelu_backward(Device* dev, const float* dy, const float* x, float* dx, int64_t n);

// In place on a [t, t] score matrix with row stride ld: p = softmax(scale * s)
// over columns j <= i of row i; entries j > i become 0.
void causal_softmax_forward(float* s, int64_t t, int64_t ld, float scale);
// In place: dp (gradient w.r.t. p) becomes the gradient w.r.t. the raw scores s.
void causal_softmax_backward(const float* p, float* dp, int64_t t, int64_t ld, float scale);

// AdamW on n contiguous elements (decoupled weight decay: p -= lr*wd*p first).
// bias1/bias2 are 1 - beta^t. grad_scale multiplies g (clipping).
void adamw_update(Device* dev, float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, float bias1, float bias2, float grad_scale);

// sum of squares (in double) of n elements.
double sum_squares(Device* dev, const float* x, int64_t n);

// ---- Llama-family kernels (RMSNorm, rotary embeddings, SwiGLU) ----

// RMSNorm (Hugging Face LlamaRMSNorm, fp32): y[r, :] = x[r, :] * rstd[r] * w,
// rstd[r] = 1 / sqrt(mean_j x[r, j]^2 + eps); saves rstd per row.
void rmsnorm_forward(Device* dev, const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t cols,
                     float eps);
// dx += dRMSNorm/dx (accumulates, as layernorm_backward); dw += sum_r dy * x * rstd.
void rmsnorm_backward(Device* dev, const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                      float* dw, int64_t rows, int64_t cols);

// Rotary embedding, rotate-half layout (Hugging Face apply_rotary_pos_emb),
// in place on `rows` rows of `heads` heads of head_dim (row stride ld): row r
// is position r % seq and x' = x cos + rotate_half(x) sin with
// rotate_half([x1, x2]) = [-x2, x1]. cos/sin: [>= seq, head_dim] tables
// (each half repeated). The backward applies the transpose rotation to a
// gradient in place.
void rope_forward(Device* dev, float* x, int64_t ld, int64_t rows, int64_t seq, int64_t heads, int64_t head_dim,
                  const float* cos, const float* sin);
void rope_backward(Device* dev, float* dx, int64_t ld, int64_t rows, int64_t seq, int64_t heads, int64_t head_dim,
                   const float* cos, const float* sin);
// rope_forward with row r at position positions[r] (a KV-cache forward:
// each sequence's new rows continue from its cached length). One kernel.
void rope_forward_at(Device* dev, float* x, int64_t ld, int64_t rows, const int64_t* positions, int64_t heads,
                     int64_t head_dim, const float* cos, const float* sin);

// SwiGLU: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)), n elements.
void swiglu_forward(Device* dev, const float* gate, const float* up, float* out, int64_t n);
// dgate = dout * up * silu'(gate), dup = dout * silu(gate); dgate/dup may alias dout (not each other).
void swiglu_backward(Device* dev, const float* dout, const float* gate, const float* up, float* dgate, float* dup,
                     int64_t n);

}  // namespace kern
}  // namespace tessera
