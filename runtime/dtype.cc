#include "runtime/dtype.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "runtime/error.h"

namespace tessera {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "f16";
    case DType::I32:
      return "i32";
    case DType::I64:
      return "i64";
  }
  return "?";
}

DType parse_dtype(std::string_view s) {
  if (s == "f32" || s == "float" || s == "float32" || s == "fp32") return DType::F32;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  if (s == "f16" || s == "half" || s == "float16" || s == "fp16") return DType::F16;
  if (s == "i32" || s == "int32" || s == "int") return DType::I32;
  if (s == "i64" || s == "int64" || s == "long") return DType::I64;
  throw InvalidArgument(detail::concat("unknown dtype '", s, "' (expected f32, bf16, f16, i32 or i64)"));
}

const char* dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::BF16:
      return "BF16";
    case DType::F16:
      return "F16";
    case DType::I32:
      return "I32";
    case DType::I64:
      return "I64";
  }
  return "?";
}

DType parse_safetensors_dtype(std::string_view s) {
  if (s == "F32") return DType::F32;
  if (s == "BF16") return DType::BF16;
  if (s == "F16") return DType::F16;
  if (s == "I32") return DType::I32;
  if (s == "I64") return DType::I64;
  throw FormatError(detail::concat("unsupported safetensors dtype '", s, "'"));
}

uint16_t float_to_f16_bits(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((absx >> 13) & 0x3ffu));  // NaN
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to Inf
  if (absx < 0x38800000u) {
    // Result is an f16 denormal (or zero): value = m * 2^-24, m in [0, 1024].
    // Shift the full 24-bit significand right and round to nearest even.
    if (absx < 0x33000000u) return sign;  // < 2^-25: rounds to zero (2^-25 exactly ties to even 0)
    uint32_t exp = absx >> 23;            // biased float exponent, 102..112
    uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp;  // so that result = mant >> shift  (in units of 2^-24)
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: rebias exponent 127 -> 15 and round the 13 dropped bits to nearest even.
  uint32_t v = absx - (112u << 23);
  uint32_t lsb = (v >> 13) & 1u;
  v += 0x0fffu + lsb;
  return static_cast<uint16_t>(sign | (v >> 13));
}

float f16_bits_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t out;
  if (exp == 0) {
    if (mant == 0) {
      out = sign;
    } else {  // denormal: normalise
      float v = std::ldexp(static_cast<float>(mant), -24);
      out = sign | std::bit_cast<uint32_t>(v);
    }
  } else if (exp == 31) {
    out = sign | 0x7f800000u | (mant << 13);
  } else {
    out = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(out);
}

namespace {

template <typename T>
double load_as_double(const void* p, size_t i) {
  return static_cast<double>(static_cast<const T*>(p)[i]);
}

double load(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::F32:
      return load_as_double<float>(p, i);
    case DType::BF16:
      return bf16_bits_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::F16:
      return f16_bits_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::I32:
      return load_as_double<int32_t>(p, i);
    case DType::I64:
      return load_as_double<int64_t>(p, i);
  }
  return 0;
}

}  // namespace

void convert(const void* src, DType st, void* dst, DType dt, size_t n) {
  if (n == 0) return;  // src/dst may be null for empty tensors
  if (st == dt) {
    std::memcpy(dst, src, n * dtype_size(st));
    return;
  }
  // Fast paths used by training (f32 <-> bf16/f16).
  if (st == DType::F32 && dt == DType::BF16) {
    auto* s = static_cast<const float*>(src);
    auto* d = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = float_to_bf16_bits(s[i]);
    return;
  }
  if (st == DType::F32 && dt == DType::F16) {
    auto* s = static_cast<const float*>(src);
    auto* d = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = float_to_f16_bits(s[i]);
    return;
  }
  if (st == DType::I64 && dt == DType::I32) {
    auto* s = static_cast<const int64_t*>(src);
    auto* d = static_cast<int32_t*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = static_cast<int32_t>(s[i]);
    return;
  }
  if (st == DType::I32 && dt == DType::I64) {
    auto* s = static_cast<const int32_t*>(src);
    auto* d = static_cast<int64_t*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = s[i];
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    double v = load(src, st, i);
    switch (dt) {
      case DType::F32:
        static_cast<float*>(dst)[i] = static_cast<float>(v);
        break;
      case DType::BF16:
        static_cast<uint16_t*>(dst)[i] = float_to_bf16_bits(static_cast<float>(v));
        break;
      case DType::F16:
        static_cast<uint16_t*>(dst)[i] = float_to_f16_bits(static_cast<float>(v));
        break;
      case DType::I32:
        static_cast<int32_t*>(dst)[i] = std::isfinite(v) ? static_cast<int32_t>(v) : 0;
        break;
      case DType::I64:
        static_cast<int64_t*>(dst)[i] = std::isfinite(v) ? static_cast<int64_t>(v) : 0;
        break;
    }
  }
}

}  // namespace tessera
