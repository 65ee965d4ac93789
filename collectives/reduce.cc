#include "collectives/reduce.h"

#include <algorithm>
#include <cstdint>

namespace tessera::collectives {

namespace {

// Plain loops over __restrict-free pointers that the compiler vectorises
// (dst may alias an input, so no restrict).
template <typename T, typename F>
void apply(T* dst, const T* a, const T* b, size_t n, F f) {
  for (size_t i = 0; i < n; ++i) dst[i] = f(a[i], b[i]);
}

template <typename T>
void reduce_typed(void* dst, const void* a, const void* b, size_t n, ReduceOp op) {
  auto* d = static_cast<T*>(dst);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      apply(d, x, y, n, [](T u, T v) { return static_cast<T>(u + v); });
      break;
    case ReduceOp::Prod:
      apply(d, x, y, n, [](T u, T v) { return static_cast<T>(u * v); });
      break;
    case ReduceOp::Min:
      apply(d, x, y, n, [](T u, T v) { return v < u ? v : u; });
      break;
    case ReduceOp::Max:
      apply(d, x, y, n, [](T u, T v) { return u < v ? v : u; });
      break;
  }
}

// Integer sums and products wrap (two's complement) rather than being UB.
template <typename T, typename U>
void reduce_int(void* dst, const void* a, const void* b, size_t n, ReduceOp op) {
  auto* d = static_cast<T*>(dst);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      apply(d, x, y, n, [](T u, T v) { return static_cast<T>(static_cast<U>(u) + static_cast<U>(v)); });
      break;
    case ReduceOp::Prod:
      apply(d, x, y, n, [](T u, T v) { return static_cast<T>(static_cast<U>(u) * static_cast<U>(v)); });
      break;
    default:
      reduce_typed<T>(dst, a, b, n, op);
  }
}

}  // namespace

void reduce2(void* dst, const void* a, const void* b, size_t n, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::F32:
      reduce_typed<float>(dst, a, b, n, op);
      return;
    case DType::I32:
      reduce_int<int32_t, uint32_t>(dst, a, b, n, op);
      return;
    case DType::I64:
      reduce_int<int64_t, uint64_t>(dst, a, b, n, op);
      return;
    default:
      TESSERA_CHECK(false, "reduce2 on ", dtype_name(dtype), " (reduced in f32 by the communicator)");
  }
}

void divide(void* buf, size_t n, DType dtype, int divisor) {
  switch (dtype) {
    case DType::F32: {
      auto* d = static_cast<float*>(buf);
      const float q = static_cast<float>(divisor);
      for (size_t i = 0; i < n; ++i) d[i] /= q;
      return;
    }
    case DType::I32: {
      auto* d = static_cast<int32_t*>(buf);
      for (size_t i = 0; i < n; ++i) d[i] /= divisor;
      return;
    }
    case DType::I64: {
      auto* d = static_cast<int64_t*>(buf);
      for (size_t i = 0; i < n; ++i) d[i] /= divisor;
      return;
    }
    default:
      TESSERA_CHECK(false, "divide on ", dtype_name(dtype));
  }
}

}  // namespace tessera::collectives
