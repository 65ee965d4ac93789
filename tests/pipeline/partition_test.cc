// parallel/pipeline/partition.h: the one stage-partition rule, hand-computed.
#include "parallel/pipeline/partition.h"

#include <gtest/gtest.h>

#include "runtime/error.h"

namespace tessera::parallel::pipeline {
namespace {

using V = std::vector<int>;

TEST(StageLayers, EvenWithLeftoverToLaterStages) {
  EXPECT_EQ(stage_layers(10, 4), (V{2, 2, 3, 3}));  // 10 = 4*2 + 2: the last two stages get one more
  EXPECT_EQ(stage_layers(12, 4), (V{3, 3, 3, 3}));
  EXPECT_EQ(stage_layers(7, 3), (V{2, 2, 3}));
  EXPECT_EQ(stage_layers(11, 4), (V{2, 3, 3, 3}));
  EXPECT_EQ(stage_layers(3, 2), (V{1, 2}));
  EXPECT_EQ(stage_layers(5, 5), (V{1, 1, 1, 1, 1}));
  EXPECT_EQ(stage_layers(6, 1), (V{6}));
  EXPECT_THROW(stage_layers(4, 0), InvalidArgument);
  EXPECT_THROW(stage_layers(4, 5), InvalidArgument);  // a stage would be empty
}

TEST(StageLayers, FirstLayerAndStageOfLayer) {
  const V p{3, 3, 2, 2};
  EXPECT_EQ(stage_first_layer(p, 0), 0);
  EXPECT_EQ(stage_first_layer(p, 1), 3);
  EXPECT_EQ(stage_first_layer(p, 3), 8);
  EXPECT_EQ(stage_first_layer(p, 4), 10);
  EXPECT_THROW(stage_first_layer(p, 5), InvalidArgument);
  const V want{0, 0, 0, 1, 1, 1, 2, 2, 3, 3};
  for (int l = 0; l < 10; ++l) EXPECT_EQ(stage_of_layer(p, l), want[static_cast<size_t>(l)]) << l;
  EXPECT_THROW(stage_of_layer(p, 10), InvalidArgument);
  EXPECT_THROW(stage_of_layer(p, -1), InvalidArgument);
}

TEST(StageLayers, ExplicitPartitionOverridesAndIsChecked) {
  EXPECT_EQ(resolve_stages({}, 10, 4), (V{2, 2, 3, 3}));
  EXPECT_EQ(resolve_stages({3, 3, 2, 2}, 10, 4), (V{3, 3, 2, 2}));
  EXPECT_THROW(resolve_stages({3, 3, 2}, 10, 4), InvalidArgument);       // length != pp
  EXPECT_THROW(resolve_stages({3, 3, 2, 1}, 10, 4), InvalidArgument);    // sums to 9
  EXPECT_THROW(resolve_stages({4, 4, 2, 0}, 10, 4), InvalidArgument);    // empty stage
  EXPECT_THROW(resolve_stages({6, 6, -1, -1}, 10, 4), InvalidArgument);  // negative
  EXPECT_NO_THROW(check_stages({1, 9}, 10, 2));
}

TEST(StageLayers, ParseStages) {
  EXPECT_EQ(parse_stages("3,3,2,2"), (V{3, 3, 2, 2}));
  EXPECT_EQ(parse_stages("7"), (V{7}));
  EXPECT_EQ(parse_stages("1,-2"), (V{1, -2}));  // parsed; check_stages refuses it
  for (const char* bad : {"", ",", "3,", ",3", "3,,2", "3;2", "a", "3, 2", "2.5", "99999999999"})
    EXPECT_THROW(parse_stages(bad), InvalidArgument) << "'" << bad << "'";
  EXPECT_EQ(stages_str({3, 3, 2, 2}), "3,3,2,2");
}

}  // namespace
}  // namespace tessera::parallel::pipeline
