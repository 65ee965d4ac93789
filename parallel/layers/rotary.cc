#include "parallel/layers/rotary.h"

#include <cmath>

#include "runtime/error.h"
#include "runtime/kernels.h"

namespace tessera::parallel::layers {

std::vector<float> rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& s) {
  TESSERA_ARG_CHECK(head_dim > 0 && head_dim % 2 == 0, "rotary embeddings need an even head size, not ", head_dim);
  const int64_t half = head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  // _compute_default_rope_parameters: 1 / base^(arange(0, d, 2) / d), float32.
  for (int64_t i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv[static_cast<size_t>(i)] = 1.0f / std::pow(static_cast<float>(theta), e);
  }
  if (s.type.empty()) return inv;
  TESSERA_ARG_CHECK(s.type == "llama3", "rope_scaling type must be llama3 (or none), not '", s.type, "'");
  // _compute_llama3_parameters, step by step in float32.
  const float factor = static_cast<float>(s.factor), low = static_cast<float>(s.low_freq_factor),
              high = static_cast<float>(s.high_freq_factor);
  const float old_len = static_cast<float>(s.original_max_position_embeddings);
  const float low_wavelen = old_len / low, high_wavelen = old_len / high;
  const float two_pi = static_cast<float>(2 * M_PI);
  for (float& f : inv) {
    const float wavelen = two_pi / f;
    float llama = wavelen > low_wavelen ? f / factor : f;
    const float smooth = (old_len / wavelen - low) / (high - low);
    const float smoothed = (1 - smooth) * llama / factor + smooth * llama;
    const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    f = medium ? smoothed : llama;
  }
  return inv;
}

RotaryEmbedding::RotaryEmbedding(int64_t head_dim, int64_t max_seq, double theta, const RopeScaling& scaling,
                                 Device* device)
    : head_dim_(head_dim), max_seq_(max_seq) {
  TESSERA_ARG_CHECK(max_seq > 0, "rotary embeddings need a positive max_seq, not ", max_seq);
  const std::vector<float> inv = rope_inv_freq(head_dim, theta, scaling);
  const int64_t half = head_dim / 2;
  cos_ = Tensor::empty({max_seq, head_dim}, DType::F32, device);
  sin_ = Tensor::empty({max_seq, head_dim}, DType::F32, device);
  float* c = cos_.data<float>();
  float* s = sin_.data<float>();
  for (int64_t p = 0; p < max_seq; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const float f = static_cast<float>(p) * inv[static_cast<size_t>(i)];  // freqs = position x inv_freq (float32)
      c[p * head_dim + i] = c[p * head_dim + half + i] = std::cos(f);
      s[p * head_dim + i] = s[p * head_dim + half + i] = std::sin(f);
    }
  }
}

void RotaryEmbedding::forward(Device* dev, float* x, int64_t ld, int64_t rows, int64_t seq, int64_t heads) const {
  TESSERA_CHECK(seq <= max_seq_, "rotary: sequence ", seq, " exceeds the table's ", max_seq_, " positions");
  kern::rope_forward(dev, x, ld, rows, seq, heads, head_dim_, cos(), sin());
}

void RotaryEmbedding::forward_at(Device* dev, float* x, int64_t ld, int64_t rows, const int64_t* positions,
                                 int64_t heads) const {
  for (int64_t r = 0; r < rows; ++r)
    TESSERA_CHECK(positions[r] >= 0 && positions[r] < max_seq_, "rotary: position ", positions[r],
                  " outside the table's ", max_seq_, " positions");
  kern::rope_forward_at(dev, x, ld, rows, positions, heads, head_dim_, cos(), sin());
}

void RotaryEmbedding::backward(Device* dev, float* dx, int64_t ld, int64_t rows, int64_t seq, int64_t heads) const {
  TESSERA_CHECK(seq <= max_seq_, "rotary: sequence ", seq, " exceeds the table's ", max_seq_, " positions");
  kern::rope_backward(dev, dx, ld, rows, seq, heads, head_dim_, cos(), sin());
}

}  // namespace tessera::parallel::layers
