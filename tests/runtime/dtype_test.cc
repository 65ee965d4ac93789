#include "runtime/dtype.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "runtime/error.h"

using namespace tessera;

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::F32), 4u);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::F16), 2u);
  EXPECT_EQ(dtype_size(DType::I32), 4u);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64}) {
    EXPECT_EQ(parse_dtype(dtype_name(t)), t);
    EXPECT_EQ(parse_safetensors_dtype(dtype_safetensors_name(t)), t);
  }
  EXPECT_THROW(parse_dtype("f8"), InvalidArgument);
}

TEST(BF16, ExactValuesAndRounding) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16_bits(-2.0f), 0xc000);
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd mantissa) and 1+2^-6: rounds up to even.
  EXPECT_EQ(float_to_bf16_bits(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  // Just above halfway rounds up.
  EXPECT_EQ(float_to_bf16_bits(std::bit_cast<float>(0x3f808001u)), 0x3f81);
  EXPECT_EQ(bf16_bits_to_float(0x3f80), 1.0f);
}

TEST(BF16, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(float_to_bf16_bits(inf), 0x7f80);
  EXPECT_EQ(float_to_bf16_bits(-inf), 0xff80);
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(std::nanf("")))));
  // A NaN whose payload sits only in the low bits must stay NaN, not become Inf.
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(std::bit_cast<float>(0x7f800001u)))));
  // Largest finite float rounds to Inf in bf16.
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::max()), 0x7f80);
  // Denormals keep their value when representable.
  float den = std::bit_cast<float>(0x00010000u);
  EXPECT_EQ(float_to_bf16_bits(den), 0x0001);
  EXPECT_EQ(bf16_bits_to_float(0x0001), den);
  EXPECT_EQ(float_to_bf16_bits(-0.0f), 0x8000);
}

TEST(F16, ExactValuesAndRounding) {
  EXPECT_EQ(float_to_f16_bits(1.0f), 0x3c00);
  EXPECT_EQ(float_to_f16_bits(-2.0f), 0xc000);
  EXPECT_EQ(float_to_f16_bits(65504.0f), 0x7bff);  // max finite
  EXPECT_EQ(float_to_f16_bits(65519.0f), 0x7bff);  // below the halfway point to 65536
  EXPECT_EQ(float_to_f16_bits(65520.0f), 0x7c00);  // halfway: ties to even = Inf
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even.
  EXPECT_EQ(float_to_f16_bits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(float_to_f16_bits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // every finite positive f16 round-trips
    float f = f16_bits_to_float(static_cast<uint16_t>(h));
    ASSERT_EQ(float_to_f16_bits(f), h) << "h=" << h;
  }
}

TEST(F16, DenormalsAndSpecials) {
  const float tiny = std::ldexp(1.0f, -24);  // smallest f16 denormal
  EXPECT_EQ(float_to_f16_bits(tiny), 0x0001);
  EXPECT_EQ(f16_bits_to_float(0x0001), tiny);
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1.0f, -25)), 0x0000);     // halfway to 0: even
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1.5f, -25)), 0x0001);     // above halfway
  EXPECT_EQ(float_to_f16_bits(std::ldexp(3.0f, -25)), 0x0002);     // 1.5 ulp: ties to even 2
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1023.0f, -24)), 0x03ff);  // largest denormal
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1.0f, -14)), 0x0400);     // smallest normal
  EXPECT_EQ(float_to_f16_bits(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(float_to_f16_bits(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_TRUE(std::isnan(f16_bits_to_float(float_to_f16_bits(std::nanf("")))));
  EXPECT_TRUE(std::isinf(f16_bits_to_float(0x7c00)));
  EXPECT_EQ(float_to_f16_bits(-0.0f), 0x8000);
  EXPECT_EQ(float_to_f16_bits(1e-10f), 0x0000);
}

TEST(Convert, BetweenTypes) {
  float src[4] = {1.5f, -2.25f, 3.0f, 100.5f};
  uint16_t bf[4];
  convert(src, DType::F32, bf, DType::BF16, 4);
  float back[4];
  convert(bf, DType::BF16, back, DType::F32, 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(back[i], src[i]);  // all exactly representable in bf16
  int32_t ints[4];
  convert(src, DType::F32, ints, DType::I32, 4);
  EXPECT_EQ(ints[0], 1);
  EXPECT_EQ(ints[1], -2);
  int64_t longs[4];
  convert(ints, DType::I32, longs, DType::I64, 4);
  EXPECT_EQ(longs[3], 100);
  uint16_t h[4];
  convert(bf, DType::BF16, h, DType::F16, 4);
  EXPECT_EQ(f16_bits_to_float(h[1]), -2.25f);
}
