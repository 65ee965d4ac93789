#include "runtime/tensor.h"

#include <gtest/gtest.h>

#include <numeric>

#include "runtime/device.h"

using namespace tessera;

namespace {
Tensor iota(const Shape& shape, DType dt = DType::F32) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  std::iota(v.begin(), v.end(), 0.0f);
  return Tensor::from_vector(v, shape, dt);
}
}  // namespace

TEST(Tensor, ShapeStridesAndItems) {
  Tensor t = iota({2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_EQ(t.strides(), (std::vector<int64_t>{12, 4, 1}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.item(13), 13.0);
  EXPECT_EQ(t.str(), "f32[2, 3, 4]");
}

TEST(Tensor, SliceIsAViewWithRightElements) {
  Tensor t = iota({4, 6});
  Tensor s = t.slice(1, 2, 5);  // columns 2..4
  EXPECT_EQ(s.shape(), (Shape{4, 3}));
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_EQ(s.item(0), 2.0);
  EXPECT_EQ(s.item(4), 9.0);  // row 1, col 3
  s.fill(-1);                 // writes through to t
  EXPECT_EQ(t.item(8), -1.0);
  EXPECT_EQ(t.item(7), 7.0);
  Tensor c = s.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.to_float_vector(), std::vector<float>(12, -1.0f));
  EXPECT_THROW(t.slice(0, 3, 5), InvalidArgument);
}

TEST(Tensor, SplitConcatRoundTripEveryDim) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64}) {
    Tensor t = iota({4, 6, 8}, dt);
    for (int64_t d = 0; d < 3; ++d) {
      for (int64_t parts : {1, 2}) {
        auto pieces = t.split(d, parts);
        ASSERT_EQ(static_cast<int64_t>(pieces.size()), parts);
        Tensor back = concat(pieces, d);
        ASSERT_EQ(back.shape(), t.shape());
        EXPECT_EQ(back.to_float_vector(), t.to_float_vector()) << dtype_name(dt) << " dim " << d;
      }
    }
  }
}

TEST(Tensor, SplitPiecesHoldTheRightBlocks) {
  Tensor t = iota({2, 6});
  auto parts = t.split(1, 3);
  EXPECT_EQ(parts[1].to_float_vector(), (std::vector<float>{2, 3, 8, 9}));
  auto uneven = t.split_sizes(1, {1, 5});
  EXPECT_EQ(uneven[0].to_float_vector(), (std::vector<float>{0, 6}));
  EXPECT_THROW(t.split(1, 4), InvalidArgument);
  EXPECT_THROW(t.split_sizes(1, {2, 2}), InvalidArgument);
}

TEST(Tensor, ViewTransposeSelect) {
  Tensor t = iota({2, 3});
  Tensor v = t.view({3, -1});
  EXPECT_EQ(v.shape(), (Shape{3, 2}));
  Tensor tt = t.transpose(0, 1);
  EXPECT_EQ(tt.shape(), (Shape{3, 2}));
  EXPECT_EQ(tt.contiguous().to_float_vector(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_THROW(tt.view({6}), InvalidArgument);
  EXPECT_EQ(t.select(0, 1).to_float_vector(), (std::vector<float>{3, 4, 5}));
  EXPECT_THROW(t.view({4, 2}), InvalidArgument);
}

TEST(Tensor, DtypeConversionThroughTo) {
  Tensor t = Tensor::from_vector({0.1f, 1.0f, -3.5f}, {3});
  Tensor b = t.to(DType::BF16);
  EXPECT_EQ(b.dtype(), DType::BF16);
  EXPECT_FLOAT_EQ(static_cast<float>(b.item(0)), bf16_bits_to_float(float_to_bf16_bits(0.1f)));
  EXPECT_EQ(b.item(2), -3.5);
}

TEST(Tensor, ChargesItsDevice) {
  Device dev(DeviceSpec::preset("test-core"));
  {
    Tensor t = Tensor::empty({1024}, DType::F32, &dev);
    EXPECT_EQ(dev.memory_stats().in_use, 4096u);
    Tensor view = t.slice(0, 0, 10);  // views do not charge again
    EXPECT_EQ(dev.memory_stats().in_use, 4096u);
    t = Tensor();
    EXPECT_EQ(dev.memory_stats().in_use, 4096u);  // view keeps storage alive
  }
  EXPECT_EQ(dev.memory_stats().in_use, 0u);
  EXPECT_EQ(dev.memory_stats().peak, 4096u);
}
