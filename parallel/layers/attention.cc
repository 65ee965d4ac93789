#include "parallel/layers/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "parallel/layers/kv_cache.h"
#include "runtime/error.h"
#include "runtime/kernels.h"

namespace tessera::parallel::layers {

namespace {
// Query rows per causal attention block (as GPT's).
constexpr int64_t kAttnBlock = 64;

void check(const AttentionShape& s) {
  TESSERA_CHECK(s.heads > 0 && s.kv_heads > 0 && s.heads % s.kv_heads == 0, "attention: ", s.kv_heads,
                " K/V heads do not divide ", s.heads, " query heads");
  TESSERA_CHECK(s.ldq >= s.heads * s.head_dim && s.ldkv >= s.kv_heads * s.head_dim && s.ldy >= s.heads * s.head_dim,
                "attention: row strides too small");
}
}  // namespace

void gqa_attention_forward(Device* dev, const AttentionShape& s, const float* q_all, const float* k_all,
                           const float* v_all, float* probs, float* y) {
  check(s);
  const int64_t seq = s.seq, hd = s.head_dim, group = s.heads / s.kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int64_t bi = 0; bi < s.batch; ++bi) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const float* q = q_all + bi * seq * s.ldq + h * hd;
      const float* k = k_all + bi * seq * s.ldkv + (h / group) * hd;
      const float* v = v_all + bi * seq * s.ldkv + (h / group) * hd;
      float* p = probs + (bi * s.heads + h) * seq * seq;
      float* yh = y + bi * seq * s.ldy + h * hd;
      for (int64_t r0 = 0; r0 < seq; r0 += kAttnBlock) {
        const int64_t rows = std::min(kAttnBlock, seq - r0), cols = r0 + rows;
        kern::gemm_raw(false, true, rows, cols, hd, 1.f, q + r0 * s.ldq, s.ldq, k, s.ldkv, 0.f, p + r0 * seq, seq);
      }
      kern::causal_softmax_forward(p, seq, seq, scale);
      kern::round_activations(dev, p, seq * seq);  // bf16 probabilities into P V (and kept for the backward)
      for (int64_t r0 = 0; r0 < seq; r0 += kAttnBlock) {
        const int64_t rows = std::min(kAttnBlock, seq - r0), cols = r0 + rows;
        kern::gemm_raw(false, false, rows, hd, cols, 1.f, p + r0 * seq, seq, v, s.ldkv, 0.f, yh + r0 * s.ldy, s.ldy);
      }
    }
  }
  kern::round_activations(dev, y, s.batch * seq, s.heads * hd, s.ldy);
  kern::charge(dev, cost::gqa_attention_forward(s.batch, s.heads, s.kv_heads, seq, hd));
}

void gqa_attention_backward(Device* dev, const AttentionShape& s, const float* q_all, const float* k_all,
                            const float* v_all, const float* probs, const float* dy, float* dp, float* dq_all,
                            float* dk_all, float* dv_all) {
  check(s);
  const int64_t seq = s.seq, hd = s.head_dim, group = s.heads / s.kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // dV and dK sum over row blocks and over the query heads of their group:
  // the last block of the group's first head covers every key, so it goes
  // first with beta = 0.
  const int64_t last = (seq - 1) / kAttnBlock * kAttnBlock;
  for (int64_t bi = 0; bi < s.batch; ++bi) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t kv_off = bi * seq * s.ldkv + (h / group) * hd;
      const float* q = q_all + bi * seq * s.ldq + h * hd;
      const float* k = k_all + kv_off;
      const float* v = v_all + kv_off;
      const float* p = probs + (bi * s.heads + h) * seq * seq;
      const float* dyh = dy + bi * seq * s.ldy + h * hd;
      float* dq = dq_all + bi * seq * s.ldq + h * hd;
      float* dk = dk_all + kv_off;
      float* dv = dv_all + kv_off;
      const bool first = h % group == 0;
      for (int64_t r0 = 0; r0 < seq; r0 += kAttnBlock) {  // dP = dY V^T
        const int64_t rows = std::min(kAttnBlock, seq - r0), cols = r0 + rows;
        kern::gemm_raw(false, true, rows, cols, hd, 1.f, dyh + r0 * s.ldy, s.ldy, v, s.ldkv, 0.f, dp + r0 * seq, seq);
      }
      for (int64_t r0 = last; r0 >= 0; r0 -= kAttnBlock) {  // dV += P^T dY
        const int64_t rows = std::min(kAttnBlock, seq - r0), cols = r0 + rows;
        kern::gemm_raw(true, false, cols, hd, rows, 1.f, p + r0 * seq, seq, dyh + r0 * s.ldy, s.ldy,
                       first && r0 == last ? 0.f : 1.f, dv, s.ldkv);
      }
      kern::causal_softmax_backward(p, dp, seq, seq, scale);  // dP -> dS
      kern::round_activations(dev, dp, seq * seq);            // bf16 dS into dQ and dK
      for (int64_t r0 = 0; r0 < seq; r0 += kAttnBlock) {      // dQ = dS K
        const int64_t rows = std::min(kAttnBlock, seq - r0), cols = r0 + rows;
        kern::gemm_raw(false, false, rows, hd, cols, 1.f, dp + r0 * seq, seq, k, s.ldkv, 0.f, dq + r0 * s.ldq, s.ldq);
      }
      for (int64_t r0 = last; r0 >= 0; r0 -= kAttnBlock) {  // dK += dS^T Q
        const int64_t rows = std::min(kAttnBlock, seq - r0), cols = r0 + rows;
        kern::gemm_raw(true, false, cols, hd, rows, 1.f, dp + r0 * seq, seq, q + r0 * s.ldq, s.ldq,
                       first && r0 == last ? 0.f : 1.f, dk, s.ldkv);
      }
    }
  }
  // dQ, dK and dV summed in fp32 (over row blocks and a K/V head's query heads), stored once.
  kern::round_activations(dev, dq_all, s.batch * seq, s.heads * hd, s.ldq);
  kern::round_activations(dev, dk_all, s.batch * seq, s.kv_heads * hd, s.ldkv);
  kern::round_activations(dev, dv_all, s.batch * seq, s.kv_heads * hd, s.ldkv);
  kern::charge(dev, cost::gqa_attention_backward(s.batch, s.heads, s.kv_heads, seq, hd));
}

