#include "runtime/bf16.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/random.h"

using namespace tessera;

namespace {
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }
uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
// A float's bf16 (nearest even), as 16 bits.
uint16_t rne16(float f) { return static_cast<uint16_t>(bits(bf16::round_nearest(f)) >> 16); }
}  // namespace

TEST(Bf16Round, NearestEvenOnHandPickedTies) {
  // bf16 keeps 7 significand bits: the ulp of [1, 2) is 2^-7.
  EXPECT_EQ(rne16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // halfway 1 | 1 + 2^-7: even is 1
  EXPECT_EQ(rne16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // halfway 0x3f81 | 0x3f82: even is up
  EXPECT_EQ(rne16(-(1.0f + std::ldexp(1.0f, -8))), 0xbf80);   // signs round by magnitude
  EXPECT_EQ(rne16(from_bits(0x3f818000u)), 0x3f82);           // tie above an odd value: up
  EXPECT_EQ(rne16(from_bits(0x3f808001u)), 0x3f81);           // just above half: up
  EXPECT_EQ(rne16(from_bits(0x3f807fffu)), 0x3f80);           // just below half: down
  EXPECT_EQ(rne16(from_bits(0x00008000u)), 0x0000);           // denormal tie to even zero
  EXPECT_EQ(rne16(from_bits(0x00018000u)), 0x0002);           // denormal tie above odd: up
  EXPECT_EQ(rne16(from_bits(0x7f7f8000u)), 0x7f80);           // the largest bf16's tie overflows to Inf
  EXPECT_EQ(rne16(from_bits(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(rne16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_TRUE(std::isnan(bf16::round_nearest(from_bits(0x7f800001u))));  // a NaN whose payload is in the low bits
  EXPECT_TRUE(std::isnan(bf16::round_nearest(std::nanf(""))));
}

TEST(Bf16Round, BulkRoundingAndPackingMatchTheScalarConversion) {
  const int64_t n = 10007;  // not a multiple of any vector width
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u = static_cast<uint32_t>(splitmix64(static_cast<uint64_t>(i)));
    if ((u & 0x7f800000u) == 0x7f800000u) u &= 0xbfffffffu;  // keep NaN/Inf out: checked above
    if (i % 7 == 0) u = (u & 0xffff0000u) | 0x8000u;         // many exact ties
    x[static_cast<size_t>(i)] = from_bits(u);
  }
  std::vector<float> r = x;
  bf16::round_inplace(r.data(), n);
  std::vector<uint16_t> p(static_cast<size_t>(n));
  bf16::pack(x.data(), p.data(), n);
  std::vector<float> q = x;
  bf16::pack_inplace(q.data(), n);
  const auto* q16 = reinterpret_cast<const uint16_t*>(q.data());
  std::vector<float> u(static_cast<size_t>(n));
  bf16::unpack(p.data(), u.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const auto s = static_cast<size_t>(i);
    const uint16_t want = float_to_bf16_bits(x[s]);
    ASSERT_EQ(bits(r[s]), static_cast<uint32_t>(want) << 16) << i;
    ASSERT_EQ(p[s], want) << i;
    ASSERT_EQ(q16[s], want) << i;
    ASSERT_EQ(bits(u[s]), static_cast<uint32_t>(want) << 16) << i;
  }
  bf16::unpack_inplace(q.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(bits(q[static_cast<size_t>(i)]), bits(r[static_cast<size_t>(i)])) << i;
}

TEST(Bf16Round, StochasticMeanIsTheValueWithinItsStandardError) {
  // x = 1 + f ulp between the bf16 neighbours 1 and 1 + 2^-7: a draw is 1 + ulp
  // with probability f, so the mean is x and one draw's deviation ulp sqrt(f (1 - f)).
  const double ulp = std::ldexp(1.0, -7);
  for (double f : {0.3, 0.01, 0.5, 0.97}) {
    const auto x = static_cast<float>(1.0 + f * ulp);
    const double fx = static_cast<double>(x);  // f as float rounds it; use the stored value
    const double fq = (fx - 1.0) / ulp;
    const int n = 200000;
    double sum = 0;
    for (int i = 0; i < n; ++i) {
      const float y = bf16::round_stochastic(x, static_cast<uint32_t>(splitmix64(static_cast<uint64_t>(i) + 99)));
      ASSERT_TRUE(y == 1.0f || y == static_cast<float>(1.0 + ulp)) << y;
      sum += y;
    }
    const double se = ulp * std::sqrt(fq * (1 - fq) / n);
    EXPECT_NEAR(sum / n, fx, 4 * se) << "f " << f;
  }
  // Negative values round in magnitude; exact bf16 values never move; r = 0 truncates.
  EXPECT_EQ(bf16::round_stochastic(-1.0f - static_cast<float>(0.5 * ulp), 0xffff), -1.0f - static_cast<float>(ulp));
  EXPECT_EQ(bf16::round_stochastic(-1.0f - static_cast<float>(0.5 * ulp), 0x7fff), -1.0f);
  for (uint32_t r : {0u, 1u, 0x8000u, 0xffffu}) EXPECT_EQ(bf16::round_stochastic(1.5f, r), 1.5f);
  EXPECT_EQ(bf16::round_stochastic(from_bits(0x3f80ffffu), 0), 1.0f);
  EXPECT_EQ(bf16::round_stochastic(from_bits(0x3f80ffffu), 1), from_bits(0x3f810000u));
  EXPECT_TRUE(std::isinf(bf16::round_stochastic(std::numeric_limits<float>::infinity(), 0xffff)));
}

namespace {

struct GemmCase {
  bool ta, tb;
  int64_t m, n, k;
  float alpha, beta;
};

// Element (i, j) of op(X) for X stored row-major with stride ld.
float at(const std::vector<float>& x, bool t, int64_t ld, int64_t i, int64_t j) {
  return x[static_cast<size_t>(t ? j * ld + i : i * ld + j)];
}

// Runs bf16::gemm on `backend` and checks every element against the sum in
// double of the bf16-rounded products. Any fp32 summation of k terms is within
// gamma_k = k u / (1 - k u) (u = 2^-24) of the sum of their magnitudes
// (Higham, "Accuracy and Stability of Numerical Algorithms", 2002, eq. 3.5);
// alpha and beta C add two more roundings: gamma_{k+2} (|alpha| sum |a b| + |beta c|).
void check_gemm(bf16::GemmBackend backend, const GemmCase& g, bool integers) {
  bf16::set_gemm_backend(backend);
  const int64_t lda = (g.ta ? g.m : g.k) + 3, ldb = (g.tb ? g.k : g.n) + 1, ldc = g.n + 2;
  std::vector<float> a(static_cast<size_t>((g.ta ? g.k : g.m) * lda)), b(static_cast<size_t>((g.tb ? g.n : g.k) * ldb));
  std::vector<float> c(static_cast<size_t>(g.m * ldc));
  uint64_t s = 7;
  auto next = [&](double scale) {
    const uint64_t r = splitmix64(s++);
    if (integers) return static_cast<float>(static_cast<int64_t>(r % 17) - 8);  // exact, and so are the sums
    return static_cast<float>(scale * (static_cast<double>(r >> 11) * 0x1.0p-53 * 2 - 1));  // not bf16 values
  };
  for (float& v : a) v = next(1.0);
  for (float& v : b) v = next(3.0);
  for (float& v : c) v = next(2.0);
  const std::vector<float> c0 = c;
  bf16::gemm(g.ta, g.tb, g.m, g.n, g.k, g.alpha, a.data(), lda, b.data(), ldb, g.beta, c.data(), ldc);
  const double u = std::ldexp(1.0, -24), kk = static_cast<double>(g.k + 2), gamma = kk * u / (1 - kk * u);
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < g.n; ++j) {
      double sum = 0, mag = 0;
      for (int64_t p = 0; p < g.k; ++p) {
        const double x = bf16::round_nearest(at(a, g.ta, lda, i, p)), y = bf16::round_nearest(at(b, g.tb, ldb, p, j));
        sum += x * y;
        mag += std::fabs(x * y);
      }
      const double cij = c0[static_cast<size_t>(i * ldc + j)];
      const double want = g.alpha * sum + (g.beta != 0.f ? g.beta * cij : 0.0);
      const double tol = integers ? 0.0 : gamma * (std::fabs(g.alpha) * mag + std::fabs(g.beta * cij));
      ASSERT_LE(std::fabs(c[static_cast<size_t>(i * ldc + j)] - want), tol)
          << bf16::gemm_backend_name(backend) << " ta " << g.ta << " tb " << g.tb << " " << g.m << "x" << g.n << "x"
          << g.k << " at (" << i << ", " << j << ")";
    }
  }
  // Padding between rows of C is never written.
  for (int64_t i = 0; i < g.m; ++i)
    for (int64_t j = g.n; j < ldc; ++j)
      ASSERT_EQ(c[static_cast<size_t>(i * ldc + j)], c0[static_cast<size_t>(i * ldc + j)]);
  bf16::set_gemm_backend(bf16::GemmBackend::kAuto);
}

std::vector<bf16::GemmBackend> backends() {
  std::vector<bf16::GemmBackend> v{bf16::GemmBackend::kFallback};
  if (bf16::cpu_has_bf16_dot()) v.push_back(bf16::GemmBackend::kOneDnn);
  return v;
}

}  // namespace

TEST(Bf16Gemm, MatchesTheReferenceOnRoundedInputsWithinTheAccumulationBound) {
  if (!bf16::cpu_has_bf16_dot()) std::cout << "this CPU has no bf16 dot-product instructions: fallback only\n";
  for (bf16::GemmBackend be : backends()) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        check_gemm(be, {ta, tb, 37, 29, 301, 1.f, 0.f}, false);
        check_gemm(be, {ta, tb, 64, 48, 96, 0.5f, 1.f}, false);
        check_gemm(be, {ta, tb, 5, 7, 1, 1.f, -2.f}, false);
      }
    }
  }
}

TEST(Bf16Gemm, ExactOnSmallIntegers) {
  // |a|, |b| <= 8 and k <= 64: every partial sum is an integer below 2^24, so
  // any summation order gives the exact result.
  for (bf16::GemmBackend be : backends()) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) check_gemm(be, {ta, tb, 33, 17, 64, 1.f, 1.f}, true);
    }
  }
}

