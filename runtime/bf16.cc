#include "runtime/bf16.h"

#include <cblas.h>
#include <omp.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "runtime/error.h"

namespace tessera::bf16 {

void round_inplace(float* x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] = round_nearest(x[i]);
}

namespace {
void pack_scalar(const float* x, uint16_t* out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = float_to_bf16_bits(x[i]);
}

#if defined(__x86_64__)
// GCC 12 sees _mm512_srli_epi32's undefined pass-through operand as uninitialised.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// float_to_bf16_bits' integer steps on 16 floats at a time (AVX-512F): the same bits.
__attribute__((target("avx512f"))) void pack_avx512(const float* x, uint16_t* out, int64_t n) {
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i quiet = _mm512_set1_epi32(0x00400000), half = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_loadu_si512(x + i);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, magnitude), inf);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(half, lsb));
    r = _mm512_mask_or_epi32(r, nan, u, quiet);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
  }
  pack_scalar(x + i, out + i, n - i);
}
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

bool has_avx512f() {
#if defined(__x86_64__)
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
#else
  return false;
#endif
}
}  // namespace

void pack(const float* x, uint16_t* out, int64_t n) {
#if defined(__x86_64__)
  if (has_avx512f()) {
    pack_avx512(x, out, n);
    return;
  }
#endif
  pack_scalar(x, out, n);
}

void unpack(const uint16_t* x, float* out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(x[i]) << 16;
    std::memcpy(out + i, &u, 4);
  }
}

// Forward: element i's two bytes land at byte 2i <= 4i, after element i was read.
void pack_inplace(float* x, int64_t n) {
  auto* out = reinterpret_cast<uint16_t*>(x);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t b = float_to_bf16_bits(x[i]);
    std::memcpy(out + i, &b, 2);
  }
}

// Backward: float i (bytes 4i..4i+3) is written after the bits at 2i were read, and
// overwrites only bits of elements >= i.
void unpack_inplace(float* x, int64_t n) {
  const auto* in = reinterpret_cast<const unsigned char*>(x);
  for (int64_t i = n; i-- > 0;) {
    uint16_t b;
    std::memcpy(&b, in + 2 * i, 2);
    const uint32_t u = static_cast<uint32_t>(b) << 16;
    std::memcpy(x + i, &u, 4);
  }
}

bool cpu_has_bf16_dot() {
  // oneDNN's effective ISA includes ONEDNN_MAX_CPU_ISA; avx512_core_bf16's bits
  // are a superset of avx512_core's, and every later ISA holds them.
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto want = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_bf16);
  return (isa & want) == want;
}

std::string gemm_backend_name(GemmBackend b) {
  switch (b) {
    case GemmBackend::kAuto:
      return "auto";
    case GemmBackend::kOneDnn:
      return "onednn";
    case GemmBackend::kFallback:
      return "fallback";
  }
  return "?";
}

namespace {
std::atomic<int> g_forced{static_cast<int>(GemmBackend::kAuto)};

GemmBackend default_backend() {
  static const GemmBackend b = cpu_has_bf16_dot() ? GemmBackend::kOneDnn : GemmBackend::kFallback;
  return b;
}

// Per-thread scratch, grown once to the largest GEMM and reused.
struct Scratch {
  std::vector<uint16_t> a16, b16;
  std::vector<float> a32, b32;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

template <typename T>
T* grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// op(A) rows x cols read from `src` (stride ld, transposed when t) into a
// contiguous buffer in the stored orientation: [rows, cols] (t false) or [cols, rows].
template <typename Out, typename Fn>
void pack_operand(bool t, int64_t rows, int64_t cols, const float* src, int64_t ld, Out* dst, Fn convert) {
  const int64_t outer = t ? cols : rows, inner = t ? rows : cols;
  for (int64_t r = 0; r < outer; ++r) convert(src + r * ld, dst + r * inner, inner);
}

void fallback_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                   const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  Scratch& s = scratch();
  float* a32 = grow(s.a32, static_cast<size_t>(m) * static_cast<size_t>(k));
  float* b32 = grow(s.b32, static_cast<size_t>(k) * static_cast<size_t>(n));
  auto round_copy = [](const float* x, float* y, int64_t len) {
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) y[i] = round_nearest(x[i]);
  };
  pack_operand(ta, m, k, a, lda, a32, round_copy);
  pack_operand(tb, k, n, b, ldb, b32, round_copy);
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a32, static_cast<int>(ta ? m : k), b32,
              static_cast<int>(tb ? k : n), beta, c, static_cast<int>(ldc));
}

