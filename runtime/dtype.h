// Element types and exact conversions between them.
// bf16 and f16 conversions from float round to nearest even and keep NaN
// (quiet), +-Inf and denormals right; conversions to float are exact.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera {

enum class DType : uint8_t { F32 = 0, BF16 = 1, F16 = 2, I32 = 3, I64 = 4 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::BF16:
    case DType::F16:
      return 2;
    case DType::I32:
      return 4;
    case DType::I64:
      return 8;
  }
  return 0;
}
constexpr bool is_floating(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

// "f32", "bf16", "f16", "i32", "i64".
const char* dtype_name(DType t);
// Accepts the short names above and common spellings ("float", "float32",
// "bfloat16", "half", "float16", "int32", "int", "int64"); throws InvalidArgument.
DType parse_dtype(std::string_view s);
// safetensors names: "F32", "BF16", "F16", "I32", "I64".
const char* dtype_safetensors_name(DType t);
DType parse_safetensors_dtype(std::string_view s);

// 16-bit values travel as raw uint16_t bit patterns. The bf16 pair is
// inline: the trainer's bf16 kernels (runtime/bf16.h) round with it in
// vectorised loops.
inline uint16_t float_to_bf16_bits(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign, force quiet bit
    return static_cast<uint16_t>((x >> 16) | 0x0040u);
  }
  // Round to nearest even on the 16 dropped bits; Inf stays Inf, overflow goes to Inf.
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}
inline float bf16_bits_to_float(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }
uint16_t float_to_f16_bits(float f);
float f16_bits_to_float(uint16_t h);

// Converts n elements between any two dtypes (float <-> int truncates toward zero,
// as static_cast does; out-of-range values are the caller's business).
void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t n);

}  // namespace tessera
