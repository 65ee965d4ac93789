// Kernel costs: the one place that says what each kernel of an emulated core
// costs. The kernels (runtime/kernels.h, the layers and the GPT model) charge
// these figures to their Device's SimClock, and the planner
// (parallel/cost_model.h) sums the same figures over the kernels a step runs,
// so a predicted step time and an emulated one are built from the same terms.
//
// A kernel is its FLOPs and the HBM bytes it moves (fp32 elements, 4 bytes
// each, as the emulated cores compute), and for GEMMs (and the attention,
// batched GEMMs) its shape. Its modeled time on a DeviceSpec is
//   launch + max(FLOPs / (peak(dtype) x efficiency), bytes / sustained HBM bandwidth)
// (a roofline plus a fixed per-kernel launch term): small kernels are
// memory- or launch-bound, large GEMMs FLOP-bound. The efficiency is the
// device's sustained_fraction for kernels without a shape, and for a GEMM
// gemm_efficiency(): sustained_fraction (what a GEMM of ideal shape
// sustains) times its tile and wave quantisation over the device's compute
// units, and the contraction's quantisation to the tile's k step. The
// sustained HBM bandwidth is the spec's times hbm_sustained_fraction (what a
// streaming kernel measures).
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/dtype.h"

namespace tessera {

struct DeviceSpec;

namespace cost {

struct Kernel {
  double flops = 0;
  double bytes = 0;
  // A GEMM's shape: `batch` independent products C[m,n] = A[m,k] B[k,n];
  // m == 0: not a GEMM (no shape efficiency).
  int64_t m = 0, n = 0, k = 0, batch = 1;
};

// Modeled seconds of one kernel on `spec` (formula above).
double kernel_seconds(const DeviceSpec& spec, const Kernel& k, DType dtype = DType::F32);
// The fraction of peak(dtype) a GEMM of this shape sustains on `spec`:
//   sustained_fraction x (m n batch) / (waves x units x TM x TN) x k / (ceil(k / TK) TK)
// with tiles = batch ceil(m / TM) ceil(n / TN), waves = ceil(tiles / units),
// the better of the tile TM x TN and its transpose (the library picks per
// shape); sustained_fraction when the spec has no compute units. Monotone:
// a dimension grown to a whole number of tiles never lowers it.
double gemm_efficiency(const DeviceSpec& spec, int64_t m, int64_t n, int64_t k, int64_t batch = 1,
                       DType dtype = DType::BF16);
// The sustained FLOP/s of a core: peak(dtype) x sustained_fraction.
double sustained_flops(const DeviceSpec& spec, DType dtype);

// The kernel with its operands held as `dtype` (F32 or BF16): the kernels
// below count fp32 bytes, a bf16 kernel moves half of them (its fp32
// statistics, a few per row, included: they are negligible).
Kernel in_dtype(Kernel k, DType dtype);

// ---- the kernels (fp32 operands) ----
// C[m,n] (+)= A[m,k] B[k,n]: 2mnk FLOPs; reads A, B (and C when accumulating), writes C.
Kernel gemm(int64_t m, int64_t n, int64_t k, bool accumulate);
Kernel layernorm_forward(int64_t rows, int64_t cols);
Kernel layernorm_backward(int64_t rows, int64_t cols);
Kernel broadcast_rows(int64_t rows, int64_t cols);       // out = bias per row
Kernel add_rows(int64_t rows, int64_t cols, bool bias);  // out = a + b (+ bias)
Kernel bias_grad(int64_t rows, int64_t cols);            // db += column sums
Kernel gelu_forward(int64_t n);
Kernel gelu_backward(int64_t n);
// Causal multi-head attention of `batch` x `heads` heads of [seq, head_dim]
// (one fused kernel: Q K^T over the lower triangle, softmax, P V; the
// backward: dP, dV, softmax backward, dQ, dK). The score matrix is written
// and read once per pass.
Kernel attention_forward(int64_t batch, int64_t heads, int64_t seq, int64_t head_dim);
Kernel attention_backward(int64_t batch, int64_t heads, int64_t seq, int64_t head_dim);
// Attention as Megatron-LM ran it before fused (flash) attention, the
// kernels Korthikanti et al. 2022 section 4 count the activations of: per
// (batch, head) the score GEMM Q K^T over the whole seq x seq square, a
// fused scale-mask-softmax, dropout on the probabilities (keeping a one-byte
// mask) and the GEMM with V. `batch` independent [m,k] x [k,n] products:
Kernel batched_gemm(int64_t batch, int64_t m, int64_t n, int64_t k);
// Softmax over rows of cols (forward: read x, write y; backward: read y
// and dy, write dx).
Kernel softmax_forward(int64_t rows, int64_t cols);
Kernel softmax_backward(int64_t rows, int64_t cols);
// Dropout of n elements: forward reads x, writes y and the mask; backward
// reads dy and the mask, writes dx. The mask is one byte per element at
// 16-bit (counted as half an element, as the bytes here are fp32 ones).
Kernel dropout_forward(int64_t n);
Kernel dropout_backward(int64_t n);
// Embedding row gather (rows of dim) and its scatter-add gradient.
Kernel embedding_forward(int64_t rows, int64_t dim);
Kernel embedding_backward(int64_t rows, int64_t dim);
// Learned-position add (forward) or its gradient accumulation (backward).
Kernel position_add(int64_t rows, int64_t dim);
// Softmax cross-entropy over rows x n_local logits (with the gradient in place).
Kernel cross_entropy(int64_t rows, int64_t n_local, bool want_grad);
// Megatron-LM's vocab-parallel cross entropy over rows x n_local logits of
// `logit_bytes` each, as its PyTorch kernels run it (the bytes are the
// kernels' own, not scaled by a precision), the rows' all-reduces aside:
// megatron/mpu/cross_entropy.py (2020-22; tensor_parallel/cross_entropy.py
// after) on `logits.float()` (gpt_model.py, unless --fp16-lm-cross-entropy;
// `ce_bytes` 4) or on the logits as they are (`ce_bytes` == logit_bytes).
// Forward: the cast when the sizes differ (read logit_bytes, write
// ce_bytes), then max, subtract in place, exp in place, sum, divide in place
// (the softmax kept for the backward): 1, 2, 2, 1, 2 passes of ce_bytes.
// Backward: the softmax scaled in place by the loss gradient (2 passes),
// then cast back (read ce_bytes, write logit_bytes). 16-bit logits in fp32:
// 38 and 14 bytes a logit.
std::vector<Kernel> megatron_cross_entropy_forward(int64_t rows, int64_t n_local, int logit_bytes, int ce_bytes);
std::vector<Kernel> megatron_cross_entropy_backward(int64_t rows, int64_t n_local, int logit_bytes, int ce_bytes);
// AdamW over n elements; sum of squares over n elements; zero-filling n floats.
Kernel adamw(int64_t n);
Kernel sum_squares(int64_t n);
Kernel fill(int64_t n);

// ---- Llama-family kernels (RMSNorm, rotary embeddings, SwiGLU, grouped-query attention) ----
// RMSNorm over rows x cols: y = x rsqrt(mean(x^2) + eps) w (saves rstd per
// row); the backward accumulates dx and dw.
Kernel rmsnorm_forward(int64_t rows, int64_t cols);
Kernel rmsnorm_backward(int64_t rows, int64_t cols);
// Rotary embedding (rotate-half) in place on rows x heads x head_dim, reading
// one cos and one sin row of head_dim per row; the backward is the same work.
Kernel rope(int64_t rows, int64_t heads, int64_t head_dim);
// out = silu(gate) * up over n elements; backward: dgate and dup from dout.
Kernel swiglu_forward(int64_t n);
Kernel swiglu_backward(int64_t n);
// Causal grouped-query attention: `heads` query heads of [seq, head_dim]
// reading `kv_heads` K/V heads (heads / kv_heads query heads per K/V head),
// per batch element. FLOPs as multi-head attention of `heads` heads; the
// bytes count K and V once per K/V head. With kv_heads == heads these equal
// attention_forward / attention_backward.
Kernel gqa_attention_forward(int64_t batch, int64_t heads, int64_t kv_heads, int64_t seq, int64_t head_dim);
Kernel gqa_attention_backward(int64_t batch, int64_t heads, int64_t kv_heads, int64_t seq, int64_t head_dim);

// ---- inference ----
// Attention of new query rows against a KV cache (prefill and decode,
// padding-free: each sequence attends to its own cached keys up to each
// query's position), one fused kernel over the batch: `q_rows` query rows of
// `heads` heads, `scores` (query, key) pairs over all sequences (per head),
// `kv_rows` cached rows of `kv_heads` K/V heads read (each sequence's
// context once), and the q_rows new K and V rows copied into the cache.
// FLOPs: Q K^T and P V (2 head_dim each per pair and head), softmax 5 per
// pair and head. Bytes: Q read and Y written per query head, the context's
// K and V read, the new K and V read and written; the scores stay on chip.
Kernel cached_attention(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t q_rows, int64_t scores,
                        int64_t kv_rows);

}  // namespace cost
}  // namespace tessera