TEST(Bf16Gemm, RoundsItsInputsToNearestEvenFirst) {
  // 1 + 2^-8 (a tie) rounds to 1 and 1 + 3 2^-8 to 1 + 2^-6: one product each, exact.
  for (bf16::GemmBackend be : backends()) {
    bf16::set_gemm_backend(be);
    const float a[2] = {1.0f + std::ldexp(1.0f, -8), 1.0f + 3 * std::ldexp(1.0f, -8)};
    const float b[1] = {1.0f};
    float c[2] = {0, 0};
    bf16::gemm(false, false, 2, 1, 1, 1.f, a, 1, b, 1, 0.f, c, 1);
    EXPECT_EQ(c[0], 1.0f) << bf16::gemm_backend_name(be);
    EXPECT_EQ(c[1], 1.0f + std::ldexp(1.0f, -6)) << bf16::gemm_backend_name(be);
  }
  bf16::set_gemm_backend(bf16::GemmBackend::kAuto);
}

TEST(Bf16Gemm, BackendChoice) {
  EXPECT_EQ(bf16::gemm_backend(), bf16::cpu_has_bf16_dot() ? bf16::GemmBackend::kOneDnn : bf16::GemmBackend::kFallback);
  if (!bf16::cpu_has_bf16_dot()) {
    EXPECT_THROW(bf16::set_gemm_backend(bf16::GemmBackend::kOneDnn), InvalidArgument);
  }
}
