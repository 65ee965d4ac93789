// reduce2 against a scalar reference, bit for bit: every kernel dtype and
// op, sizes on both sides of the streaming-store threshold (odd sizes, a dst
// that is not 32-byte aligned), out of place and in place on either input.
#include "collectives/reduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace tessera::collectives {
namespace {

template <typename T, typename U>
T ref_op(T u, T v, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      return static_cast<T>(static_cast<U>(u) + static_cast<U>(v));
    case ReduceOp::Prod:
      return static_cast<T>(static_cast<U>(u) * static_cast<U>(v));
    case ReduceOp::Min:
      return v < u ? v : u;
    case ReduceOp::Max:
      return u < v ? v : u;
  }
  return u;
}

template <typename T>
std::vector<T> values(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) {
    if constexpr (std::is_floating_point_v<T>) {
      v[i] = std::uniform_real_distribution<float>(-4.0f, 4.0f)(g);
      if (i % 997 == 5) v[i] = std::numeric_limits<T>::quiet_NaN();
      if (i % 1009 == 7) v[i] = -0.0f;
    } else {
      // Full range, so sums and products wrap.
      v[i] = static_cast<T>(
          std::uniform_int_distribution<int64_t>(std::numeric_limits<T>::min(), std::numeric_limits<T>::max())(g));
    }
  }
  return v;
}

// Runs every op and aliasing mode on n elements of T, dst offset by `shift`
// elements from an aligned allocation.
template <typename T, typename U>
void check(DType dt, size_t n, size_t shift) {
  const auto a = values<T>(n, 1), b = values<T>(n, 2);
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg}) {
    std::vector<T> want(n);
    for (size_t i = 0; i < n; ++i) {
      want[i] =
          std::is_floating_point_v<T> ? static_cast<T>(ref_op<T, T>(a[i], b[i], op)) : ref_op<T, U>(a[i], b[i], op);
    }
    for (int mode = 0; mode < 3; ++mode) {  // 0: dst separate, 1: dst == a, 2: dst == b
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + reduce_op_name(op) + " n=" + std::to_string(n) +
                   " shift=" + std::to_string(shift) + " mode=" + std::to_string(mode));
      std::vector<T> store(n + shift + 64), x = a, y = b;
      T* dst = store.data() + shift;
      const T* in1 = x.data();
      const T* in2 = y.data();
      // (n == 0: the empty vectors' data() may be null, which memcpy and
      // memcmp must not get even for 0 bytes.)
      if (mode == 1) {
        if (n) std::memcpy(dst, a.data(), n * sizeof(T));
        in1 = dst;
      } else if (mode == 2) {
        if (n) std::memcpy(dst, b.data(), n * sizeof(T));
        in2 = dst;
      }
      reduce2(dst, in1, in2, n, dt, op);
      if (n) {
        ASSERT_EQ(std::memcmp(dst, want.data(), n * sizeof(T)), 0);
      }
      // Nothing written past the end.
      for (size_t i = n + shift; i < store.size(); ++i) ASSERT_EQ(store[i], T{}) << "element " << i;
    }
  }
}

// Element counts: tiny, odd, one under and over the 1 MiB threshold (in
// bytes of T), and a large odd one that ends in a partial tile.
std::vector<size_t> sizes(size_t es) {
  const size_t t = (size_t{1} << 20) / es;
  return {0, 1, 7, 255, 1023, t - 1, t, t + 13, 3 * t + 777};
}

TEST(Reduce2, ExactForEveryDtypeAndOpAcrossTheStreamingThreshold) {
  for (size_t shift : {size_t{0}, size_t{1}, size_t{3}}) {
    for (size_t n : sizes(4)) check<float, float>(DType::F32, n, shift);
    for (size_t n : sizes(4)) check<int32_t, uint32_t>(DType::I32, n, shift);
    for (size_t n : sizes(8)) check<int64_t, uint64_t>(DType::I64, n, shift);
  }
}

TEST(Reduce2, StreamsOnlyLargeOutOfPlaceOutputs) {
  const size_t big = (size_t{1} << 20) / 4;
  EXPECT_FALSE(reduce2_streams(big - 1, DType::F32, false));
  EXPECT_FALSE(reduce2_streams(big, DType::F32, true));
  EXPECT_FALSE(reduce2_streams(big, DType::BF16, false));  // not a kernel dtype
#if defined(__x86_64__)
  EXPECT_EQ(reduce2_streams(big, DType::F32, false), __builtin_cpu_supports("avx2") != 0);
#endif
}

// Every byte at every head alignment and tail length (a 32-byte store loop
// with a plain head and tail), and nothing outside [dst, dst + n).
TEST(CopyStreaming, CopiesExactlyAtEveryAlignmentAndLength) {
  std::vector<unsigned char> src(4096 + 64), dst(4096 + 128);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 37 + 11);
  for (size_t shift : {0, 1, 7, 31, 32, 33})
    for (size_t n : {0, 1, 31, 32, 33, 127, 128, 129, 160, 1000, 4096}) {
      std::fill(dst.begin(), dst.end(), 0xEE);
      copy_streaming(dst.data() + 32 + shift, src.data() + 3, n);
      streaming_fence();
      for (size_t i = 0; i < dst.size(); ++i) {
        const bool inside = i >= 32 + shift && i < 32 + shift + n;
        const unsigned char want = inside ? src[3 + i - 32 - shift] : 0xEE;
        ASSERT_EQ(dst[i], want) << "shift " << shift << " n " << n << " byte " << i;
      }
    }
}

}  // namespace
}  // namespace tessera::collectives
