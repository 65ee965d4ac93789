#include "runtime/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <sstream>

#include "runtime/device.h"

namespace tessera {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::vector<int64_t> contiguous_strides(const Shape& shape) {
  std::vector<int64_t> st(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = acc;
    acc *= shape[i];
  }
  return st;
}

Storage::~Storage() {
  if (device_) {
    device_->free(data_, bytes_, charged_);
  } else {
    std::free(data_);
  }
}

std::shared_ptr<Storage> Storage::host(size_t bytes) {
  size_t rounded = (bytes + 63) & ~size_t{63};
  void* p = std::aligned_alloc(64, rounded ? rounded : 64);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, rounded);
  return std::make_shared<Storage>(p, bytes, nullptr);
}

namespace {

std::shared_ptr<Storage> allocate_storage(size_t bytes, Device* device, size_t charged) {
  if (!device) return Storage::host(bytes);
  void* p = device->allocate(bytes, charged);
  return std::make_shared<Storage>(p, bytes, charged, device);
}
std::shared_ptr<Storage> allocate_storage(size_t bytes, Device* device) {
  return allocate_storage(bytes, device, bytes);
}

void check_shape(const Shape& shape) {
  for (int64_t d : shape) TESSERA_ARG_CHECK(d >= 0, "negative dimension in shape ", shape_str(shape));
}

int64_t wrap_dim(int64_t dim, int64_t ndim) {
  if (dim < 0) dim += ndim;
  TESSERA_ARG_CHECK(dim >= 0 && dim < ndim, "dimension ", dim, " out of range for a ", ndim, "-d tensor");
  return dim;
}

// Calls fn(dst_row_ptr, src_row_ptr, row_len) for every innermost row of two
// tensors of the same shape (each may be strided). Rows with a unit inner
// stride on both sides are passed whole; otherwise fn gets one element.
template <typename Fn>
void for_each_row(const Tensor& dst, const Tensor& src, Fn fn) {
  const int64_t nd = dst.dim();
  const size_t des = dst.element_size(), ses = src.element_size();
  char* dbase = static_cast<char*>(dst.raw_data());
  const char* sbase = static_cast<const char*>(src.raw_data());
  if (dst.numel() == 0) return;
  if (nd == 0) {
    fn(dbase, sbase, 1);
    return;
  }
  const auto& shape = dst.shape();
  const int64_t inner = shape[nd - 1];
  const bool unit = dst.strides()[nd - 1] == 1 && src.strides()[nd - 1] == 1;
  std::vector<int64_t> idx(nd, 0);
  const int64_t rows = dst.numel() / std::max<int64_t>(inner, 1);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t doff = 0, soff = 0;
    for (int64_t d = 0; d < nd - 1; ++d) {
      doff += idx[d] * dst.strides()[d];
      soff += idx[d] * src.strides()[d];
    }
    if (unit) {
      fn(dbase + doff * des, sbase + soff * ses, inner);
    } else {
      for (int64_t i = 0; i < inner; ++i) {
        fn(dbase + (doff + i * dst.strides()[nd - 1]) * des, sbase + (soff + i * src.strides()[nd - 1]) * ses, 1);
      }
    }
    for (int64_t d = nd - 2; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

}  // namespace

Tensor::Tensor(std::shared_ptr<Storage> storage, DType dtype, Shape shape, std::vector<int64_t> strides,
               int64_t offset_elems)
    : storage_(std::move(storage)),
      dtype_(dtype),
      shape_(std::move(shape)),
      strides_(std::move(strides)),
      offset_(offset_elems) {
  TESSERA_CHECK_EQ(shape_.size(), strides_.size());
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device* device) {
  check_shape(shape);
  size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  return Tensor(allocate_storage(bytes, device), dtype, shape, contiguous_strides(shape), 0);
}

Tensor Tensor::container(const Shape& shape, DType held, Device* device) {
  check_shape(shape);
  TESSERA_ARG_CHECK(held == DType::F32 || held == DType::BF16, "a float container holds f32 or bf16, not ",
                    dtype_name(held));
  const auto n = static_cast<size_t>(shape_numel(shape));
  return Tensor(allocate_storage(n * 4, device, n * dtype_size(held)), DType::F32, shape, contiguous_strides(shape), 0);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device* device) {
  Tensor t = empty(shape, dtype, device);
  t.fill(value);
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape, DType dtype, Device* device) {
  TESSERA_ARG_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_vector: ", values.size(),
                    " values for shape ", shape_str(shape));
  Tensor t = empty(shape, dtype, device);
  convert(values.data(), DType::F32, t.raw_data(), dtype, values.size());
  return t;
}

int64_t Tensor::size(int64_t d) const { return shape_[static_cast<size_t>(wrap_dim(d, dim()))]; }

bool Tensor::is_contiguous() const { return strides_ == contiguous_strides(shape_) || numel() <= 1; }

void* Tensor::raw_data() const {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
}

Tensor Tensor::view(const Shape& shape) const {
  TESSERA_ARG_CHECK(is_contiguous(), "view of a non-contiguous tensor ", str(), "; call contiguous() first");
  Shape s = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      TESSERA_ARG_CHECK(infer < 0, "view: more than one -1 in ", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    TESSERA_ARG_CHECK(known > 0 && numel() % known == 0, "view: cannot infer ", shape_str(shape), " from ", str());
    s[static_cast<size_t>(infer)] = numel() / known;
  }
  TESSERA_ARG_CHECK(shape_numel(s) == numel(), "view: shape ", shape_str(s), " does not match ", str());
  return Tensor(storage_, dtype_, s, contiguous_strides(s), offset_);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end) const {
  d = wrap_dim(d, dim());
  const int64_t n = shape_[static_cast<size_t>(d)];
  TESSERA_ARG_CHECK(0 <= start && start <= end && end <= n, "slice [", start, ", ", end, ") out of range for dim ", d,
                    " of ", str());
  Shape s = shape_;
  s[static_cast<size_t>(d)] = end - start;
  return Tensor(storage_, dtype_, s, strides_, offset_ + start * strides_[static_cast<size_t>(d)]);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = wrap_dim(d, dim());
  Tensor t = slice(d, index, index + 1);
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  d0 = wrap_dim(d0, dim());
  d1 = wrap_dim(d1, dim());
  Tensor t = *this;
  std::swap(t.shape_[static_cast<size_t>(d0)], t.shape_[static_cast<size_t>(d1)]);
  std::swap(t.strides_[static_cast<size_t>(d0)], t.strides_[static_cast<size_t>(d1)]);
  return t;
}

std::vector<Tensor> Tensor::split(int64_t d, int64_t parts) const {
  d = wrap_dim(d, dim());
  TESSERA_ARG_CHECK(parts > 0, "split into ", parts, " parts");
  const int64_t n = shape_[static_cast<size_t>(d)];
  TESSERA_ARG_CHECK(n % parts == 0, "split: dim ", d, " of ", str(), " (size ", n, ") is not divisible by ", parts);
  return split_sizes(d, std::vector<int64_t>(static_cast<size_t>(parts), n / parts));
}

std::vector<Tensor> Tensor::split_sizes(int64_t d, const std::vector<int64_t>& sizes) const {
  d = wrap_dim(d, dim());
  int64_t total = 0;
  for (int64_t s : sizes) {
    TESSERA_ARG_CHECK(s >= 0, "split_sizes: negative size");
    total += s;
  }
  TESSERA_ARG_CHECK(total == shape_[static_cast<size_t>(d)], "split_sizes: sizes sum to ", total, " but dim ", d,
                    " of ", str(), " is ", shape_[static_cast<size_t>(d)]);
  std::vector<Tensor> out;
  int64_t at = 0;
  for (int64_t s : sizes) {
    out.push_back(slice(d, at, at + s));
    at += s;
  }
  return out;
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone(device());
}

Tensor Tensor::clone(Device* dev) const { return to(dtype_, dev); }

Tensor Tensor::to(DType dt, Device* dev) const {
  Tensor t = empty(shape_, dt, dev);
  t.copy_from(*this);
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  TESSERA_ARG_CHECK(src.shape_ == shape_, "copy_from: shape ", src.str(), " into ", str());
  const DType st = src.dtype_, dt = dtype_;
  for_each_row(*this, src, [&](char* d, const char* s, int64_t n) { convert(s, st, d, dt, static_cast<size_t>(n)); });
}

void Tensor::fill(double value) {
  if (numel() == 0) return;
  // Convert the value once, then replicate its bytes.
  alignas(8) char one[8];
  float f = static_cast<float>(value);
  switch (dtype_) {
    case DType::F32:
      std::memcpy(one, &f, 4);
      break;
    case DType::BF16: {
      uint16_t b = float_to_bf16_bits(f);
      std::memcpy(one, &b, 2);
      break;
    }
    case DType::F16: {
      uint16_t b = float_to_f16_bits(f);
      std::memcpy(one, &b, 2);
      break;
    }
    case DType::I32: {
      int32_t v = static_cast<int32_t>(value);
      std::memcpy(one, &v, 4);
      break;
    }
    case DType::I64: {
      int64_t v = static_cast<int64_t>(value);
      std::memcpy(one, &v, 8);
      break;
    }
  }
  const size_t es = element_size();
  for_each_row(*this, *this, [&](char* d, const char*, int64_t n) {
    for (int64_t i = 0; i < n; ++i) std::memcpy(d + i * es, one, es);
  });
}

double Tensor::item(int64_t flat) const {
  TESSERA_ARG_CHECK(flat >= 0 && flat < numel(), "item(", flat, ") out of range for ", str());
  int64_t off = 0, rem = flat;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    int64_t sz = shape_[static_cast<size_t>(d)];
    off += (rem % sz) * strides_[static_cast<size_t>(d)];
    rem /= sz;
  }
  const char* p = static_cast<const char*>(storage_->data()) + (offset_ + off) * static_cast<int64_t>(element_size());
  float f;
  switch (dtype_) {
    case DType::F32:
      std::memcpy(&f, p, 4);
      return f;
    case DType::BF16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      return bf16_bits_to_float(b);
    }
    case DType::F16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      return f16_bits_to_float(b);
    }
    case DType::I32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::I64: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return static_cast<double>(v);
    }
  }
  return 0;
}

