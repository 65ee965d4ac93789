// bf16 numerics of the emulated cores: rounding fp32 values to bf16 (to
// nearest even, or stochastically), packing them, and the bf16 GEMM with
// fp32 accumulation.
//
// A bf16 tensor of a training run lives in a 4-byte float container that
// holds exactly a bf16 value (the fp32 kernels run on it unchanged); the
// emulated core charges it 2 bytes (runtime/tensor.h, Tensor::container).
// round_inplace makes a container's values bf16; the GEMM packs them to 16
// bits for the CPU's bf16 instructions.
//
// Rounding to nearest even is float_to_bf16_bits' (runtime/dtype.h): NaN
// stays NaN (quiet), Inf stays Inf, overflow goes to Inf, denormals round
// like any other value. Stochastic rounding rounds |x| up to the next bf16
// with probability (discarded low 16 bits) / 2^16 from a caller's 16-bit
// random number, so its mean is x (Gupta et al. 2015, "Deep Learning with
// Limited Numerical Precision"; what Trainium's NEURON_RT_STOCHASTIC_ROUNDING_EN does).
// Pure functions; thread-safe (the GEMM keeps per-thread scratch).
#pragma once

#include <cstdint>
#include <string>

#include "runtime/dtype.h"

namespace tessera::bf16 {

// x rounded to the nearest bf16, ties to even, as a float.
inline float round_nearest(float x);
// x rounded stochastically with the random 16 bits `r` (uniform over
// [0, 2^16)): up (away from zero) when r < the 16 discarded bits. NaN and Inf
// as round_nearest; a finite value never rounds to Inf unless it exceeds the
// largest bf16.
inline float round_stochastic(float x, uint32_t r);

// In place: every element becomes its nearest bf16 (ties to even).
void round_inplace(float* x, int64_t n);
// out[i] = bf16 bits of x[i] rounded to nearest even; x and out may not alias.
void pack(const float* x, uint16_t* out, int64_t n);
void unpack(const uint16_t* x, float* out, int64_t n);
// In place on a buffer of n floats: the first 2n bytes become the bf16
// bits of the values (each rounded to nearest even), and back (unpack_inplace
// reads the first 2n bytes and fills all n floats).
void pack_inplace(float* x, int64_t n);
void unpack_inplace(float* x, int64_t n);

// ---- GEMM: bf16 inputs, fp32 accumulation ----
// C[M,N] = alpha * op(A) op(B) + beta * C with A and B rounded to bf16 (to
// nearest even) first: every product is exact in fp32 (8-bit significands),
// the sum of k of them is accumulated in fp32 and C stays fp32 (the caller
// rounds it when C is a bf16 tensor). Row-major, strides as cblas_sgemm.
// Backends: oneDNN's matmul (bf16 instructions: avx512_bf16 and up), or the
// exact fallback for CPUs without them (the inputs rounded to bf16 in fp32
// scratch, then OpenBLAS sgemm): the same products, summed in another order.
enum class GemmBackend { kAuto, kOneDnn, kFallback };
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
          int64_t ldb, float beta, float* c, int64_t ldc);
// The backend gemm() uses: oneDNN when this CPU (as oneDNN sees it,
// ONEDNN_MAX_CPU_ISA included) has bf16 dot-product instructions, else the
// fallback. set_gemm_backend forces one (kAuto: back to the default; kOneDnn
// on a CPU without them throws InvalidArgument).
GemmBackend gemm_backend();
void set_gemm_backend(GemmBackend b);
bool cpu_has_bf16_dot();
std::string gemm_backend_name(GemmBackend b);

// ---- inline definitions ----
inline float round_nearest(float x) { return bf16_bits_to_float(float_to_bf16_bits(x)); }

inline float round_stochastic(float x, uint32_t r) {
  uint32_t u;
  __builtin_memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return round_nearest(x);  // Inf, NaN
  // Adding r (< 2^16) to the low half carries into the kept bits with
  // probability low / 2^16; the magnitude grows toward the next bf16.
  u += r & 0xffffu;
  u &= 0xffff0000u;
  float y;
  __builtin_memcpy(&y, &u, 4);
  return y;
}

}  // namespace tessera::bf16
