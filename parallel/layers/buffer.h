// Reusable activation/gradient buffers: allocated on the Device the first
// time a size is needed and kept, so steady-state steps allocate nothing.
#pragma once

#include <cstdint>

#include "runtime/tensor.h"

namespace tessera::parallel::layers {

// Returns t's data, (re)allocating t on `device` when it holds fewer than n floats.
inline float* ensure_buffer(Tensor& t, Device* device, int64_t n) {
  if (!t.defined() || t.numel() < n) t = Tensor::empty({n}, DType::F32, device);
  return t.data<float>();
}

}  // namespace tessera::parallel::layers
