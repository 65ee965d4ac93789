#include "parallel/layers/kv_cache.h"

#include "runtime/device.h"
#include "runtime/error.h"

namespace tessera::parallel::layers {

KvCache::KvCache(Device* device, int64_t layers, int64_t kv_width, const std::vector<int64_t>& capacity)
    : layers_(layers), width_(kv_width), cap_(capacity), len_(capacity.size(), 0) {
  TESSERA_ARG_CHECK(layers > 0 && kv_width > 0 && !capacity.empty(), "KV cache: ", layers, " layers of width ",
                    kv_width, " for ", capacity.size(), " sequences");
  offset_.reserve(cap_.size());
  for (int64_t c : cap_) {
    TESSERA_ARG_CHECK(c > 0, "KV cache: a sequence slot of ", c, " tokens");
    offset_.push_back(total_);
    total_ += c;
  }
  const DType dt = device ? device->act_dtype() : DType::F32;
  bytes_ = bytes_for(layers_, width_, total_, dtype_size(dt));
  data_ = Tensor::container({2 * layers_ * total_ * width_}, dt, device);
}

uint64_t KvCache::bytes_for(int64_t layers, int64_t kv_width, int64_t tokens, size_t elem_bytes) {
  return static_cast<uint64_t>(2 * layers * tokens * kv_width) * elem_bytes;
}

float* KvCache::k(int64_t layer, int slot) {
  return data_.data<float>() + (layer * total_ + offset_.at(static_cast<size_t>(slot))) * width_;
}

float* KvCache::v(int64_t layer, int slot) {
  return data_.data<float>() + ((layers_ + layer) * total_ + offset_.at(static_cast<size_t>(slot))) * width_;
}

void KvCache::advance(int slot, int64_t n) {
  int64_t& l = len_.at(static_cast<size_t>(slot));
  TESSERA_CHECK(l + n <= capacity(slot), "KV cache slot ", slot, ": ", l, " + ", n, " tokens exceed its ",
                capacity(slot));
  l += n;
}

}  // namespace tessera::parallel::layers