std::vector<float> Tensor::to_float_vector() const {
  Tensor c = to(DType::F32);
  const float* p = c.data<float>();
  return std::vector<float>(p, p + c.numel());
}

std::string Tensor::str() const { return std::string(dtype_name(dtype_)) + shape_str(shape_); }

Tensor concat(const std::vector<Tensor>& parts, int64_t d, Device* device) {
  TESSERA_ARG_CHECK(!parts.empty(), "concat of no tensors");
  const Tensor& first = parts[0];
  d = wrap_dim(d, first.dim());
  Shape out_shape = first.shape();
  int64_t total = 0;
  for (const Tensor& p : parts) {
    TESSERA_ARG_CHECK(p.dim() == first.dim() && p.dtype() == first.dtype(), "concat: ", p.str(), " vs ", first.str());
    for (int64_t i = 0; i < first.dim(); ++i) {
      if (i != d) {
        TESSERA_ARG_CHECK(p.shape()[static_cast<size_t>(i)] == first.shape()[static_cast<size_t>(i)],
                          "concat: ", p.str(), " vs ", first.str(), " differ outside dim ", d);
      }
    }
    total += p.shape()[static_cast<size_t>(d)];
  }
  out_shape[static_cast<size_t>(d)] = total;
  Tensor out = Tensor::empty(out_shape, first.dtype(), device);
  int64_t at = 0;
  for (const Tensor& p : parts) {
    int64_t n = p.shape()[static_cast<size_t>(d)];
    out.slice(d, at, at + n).copy_from(p);
    at += n;
  }
  return out;
}

}  // namespace tessera
