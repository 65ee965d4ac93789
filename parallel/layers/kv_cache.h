// KvCache: one TP rank's key/value cache for generation (inference), on the
// rank's Device: for every layer the K and V rows of each sequence slot's
// tokens so far, this rank's K/V heads only (max(1, kv_heads / tp) of
// head_dim; the replicated K/V head when tp exceeds kv_heads).
//
// Slot s holds capacity(s) tokens; the slots sit one after the other in one
// allocation of 2 x layers x (sum of capacities) x kv_width elements in the
// device's activation dtype (bf16 charged 2 bytes), made once at
// construction: DeviceOutOfMemory when the device cannot hold it. A
// forward pass (CausalLM::forward_cached) writes each sequence's new rows at
// positions [length, length + n) of every layer, then advance()s it.
// Not thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/tensor.h"

namespace tessera::parallel::layers {

class KvCache {
 public:
  // kv_width: local K/V heads x head_dim. Throws InvalidArgument for
  // non-positive sizes, DeviceOutOfMemory when the device is full.
  KvCache(Device* device, int64_t layers, int64_t kv_width, const std::vector<int64_t>& capacity);

  int64_t layers() const { return layers_; }
  int64_t kv_width() const { return width_; }
  int slots() const { return static_cast<int>(cap_.size()); }
  int64_t capacity(int slot) const { return cap_.at(static_cast<size_t>(slot)); }
  int64_t length(int slot) const { return len_.at(static_cast<size_t>(slot)); }
  // Slot `slot`'s rows of layer `layer`: [capacity(slot), kv_width], row t the token at position t.
  float* k(int64_t layer, int slot);
  float* v(int64_t layer, int slot);
  // After a forward wrote n rows at [length, length + n) in every layer.
  void advance(int slot, int64_t n);
  // Empties a slot for a new sequence (continuous batching).
  void reset(int slot) { len_.at(static_cast<size_t>(slot)) = 0; }
  // Bytes the device counts for the cache.
  uint64_t bytes() const { return bytes_; }
  // Bytes a cache of `tokens` tokens in total needs, at `elem_bytes` per element.
  static uint64_t bytes_for(int64_t layers, int64_t kv_width, int64_t tokens, size_t elem_bytes);

 private:
  int64_t layers_, width_, total_ = 0;
  std::vector<int64_t> cap_, len_, offset_;
  uint64_t bytes_ = 0;
  Tensor data_;
};

}  // namespace tessera::parallel::layers
