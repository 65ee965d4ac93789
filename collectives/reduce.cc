#include "collectives/reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define TESSERA_REDUCE_STREAMING 1
#else
#define TESSERA_REDUCE_STREAMING 0
#endif

namespace tessera::collectives {

namespace {

// Plain loops over __restrict-free pointers that the compiler vectorises
// (dst may alias an input, so no restrict).
template <typename T, typename F>
void apply_cached(T* dst, const T* a, const T* b, size_t n, F f) {
  for (size_t i = 0; i < n; ++i) dst[i] = f(a[i], b[i]);
}

#if TESSERA_REDUCE_STREAMING
// Streaming stores (docs/algorithms.md, "Reduction kernels"): each 1 KiB
// tile is computed into a local buffer by the same vectorised loop, then
// written to dst with non-temporal 32-byte stores, which skip reading dst's
// lines into the cache first (a cold dst otherwise costs a read for every
// line written: a third more memory traffic for an out-of-place reduction
// that is bound by memory). Only for dst aliasing neither input (an in-place
// dst is in the cache already, where a plain store is cheaper).
template <typename T, typename F>
__attribute__((target("avx2"))) void apply_streaming(T* dst, const T* a, const T* b, size_t n, F f) {
  constexpr size_t kTile = 1024 / sizeof(T), kVec = 32 / sizeof(T);
  size_t i = 0;
  for (; i < n && (reinterpret_cast<uintptr_t>(dst + i) % 32) != 0; ++i) dst[i] = f(a[i], b[i]);
  alignas(32) T tile[kTile];
  for (; i + kTile <= n; i += kTile) {
    for (size_t j = 0; j < kTile; ++j) tile[j] = f(a[i + j], b[i + j]);
    for (size_t j = 0; j < kTile; j += kVec)
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + j),
                          _mm256_load_si256(reinterpret_cast<const __m256i*>(tile + j)));
  }
  for (; i < n; ++i) dst[i] = f(a[i], b[i]);
  _mm_sfence();  // the stores are weakly ordered: visible before anyone is told
}

bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}

// Non-temporal copy of a 32-byte aligned `src` (the algorithms' cached
// tiles); `dst` is aligned by a plain head first.
__attribute__((target("avx2"))) void copy_streaming_avx2(unsigned char* dst, const unsigned char* src, size_t n) {
  size_t i = 0;
  for (; i < n && (reinterpret_cast<uintptr_t>(dst + i) % 32) != 0; ++i) dst[i] = src[i];
  for (; i + 128 <= n; i += 128)
    for (size_t j = 0; j < 128; j += 32)
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + j),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + j)));
  for (; i + 32 <= n; i += 32)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
  for (; i < n; ++i) dst[i] = src[i];
}
#endif

// Outputs of at least this many bytes, written to a dst that aliases neither
// input, use streaming stores (when the CPU has them): an output this large
// is not read again soon from the cache (the next step sends it, or the
// caller reads it later), and the pieces the shm algorithms reduce to push
// on while still in cache (16 KiB) and the shm transport's fragments (at
// most 512 KiB, whose result a ring sends on next) stay below it.
constexpr size_t kStreamingBytes = size_t{1} << 20;

template <typename T, typename F>
void apply(T* dst, const T* a, const T* b, size_t n, F f) {
#if TESSERA_REDUCE_STREAMING
  if (n * sizeof(T) >= kStreamingBytes && dst != a && dst != b && has_avx2()) return apply_streaming(dst, a, b, n, f);
#endif
  apply_cached(dst, a, b, n, f);
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

bool reduce2_streams(size_t n, DType dtype, bool aliased) {
#if TESSERA_REDUCE_STREAMING
  return !aliased && kernel_dtype(dtype) && n * dtype_size(dtype) >= kStreamingBytes && has_avx2();
#else
  (void)n, (void)dtype, (void)aliased;
  return false;
#endif
}

bool streaming_stores() {
#if TESSERA_REDUCE_STREAMING
  return has_avx2();
#else
  return false;
#endif
}

void copy_streaming(void* dst, const void* src, size_t bytes) {
#if TESSERA_REDUCE_STREAMING
  if (has_avx2())
    return copy_streaming_avx2(static_cast<unsigned char*>(dst), static_cast<const unsigned char*>(src), bytes);
#endif
  if (bytes) std::memcpy(dst, src, bytes);
}

void streaming_fence() {
#if TESSERA_REDUCE_STREAMING
  _mm_sfence();
#endif
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
