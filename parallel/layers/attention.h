// Causal grouped-query attention (Hugging Face's LlamaAttention after the
// projections and rotary embeddings: repeat_kv, softmax(Q K^T / sqrt(d) +
// causal mask), P V), on one rank's heads. Query head h reads K/V head
// h / (heads / kv_heads); kv_heads == heads is multi-head attention, 1 is
// multi-query attention. Computed in row blocks (the blocks above the
// diagonal are skipped) into caller-owned buffers: nothing is allocated.
// Charged to the device as one fused kernel (cost::gqa_attention_*).
// Reentrant.
#pragma once

#include <cstdint>
#include <vector>

namespace tessera {
class Device;
}

namespace tessera::parallel::layers {

class KvCache;

struct AttentionShape {
  int64_t batch = 1, seq = 1;
  int64_t heads = 1, kv_heads = 1, head_dim = 1;
  // Row strides of q (and dq), k and v (and dk, dv), y (and dy); row b * seq + t is token t of sequence b.
  int64_t ldq = 0, ldkv = 0, ldy = 0;
};

// q: [batch seq, heads head_dim], k, v: [batch seq, kv_heads head_dim] (after
// the rotary embedding). probs: batch heads seq seq floats (saved for the
// backward). y: [batch seq, heads head_dim].
void gqa_attention_forward(Device* dev, const AttentionShape& s, const float* q, const float* k, const float* v,
                           float* probs, float* y);
// dy as y; dprobs: seq seq floats of scratch. Writes (not accumulates) dq, dk, dv.
void gqa_attention_backward(Device* dev, const AttentionShape& s, const float* q, const float* k, const float* v,
                            const float* probs, const float* dy, float* dprobs, float* dq, float* dk, float* dv);

// Inference against a KV cache, padding-free: sequence i (cache slot
// slots[i]) brings lens[i] new rows, consecutive in q/k/v/y in sequence
// order, at positions [cache.length(slot), + lens[i]). Copies the new K and V
// rows (already rotated) into the cache's layer `layer` (not advanced: the
// caller advances after the last layer), then each new query row attends to
// its sequence's keys up to its own position: softmax(q K^T / sqrt(d)) V.
// Uses s.heads, s.kv_heads, s.head_dim and the strides (batch and seq
// unused). scratch: at least kCachedAttentionBlock x (longest context) floats.
// Charged as one kernel (cost::cached_attention).
constexpr int64_t kCachedAttentionBlock = 64;
void cached_attention_forward(Device* dev, const AttentionShape& s, const float* q, const float* k, const float* v,
                              KvCache& cache, int64_t layer, const std::vector<int>& slots,
                              const std::vector<int64_t>& lens, float* scratch, float* y);

}  // namespace tessera::parallel::layers
