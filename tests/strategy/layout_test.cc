// Layout math against the worked examples of spec §3.5 and MindSpore's optimizer-shard vectors
// (§3.2, Appendix B).
#include "ckptfs/strategy/layout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "ckptfs/error.h"
#include "strategy/strategy_test_util.h"

namespace ckptfs::strategy {

// Readable failure output.
void PrintTo(const Box& box, std::ostream* os) {
  *os << "begin [";
  for (int64_t v : box.begin) *os << v << ",";
  *os << "] end [";
  for (int64_t v : box.end) *os << v << ",";
  *os << "]";
}

namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using Shape = std::vector<int64_t>;
using namespace testsupport;

Box box(Shape begin, Shape end) { return Box{std::move(begin), std::move(end)}; }

template <typename Call>
std::string error_of_call(const Call& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

std::string error_of(const ParamLayout& layout, size_t rank, std::string_view param) {
  try {
    Layout::from(layout, rank, param);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Layout, ExampleA_RowsSplitByOuterAxis) {
  const Layout l = make(classic({2, 4}, {1, -1}));
  const Shape g{8, 8};
  EXPECT_EQ(l.devices(), 8);
  EXPECT_EQ(l.splits(), (Shape{2, 1}));
  for (int64_t r : {0, 1, 2, 3}) EXPECT_EQ(l.slice_of(r, g), box({0, 0}, {4, 8})) << r;
  for (int64_t r : {4, 5, 6, 7}) EXPECT_EQ(l.slice_of(r, g), box({4, 0}, {8, 8})) << r;
  EXPECT_EQ(l.slice_shape(g, "w"), (Shape{4, 8}));
  EXPECT_EQ(l.global_shape(Shape{4, 8}), g);
}

TEST(Layout, ExampleB_ColumnsSplitByInnerAxis) {
  const Layout l = make(classic({2, 4}, {-1, 0}));
  const Shape g{8, 8};
  const int64_t cols[] = {0, 2, 4, 6};
  for (int64_t r = 0; r < 8; ++r)
    EXPECT_EQ(l.slice_of(r, g), box({0, cols[r % 4]}, {8, cols[r % 4] + 2})) << r;
}

TEST(Layout, ExampleC_TransposedAssignment) {
  const Layout l = make(classic({2, 4}, {0, 1}));
  const Shape g{8, 8};
  const std::vector<Box> expected{box({0, 0}, {2, 4}), box({2, 0}, {4, 4}), box({4, 0}, {6, 4}),
                                  box({6, 0}, {8, 4}), box({0, 4}, {2, 8}), box({2, 4}, {4, 8}),
                                  box({4, 4}, {6, 8}), box({6, 4}, {8, 8})};
  // Slice index row-major over (b0, b1) with s = [4, 2].
  const int64_t slice_index[] = {0, 2, 4, 6, 1, 3, 5, 7};
  EXPECT_EQ(l.splits(), (Shape{4, 2}));
  for (int64_t r = 0; r < 8; ++r) {
    EXPECT_EQ(l.slice_of(r, g), expected[r]) << r;
    const Shape b = l.block_of(r);
    EXPECT_EQ(b[0] * 2 + b[1], slice_index[r]) << r;
  }
}

TEST(Layout, ExampleD1_OptimizerShardWholeReplicaGroup) {
  const Shape g{8, 4};
  const int64_t first_row[] = {0, 4, 1, 5, 2, 6, 3, 7};
  for (int32_t size : {4, -1}) {
    const Layout l = make(classic({4, 2}, {0, -1}, 2, size));
    EXPECT_EQ(l.splits(), (Shape{8, 1})) << size;
    for (int64_t r = 0; r < 8; ++r)
      EXPECT_EQ(l.slice_of(r, g), box({first_row[r], 0}, {first_row[r] + 1, 4})) << r;
    EXPECT_EQ(l.slice_shape(g, "w"), (Shape{1, 4}));
    EXPECT_EQ(l.global_shape(Shape{1, 4}), g);
    // The optimizer split uses the whole replication axis, least significant in dim 0.
    EXPECT_EQ(l.axes(), (Shape{4, 2}));
    EXPECT_EQ(l.dim_axes(), (std::vector<std::vector<int32_t>>{{1, 0}, {}}));
  }
}

TEST(Layout, ExampleD2_OptimizerShardHalfReplicaGroup) {
  const Layout l = make(classic({4, 2}, {0, -1}, 2, 2));
  const Shape g{8, 4};
  const int64_t first_row[] = {0, 4, 2, 6, 0, 4, 2, 6};
  for (int64_t r = 0; r < 8; ++r)
    EXPECT_EQ(l.slice_of(r, g), box({first_row[r], 0}, {first_row[r] + 2, 4})) << r;
  EXPECT_EQ(l.slice_shape(g, "w"), (Shape{2, 4}));
  // K=2 does not fall on an axis boundary: the size-4 axis splits into (2, 2).
  EXPECT_EQ(l.axes(), (Shape{2, 2, 2}));
  EXPECT_EQ(l.dim_axes(), (std::vector<std::vector<int32_t>>{{2, 1}, {}}));
}

TEST(Layout, ExampleE_MultiAxisDimension) {
  ParamLayout p;
  p.dev_matrix = {2, 2, 2};
  p.tensor_map = {DimAxes{1, 0}, DimAxes{}};
  const Layout l = make(p);
  const Shape g{8, 4};
  const int64_t first_row[] = {0, 2, 4, 6, 0, 2, 4, 6};
  for (int64_t r = 0; r < 8; ++r)
    EXPECT_EQ(l.slice_of(r, g), box({first_row[r], 0}, {first_row[r] + 2, 4})) << r;
  EXPECT_EQ(l.splits(), (Shape{4, 1}));
}

TEST(Layout, ExampleF_PipelineStageLayouts) {
  const Layout w0 = make(classic({2, 2}, {1, -1}));
  const Layout w1 = make(classic({2, 2}, {-1, 0}));
  const Shape g{4, 4};
  EXPECT_EQ(w0.slice_of(0, g), box({0, 0}, {2, 4}));
  EXPECT_EQ(w0.slice_of(1, g), box({0, 0}, {2, 4}));
  EXPECT_EQ(w0.slice_of(2, g), box({2, 0}, {4, 4}));
  EXPECT_EQ(w0.slice_of(3, g), box({2, 0}, {4, 4}));
  EXPECT_EQ(w1.slice_of(0, g), box({0, 0}, {4, 2}));
  EXPECT_EQ(w1.slice_of(2, g), box({0, 0}, {4, 2}));
  EXPECT_EQ(w1.slice_of(1, g), box({0, 2}, {4, 4}));
  EXPECT_EQ(w1.slice_of(3, g), box({0, 2}, {4, 4}));
}

// MindSpore's optimizer-shard unit tests: 16 devices, global [16, 8], row i holds value i, so a
// rank's first row is the first value it stores.
TEST(Layout, MindSporeOptimizerShardVectors) {
  const Shape g{16, 8};
  const Layout a = make(classic({4, 4}, {0, -1}, 4, 2));
  const Layout b = make(classic({8, 2}, {0, -1}, 2, 4));
  const Layout c = make(classic({16}, {-1, -1}, 1, 16));
  const Layout d = make(classic({4, 4}, {-1, 0}, 4, 2));
  for (int64_t r = 0; r < 16; ++r) {
    const Box ba = a.slice_of(r, g), bb = b.slice_of(r, g), bc = c.slice_of(r, g),
              bd = d.slice_of(r, g);
    EXPECT_EQ(ba.begin[0], (r % 4) * 4 + ((r / 4) % 2) * 2) << r;
    EXPECT_EQ(ba.end[0] - ba.begin[0], 2);
    EXPECT_EQ(bb.begin[0], (r % 2) * 8 + ((r / 2) % 4) * 2) << r;
    EXPECT_EQ(bb.end[0] - bb.begin[0], 2);
    EXPECT_EQ(bc, box({r, 0}, {r + 1, 8})) << r;
    EXPECT_EQ(bd.begin[0], ((r / 4) % 2) * 8) << r;
    EXPECT_EQ(bd.end[0] - bd.begin[0], 8);
    EXPECT_EQ(bd.begin[1], (r % 4) * 2) << r;
    EXPECT_EQ(bd.end[1] - bd.begin[1], 2);
  }
}

TEST(Layout, AppendixBEightDeviceVector) {
  const Layout l = make(classic({2, 4}, {0, -1}, 4, 2));
  const Shape g{16, 8};
  for (int64_t r = 0; r < 8; ++r)
    EXPECT_EQ(l.slice_of(r, g).begin[0], (r % 4) * 4 + (r / 4) * 2) << r;
}

// Two replication axes (0 and 2) around the model axis: the piece is the position in the
// ascending replica group mod K (§3.2), so K=2 rides on the innermost replication axis.
TEST(Layout, OptimizerShardOverSeveralReplicationAxes) {
  const Shape g{8, 4};
  // Replica groups {0,1,4,5} and {2,3,6,7}; K=2: positions 0,1,2,3 -> pieces 0,1,0,1.
  const Layout half = make(classic({2, 2, 2}, {1, -1}, 1, 2));
  const int64_t first_row_half[] = {0, 2, 4, 6, 0, 2, 4, 6};
  // K=4: the piece is the whole position.
  const Layout all = make(classic({2, 2, 2}, {1, -1}, 1, 4));
  const int64_t first_row_all[] = {0, 1, 4, 5, 2, 3, 6, 7};
  for (int64_t r = 0; r < 8; ++r) {
    EXPECT_EQ(half.slice_of(r, g), box({first_row_half[r], 0}, {first_row_half[r] + 2, 4})) << r;
    EXPECT_EQ(all.slice_of(r, g), box({first_row_all[r], 0}, {first_row_all[r] + 1, 4})) << r;
  }
}

TEST(Layout, OptimizerGroupsAreConsecutiveRunsOfTheReplicaList) {
  // Replica list of rank 0 is [0,8,16,24]; K=2 groups {0,8} and {16,24} (§3.2).
  const Layout l = make(classic({4, 8}, {-1, 0}, 8, 2));
  const Shape g{4, 8};
  EXPECT_EQ(l.slice_of(0, g).begin[0], 0);
  EXPECT_EQ(l.slice_of(8, g).begin[0], 2);
  EXPECT_EQ(l.slice_of(16, g).begin[0], 0);
  EXPECT_EQ(l.slice_of(24, g).begin[0], 2);
  EXPECT_EQ(l.slice_of(24, g).begin[1], 0);
  EXPECT_EQ(l.slice_of(25, g).begin[1], 1);
}

TEST(Layout, NoOptimizerShardWhenStepOrSizeIsZero) {
  const Layout plain = make(classic({4, 2}, {0, -1}));
  EXPECT_EQ(make(classic({4, 2}, {0, -1}, 2, 0)), plain);
  EXPECT_EQ(make(classic({4, 2}, {0, -1}, 0, -1)), plain);
  EXPECT_EQ(plain.splits(), (Shape{2, 1}));
}

TEST(Layout, UnshardedHoldsEverything) {
  const Layout l = Layout::unsharded(2);
  EXPECT_EQ(l.devices(), 1);
  EXPECT_EQ(l.tensor_rank(), 2u);
  EXPECT_EQ(l.slice_of(0, Shape{8, 8}), box({0, 0}, {8, 8}));
  EXPECT_EQ(make(classic({1}, {-1, -1})), l);
  const Layout scalar = Layout::unsharded(0);
  EXPECT_EQ(scalar.slice_of(0, Shape{}), box({}, {}));
}

TEST(Layout, ShapeErrorsNameParameterAndDimension) {
  const Layout l = make(classic({2, 4}, {1, 0}));
  try {
    l.slice_shape(Shape{8, 6}, "model.fc.weight");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), AllOf(HasSubstr("model.fc.weight"), HasSubstr("dimension 1"),
                                             HasSubstr("4 blocks")));
  }
  const Layout d1 = make(classic({4, 2}, {0, -1}, 2, 4));
  EXPECT_THROW(d1.slice_shape(Shape{4, 4}, "w"), Error);  // 4 rows into 8 blocks
  EXPECT_THROW(l.slice_of(0, Shape{8}), Error);
  EXPECT_THROW(l.slice_of(8, Shape{8, 8}), Error);
  EXPECT_THROW(l.global_shape(Shape{4}), Error);
}

// A slice [0, 2^63-1] holds no bytes, so a scanner accepts it; split four ways its global shape
// does not fit int64 (signed overflow before this was checked), nor does a negative dim make one.
TEST(Layout, GlobalShapeOverflowIsAnError) {
  const Layout l = make(classic({4}, {-1, 0}));
  const int64_t max = std::numeric_limits<int64_t>::max();
  EXPECT_THAT(error_of_call([&] {
                l.global_shape(Shape{0, max});
              }),
              AllOf(HasSubstr("0,9223372036854775807"), HasSubstr("64 bits")));
  EXPECT_THROW(l.global_shape(Shape{0, max / 4 + 1}), Error);
  EXPECT_EQ(l.global_shape(Shape{0, max / 4}), (Shape{0, max / 4 * 4}));
  EXPECT_THROW(l.global_shape(Shape{-1, 2}), Error);
}

TEST(Layout, RefusalsNameTheParameter) {
  struct Case {
    ParamLayout layout;
    size_t rank;
    const char* what;
  };
  ParamLayout field = classic({2}, {0, -1});
  field.field = 4;
  ParamLayout manual = classic({2}, {0, -1});
  manual.param_split_shape = {3, 5};
  manual.indices_offset = {0, 3};
  ParamLayout twice;
  twice.dev_matrix = {2, 2};
  twice.tensor_map = {DimAxes{0}, DimAxes{1, 0}};
  const Case cases[] = {
      {classic({2, 4}, {1, -1}), 3, "dimensions"},  // map length != tensor rank
      {classic({2, 4}, {2, -1}), 2, "axis 2"},      // axis out of range
      {classic({2, 4}, {-2, -1}), 2, "axis -2"},    // negative axis
      {classic({2, 4}, {0, 0}), 2, "twice"},        // axis used by two dims
      {twice, 2, "twice"},                          // ... also inside a multi-axis dim
      {field, 2, "field"},                          // field-split embedding
      {manual, 2, "param_split_shape"},             // manual uneven split
      {classic({4, 2}, {0, -1}, 0, 4), 2, "opt_weight_shard_step 0"},
      {classic({4}, {-1, -1}, 1, 3), 2, "does not divide"},     // K=3, R=4
      {classic({2, 2}, {0, -1}, 1, 4), 2, "does not divide"},   // K=4 > R=2
      {classic({2, 3}, {-1, -1}, 1, 2), 2, "does not factor"},  // K=2 over axes 2x3
      {classic({4}, {-1}, 1, -2), 1, "opt_weight_shard_size -2"},
      {classic({2, 0}, {-1}), 1, "non-positive"},
      {classic({4}, {}, 1, 4), 0, "0-d"},
  };
  for (const Case& c : cases) {
    const std::string message = error_of(c.layout, c.rank, "layers.3.w");
    EXPECT_THAT(message, AllOf(HasSubstr("layers.3.w"), HasSubstr(c.what))) << c.what;
  }
}

}  // namespace
}  // namespace ckptfs::strategy
