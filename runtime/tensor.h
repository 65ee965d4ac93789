// Tensor: a typed, strided view of a reference-counted Storage.
//
// Storage is allocated either on an emulated core (Device), which charges the
// core's memory accounting for as long as any view of it lives, or on the host
// (device == nullptr, not charged). Views (view, slice, transpose, split)
// share storage; contiguous(), clone(), concat() and to() allocate.
// A Tensor is a value type: cheap to copy, not thread-safe to mutate.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/error.h"

namespace tessera {

class Device;

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

// Bytes owned by one allocation. Freed (and un-charged) when the last Tensor
// referring to it goes away.
class Storage {
 public:
  Storage(void* data, size_t bytes, Device* device) : data_(data), bytes_(bytes), charged_(bytes), device_(device) {}
  // Device storage charged `charged` bytes (Tensor::container).
  Storage(void* data, size_t bytes, size_t charged, Device* device)
      : data_(data), bytes_(bytes), charged_(charged), device_(device) {}
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  size_t charged_bytes() const { return charged_; }  // what the device counts
  Device* device() const { return device_; }

  // Host storage (not charged to any device), zero-filled.
  static std::shared_ptr<Storage> host(size_t bytes);

 private:
  void* data_;
  size_t bytes_, charged_;
  Device* device_;
};

class Tensor {
 public:
  Tensor() = default;

  // New zero-filled contiguous tensor on `device` (host when nullptr).
  static Tensor empty(const Shape& shape, DType dtype, Device* device = nullptr);
  static Tensor zeros(const Shape& shape, DType dtype, Device* device = nullptr) { return empty(shape, dtype, device); }
  static Tensor full(const Shape& shape, double value, DType dtype, Device* device = nullptr);
  // New zero-filled contiguous F32 tensor whose elements the device holds as
  // `held` (F32 or BF16): a bf16 tensor of a mixed-precision run in 4-byte
  // float containers (runtime/bf16.h), charged dtype_size(held) per element.
  static Tensor container(const Shape& shape, DType held, Device* device);
  // Copies `values` (converted to dtype).
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape, DType dtype = DType::F32,
                            Device* device = nullptr);
  // Wraps existing storage (used by checkpoint loaders and tests).
  Tensor(std::shared_ptr<Storage> storage, DType dtype, Shape shape, std::vector<int64_t> strides,
         int64_t offset_elems);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t d) const;
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  size_t element_size() const { return dtype_size(dtype_); }
  int64_t offset() const { return offset_; }
  bool is_contiguous() const;
  Device* device() const { return storage_ ? storage_->device() : nullptr; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  // Pointer to the first element. data<T>() checks that T matches dtype
  // (uint16_t for bf16/f16).
  void* raw_data() const;
  template <typename T>
  T* data() const;

  // ---- views (share storage) ----
  Tensor view(const Shape& shape) const;                        // contiguous only; one dim may be -1
  Tensor slice(int64_t dim, int64_t start, int64_t end) const;  // [start, end)
  Tensor select(int64_t dim, int64_t index) const;              // drops dim
  Tensor transpose(int64_t d0, int64_t d1) const;
  // `parts` equal pieces along dim (dim size must divide); views.
  std::vector<Tensor> split(int64_t dim, int64_t parts) const;
  // Pieces of the given sizes along dim; views.
  std::vector<Tensor> split_sizes(int64_t dim, const std::vector<int64_t>& sizes) const;

  // ---- copies ----
  Tensor contiguous() const;                     // self when already contiguous
  Tensor clone(Device* device = nullptr) const;  // always a new contiguous tensor
  Tensor to(DType dtype, Device* device = nullptr) const;
  // Copies src (same shape; dtype converted) into this tensor's elements.
  void copy_from(const Tensor& src);
  void fill(double value);

  // Element i of the flattened (logical, row-major) tensor, as double.
  double item(int64_t flat_index) const;
  std::vector<float> to_float_vector() const;

  std::string str() const;  // "f32[2, 3]"

 private:
  std::shared_ptr<Storage> storage_;
  DType dtype_ = DType::F32;
  Shape shape_;
  std::vector<int64_t> strides_;
  int64_t offset_ = 0;  // in elements
};

// Concatenates along dim into a new contiguous tensor on `device`.
Tensor concat(const std::vector<Tensor>& parts, int64_t dim, Device* device = nullptr);

std::vector<int64_t> contiguous_strides(const Shape& shape);

template <typename T>
T* Tensor::data() const {
  constexpr bool kIsF32 = std::is_same_v<T, float>;
  constexpr bool kIs16 = std::is_same_v<T, uint16_t>;
  constexpr bool kIsI32 = std::is_same_v<T, int32_t>;
  constexpr bool kIsI64 = std::is_same_v<T, int64_t>;
  static_assert(kIsF32 || kIs16 || kIsI32 || kIsI64, "data<T>: T must be float, uint16_t, int32_t or int64_t");
  bool match = (kIsF32 && dtype_ == DType::F32) || (kIs16 && (dtype_ == DType::BF16 || dtype_ == DType::F16)) ||
               (kIsI32 && dtype_ == DType::I32) || (kIsI64 && dtype_ == DType::I64);
  TESSERA_CHECK(match, "data<T>() does not match dtype ", dtype_name(dtype_));
  return static_cast<T*>(raw_data());
}

}  // namespace tessera
