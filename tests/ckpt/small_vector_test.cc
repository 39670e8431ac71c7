#include "ckptfs/util/small_vector.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <utility>

#include "ckptfs/ckpt/scanner.h"

namespace ckptfs {
namespace {

using scan::Extent;
using scan::Extents;
using ::testing::ElementsAre;

TEST(SmallVector, OneExtentIsHeldInline) {
  static_assert(sizeof(Extents) == 24);
  Extents v;
  EXPECT_TRUE(v.empty());
  v.push_back({1, 2});
  EXPECT_EQ(v.capacity(), 1u);
  EXPECT_EQ(static_cast<const void*>(v.data()), static_cast<const void*>(&v));
  EXPECT_THAT(v, ElementsAre(Extent{1, 2}));
}

TEST(SmallVector, GrowsOntoTheHeapKeepingItsElements) {
  Extents v;
  for (uint64_t i = 0; i < 100; ++i) v.push_back({i, i + 1});
  ASSERT_EQ(v.size(), 100u);
  for (uint64_t i = 0; i < 100; ++i) EXPECT_EQ(v[i], (Extent{i, i + 1}));
  EXPECT_EQ(v.front(), (Extent{0, 1}));
  EXPECT_EQ(v.back(), (Extent{99, 100}));
}

TEST(SmallVector, PushingItsOwnElementWhileGrowing) {
  Extents v{{7, 8}};
  v.push_back(v[0]);
  v.push_back(v[1]);
  EXPECT_THAT(v, ElementsAre(Extent{7, 8}, Extent{7, 8}, Extent{7, 8}));
}

TEST(SmallVector, CopiesAndMovesInlineAndOnTheHeap) {
  for (const size_t n : {size_t{1}, size_t{5}}) {
    Extents a;
    for (uint64_t i = 0; i < n; ++i) a.push_back({i, 10});
    Extents copy = a;
    EXPECT_EQ(copy, a);
    Extents moved = std::move(copy);
    EXPECT_EQ(moved, a);
    EXPECT_TRUE(copy.empty());  // NOLINT(bugprone-use-after-move): a moved-from vector is empty
    Extents assigned{{3, 3}, {4, 4}, {5, 5}};
    assigned = a;
    EXPECT_EQ(assigned, a);
    Extents target{{9, 9}};
    target = std::move(assigned);
    EXPECT_EQ(target, a);
    const Extents& self = target;
    target = self;
    EXPECT_EQ(target, a);
  }
}

TEST(SmallVector, AssignsAndComparesAsAList) {
  Extents v{{1, 1}, {2, 2}};
  v = {{5, 6}};
  EXPECT_THAT(v, ElementsAre(Extent{5, 6}));
  EXPECT_NE(v, (Extents{{5, 6}, {7, 8}}));
  EXPECT_NE(v, (Extents{{5, 7}}));
  v.clear();
  EXPECT_EQ(v, Extents{});
}

}  // namespace
}  // namespace ckptfs