// oneDNN matmul primitives by shape, one cache per thread (ranks are threads).
struct Key {
  bool ta, tb;
  int64_t m, n, k, ldc;
  float alpha, beta;
  bool operator==(const Key& o) const {
    return std::tie(ta, tb, m, n, k, ldc, alpha, beta) == std::tie(o.ta, o.tb, o.m, o.n, o.k, o.ldc, o.alpha, o.beta);
  }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = std::hash<int64_t>()(k.m);
    for (int64_t v : {k.n, k.k, k.ldc}) h = h * 1000003u ^ std::hash<int64_t>()(v);
    h = h * 31u ^ std::hash<float>()(k.alpha);
    h = h * 31u ^ std::hash<float>()(k.beta);
    return h * 4u + (k.ta ? 2u : 0u) + (k.tb ? 1u : 0u);
  }
};

struct OneDnn {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  struct Prim {
    dnnl::matmul mm;
    dnnl::memory::desc a, b, c;
  };
  std::unordered_map<Key, Prim, KeyHash> prims;

  OneDnn() {
    // One thread per rank, as for OpenBLAS (kern::default_blas_threads).
    if (std::getenv("OMP_NUM_THREADS") == nullptr) omp_set_num_threads(1);
  }

  const Prim& prim(const Key& key) {
    auto it = prims.find(key);
    if (it != prims.end()) return it->second;
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    // Operands packed contiguous in their stored orientation; a transposed
    // operand is described by its strides.
    dnnl::memory::desc a({key.m, key.k}, dt::bf16, key.ta ? dims{1, key.m} : dims{key.k, 1});
    dnnl::memory::desc b({key.k, key.n}, dt::bf16, key.tb ? dims{1, key.k} : dims{key.n, 1});
    dnnl::memory::desc c({key.m, key.n}, dt::f32, dims{key.ldc, 1});
    dnnl::primitive_attr attr;
    if (key.alpha != 1.f) attr.set_output_scales(0, {key.alpha});
    if (key.beta != 0.f) {
      dnnl::post_ops po;
      po.append_sum(key.beta);
      attr.set_post_ops(po);
    }
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, engine);
    return prims.emplace(key, Prim{dnnl::matmul(pd), a, b, c}).first->second;
  }
};

OneDnn& onednn() {
  thread_local OneDnn o;
  return o;
}

void onednn_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                 const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  Scratch& s = scratch();
  uint16_t* a16 = grow(s.a16, static_cast<size_t>(m) * static_cast<size_t>(k));
  uint16_t* b16 = grow(s.b16, static_cast<size_t>(k) * static_cast<size_t>(n));
  pack_operand(ta, m, k, a, lda, a16, pack);
  pack_operand(tb, k, n, b, ldb, b16, pack);
  OneDnn& o = onednn();
  const OneDnn::Prim& p = o.prim(Key{ta, tb, m, n, k, ldc, alpha, beta});
  dnnl::memory am(p.a, o.engine, a16), bm(p.b, o.engine, b16), cm(p.c, o.engine, c);
  p.mm.execute(o.stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  o.stream.wait();
}
}  // namespace

GemmBackend gemm_backend() {
  const auto forced = static_cast<GemmBackend>(g_forced.load());
  return forced == GemmBackend::kAuto ? default_backend() : forced;
}

void set_gemm_backend(GemmBackend b) {
  TESSERA_ARG_CHECK(b != GemmBackend::kOneDnn || cpu_has_bf16_dot(),
                    "the oneDNN bf16 GEMM needs a CPU with bf16 dot-product instructions (avx512_bf16)");
  g_forced.store(static_cast<int>(b));
}

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
          int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // no products: C = beta C
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.f ? 0.f : beta * c[i * ldc + j];
    return;
  }
  if (gemm_backend() == GemmBackend::kOneDnn) {
    onednn_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    fallback_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

}  // namespace tessera::bf16
