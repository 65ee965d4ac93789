// VocabParallelEmbedding (Megatron-LM / NxD): the token embedding [V, C]
// split by vocabulary rows over the TP group. Each rank looks up the tokens
// in its range (zeros elsewhere) and the partial results are summed over TP
// (all-reduce, or reduce-scatter to rows / tp under sequence parallelism).
// The same shard serves as the tied LM head (see cross_entropy.h).
// A vocabulary that does not divide over TP is padded on the last rank.
// Not thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "parallel/layers/parallel_state.h"
#include "parallel/layers/parameter.h"

namespace tessera::parallel::layers {

class VocabParallelEmbedding {
 public:
  VocabParallelEmbedding(const std::string& name, int64_t vocab, int64_t dim, const ParallelState& ps, float init_std);

  Parameter& weight() { return weight_; }
  int64_t vocab() const { return vocab_; }
  int64_t dim() const { return dim_; }
  int64_t vocab_start() const { return start_; }
  int64_t vocab_valid() const { return valid_; }  // real (unpadded) rows on this rank

  // tokens: [rows] ids in [0, vocab). out: [rows_out, dim], rows_out = rows / tp under SP.
  void forward(const int32_t* tokens, int64_t rows, float* out);
  // dout: [rows_out, dim]. Accumulates into the weight gradient.
  void backward(const int32_t* tokens, int64_t rows, const float* dout);

 private:
  const ParallelState& ps_;
  int64_t vocab_, dim_, start_, valid_;
  Parameter weight_;
  Tensor full_, dfull_;
};

}  // namespace tessera::parallel::layers
