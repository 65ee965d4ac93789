// Rotary position embeddings as Hugging Face's LlamaRotaryEmbedding computes
// them (rotate-half layout): inv_freq[i] = theta^(-2i / d) for i < d / 2,
// with Llama 3.1's "llama3" rope_scaling (modeling_rope_utils.py's
// _compute_llama3_parameters: frequencies whose wavelength exceeds
// original_max_position_embeddings / low_freq_factor divided by `factor`,
// those below original / high_freq_factor kept, a smooth interpolation in
// between), computed in float32 as torch does; cos/sin of position x
// inv_freq, each half repeated ([cos(f), cos(f)] over head_dim).
// Not thread-safe (one instance per model; the tables are read-only after construction).
#pragma once

#include <cstdint>
#include <vector>

#include "parallel/model_config.h"
#include "runtime/tensor.h"

namespace tessera::parallel::layers {

// The head_dim / 2 inverse frequencies (float32 arithmetic as torch's).
std::vector<float> rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& scaling);

class RotaryEmbedding {
 public:
  // Tables for positions [0, max_seq), allocated on `device` (may be null) once.
  RotaryEmbedding(int64_t head_dim, int64_t max_seq, double theta, const RopeScaling& scaling, Device* device);

  int64_t head_dim() const { return head_dim_; }
  int64_t max_seq() const { return max_seq_; }
  const float* cos() const { return cos_.data<float>(); }  // [max_seq, head_dim]
  const float* sin() const { return sin_.data<float>(); }

  // In place on rows x heads heads of head_dim (row stride ld), row r at position r % seq (seq <= max_seq).
  void forward(Device* dev, float* x, int64_t ld, int64_t rows, int64_t seq, int64_t heads) const;
  // forward with row r at position positions[r] (< max_seq, checked): a KV-cache forward.
  void forward_at(Device* dev, float* x, int64_t ld, int64_t rows, const int64_t* positions, int64_t heads) const;
  // The gradient through forward, in place (the transpose rotation).
  void backward(Device* dev, float* dx, int64_t ld, int64_t rows, int64_t seq, int64_t heads) const;

 private:
  int64_t head_dim_, max_seq_;
  Tensor cos_, sin_;
};

}  // namespace tessera::parallel::layers
