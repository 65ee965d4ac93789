// Vocab-parallel cross-entropy (Megatron-LM's _VocabParallelCrossEntropy):
// each TP rank holds the logits of its vocabulary shard only; the full
// logits are never gathered. Three reductions over TP of `rows` floats (max,
// then sum of exponentials and target logit together) give the exact loss.
// The backward is fused: the logits buffer is overwritten with
// grad_scale * (softmax - onehot(target)), the gradient of
// grad_scale * sum_r loss[r] w.r.t. the logits.
// Collective over the TP group; not thread-safe.
#pragma once

#include <cstdint>

#include "parallel/layers/parallel_state.h"

namespace tessera::parallel::layers {

// logits: [rows, n_local] with row stride ld, for vocabulary ids
// [vocab_start, vocab_start + n_local). targets: [rows] full ids. Writes
// loss[r] (nats). scratch: 3 * rows floats. When want_grad is false the
// logits are left holding exponentials (scratch use), not gradients.
void vocab_parallel_cross_entropy(const ParallelState& ps, float* logits, int64_t rows, int64_t n_local, int64_t ld,
                                  int64_t vocab_start, const int32_t* targets, bool want_grad, float grad_scale,
                                  float* loss, float* scratch);

}  // namespace tessera::parallel::layers
