// Reusable activation/gradient buffers: allocated on the Device the first
// time a size is needed and kept, so steady-state steps allocate nothing.
#pragma once

#include <cstdint>

#include "runtime/device.h"
#include "runtime/tensor.h"

namespace tessera::parallel::layers {

// Returns t's data, (re)allocating t on `device` when it holds fewer than n
// floats: an activation buffer, which the device holds in its activation
// dtype (bf16 values in float containers under mixed precision, charged 2
// bytes each; runtime/kernels.h).
inline float* ensure_buffer(Tensor& t, Device* device, int64_t n) {
  if (!t.defined() || t.numel() < n) t = Tensor::container({n}, device ? device->act_dtype() : DType::F32, device);
  return t.data<float>();
}

// The same for buffers that stay fp32 whatever the precision (norm
// statistics, per-token losses, the loss's scratch).
inline float* ensure_f32_buffer(Tensor& t, Device* device, int64_t n) {
  if (!t.defined() || t.numel() < n) t = Tensor::empty({n}, DType::F32, device);
  return t.data<float>();
}

}  // namespace tessera::parallel::layers
