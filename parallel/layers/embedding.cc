#include "parallel/layers/embedding.h"

#include <algorithm>
#include <cstring>

#include "parallel/layers/buffer.h"
#include "runtime/kernels.h"

namespace tessera::parallel::layers {

VocabParallelEmbedding::VocabParallelEmbedding(const std::string& name, int64_t vocab, int64_t dim,
                                               const ParallelState& ps, float init_std)
    : ps_(ps), vocab_(vocab), dim_(dim) {
  weight_ = make_parameter(name, {vocab, dim}, 0, 1, ps.tp_size, ps.tp_rank, Init::Normal, init_std, true);
  const int64_t local = weight_.shape[0];
  start_ = ps.tp_rank * local;
  valid_ = std::clamp<int64_t>(vocab - start_, 0, local);
}

void VocabParallelEmbedding::forward(const int32_t* tokens, int64_t rows, float* out) {
  float* full = ps_.sp() ? ensure_buffer(full_, ps_.device, rows * dim_) : out;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t t = tokens[r] - start_;
    float* o = full + r * dim_;
    if (t >= 0 && t < valid_) {
      std::memcpy(o, weight_.value + t * dim_, sizeof(float) * dim_);
    } else {
      std::memset(o, 0, sizeof(float) * dim_);
    }
  }
  kern::charge(ps_.device, cost::embedding_forward(rows, dim_));
  if (ps_.sp()) {
    ps_.tp_reduce_scatter(full, out, rows / ps_.tp_size * dim_);
  } else {
    ps_.tp_all_reduce(out, rows * dim_);
  }
}

void VocabParallelEmbedding::backward(const int32_t* tokens, int64_t rows, const float* dout) {
  const float* d = dout;
  if (ps_.sp()) {
    float* full = ensure_buffer(dfull_, ps_.device, rows * dim_);
    ps_.tp_all_gather(dout, full, rows / ps_.tp_size * dim_);
    d = full;
  }
  for (int64_t r = 0; r < rows; ++r) {
    int64_t t = tokens[r] - start_;
    if (t < 0 || t >= valid_) continue;
    float* g = weight_.grad + t * dim_;
    const float* dr = d + r * dim_;
    for (int64_t j = 0; j < dim_; ++j) g[j] += dr[j];
  }
  kern::round_grads(ps_.device, weight_.grad, valid_ * dim_);  // summed in fp32, stored once
  kern::charge(ps_.device, cost::embedding_backward(rows, dim_));
}

}  // namespace tessera::parallel::layers