void cached_attention_forward(Device* dev, const AttentionShape& s, const float* q_all, const float* k_new,
                              const float* v_new, KvCache& cache, int64_t layer, const std::vector<int>& slots,
                              const std::vector<int64_t>& lens, float* scratch, float* y) {
  check(s);
  const int64_t hd = s.head_dim, group = s.heads / s.kv_heads, w = s.kv_heads * hd;
  TESSERA_CHECK(cache.kv_width() == w && slots.size() == lens.size(), "cached attention: cache width ",
                cache.kv_width(), " for ", s.kv_heads, " K/V heads of ", hd);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  int64_t row0 = 0, q_rows = 0, scores = 0, kv_rows = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    const int slot = slots[i];
    const int64_t n = lens[i], past = cache.length(slot), ctx = past + n;
    TESSERA_CHECK(ctx <= cache.capacity(slot), "cached attention: slot ", slot, " holds ", cache.capacity(slot),
                  " tokens, not ", ctx);
    float* kc = cache.k(layer, slot);
    float* vc = cache.v(layer, slot);
    for (int64_t r = 0; r < n; ++r) {
      std::memcpy(kc + (past + r) * w, k_new + (row0 + r) * s.ldkv, sizeof(float) * static_cast<size_t>(w));
      std::memcpy(vc + (past + r) * w, v_new + (row0 + r) * s.ldkv, sizeof(float) * static_cast<size_t>(w));
    }
    for (int64_t h = 0; h < s.heads; ++h) {
      const float* kh = kc + (h / group) * hd;
      const float* vh = vc + (h / group) * hd;
      // Row blocks: the block's last row sees keys [0, past + r0 + rows); later keys are masked.
      for (int64_t r0 = 0; r0 < n; r0 += kCachedAttentionBlock) {
        const int64_t rows = std::min(kCachedAttentionBlock, n - r0), cols = past + r0 + rows;
        const float* q = q_all + (row0 + r0) * s.ldq + h * hd;
        kern::gemm_raw(false, true, rows, cols, hd, 1.f, q, s.ldq, kh, w, 0.f, scratch, cols);
        for (int64_t r = 0; r < rows; ++r) {  // softmax over keys [0, past + r0 + r]
          float* p = scratch + r * cols;
          const int64_t see = past + r0 + r + 1;
          float mx = p[0];
          for (int64_t j = 1; j < see; ++j) mx = std::max(mx, p[j]);
          float sum = 0;
          for (int64_t j = 0; j < see; ++j) {
            const float e = std::exp((p[j] - mx) * scale);
            p[j] = e;
            sum += e;
          }
          const float inv = 1.0f / sum;
          for (int64_t j = 0; j < see; ++j) p[j] *= inv;
          for (int64_t j = see; j < cols; ++j) p[j] = 0.f;
        }
        kern::round_activations(dev, scratch, rows * cols);  // bf16 probabilities into P V, as in training
        kern::gemm_raw(false, false, rows, hd, cols, 1.f, scratch, cols, vh, w, 0.f, y + (row0 + r0) * s.ldy + h * hd,
                       s.ldy);
      }
    }
    q_rows += n;
    scores += n * past + n * (n + 1) / 2;
    kv_rows += ctx;
    row0 += n;
  }
  kern::round_activations(dev, y, q_rows, s.heads * hd, s.ldy);
  kern::charge(dev, cost::cached_attention(s.heads, s.kv_heads, hd, q_rows, scores, kv_rows));
}

}  // namespace tessera::parallel::layers
