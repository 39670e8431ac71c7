#include "ckptfs/scan/dtype.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>

namespace ckptfs::scan {
namespace {

TEST(Dtype, KnownNamesReadBackWithTheirElementSize) {
  static_assert(sizeof(Dtype) == 16);
  for (const DenseType& t : kDenseTypes) {
    const Dtype d(t.name);
    EXPECT_EQ(d.name(), t.name);
    EXPECT_EQ(d.element_size(), t.size);
  }
  EXPECT_EQ(Dtype("str").name(), "str");
  EXPECT_EQ(Dtype("str").element_size(), 0u);
  EXPECT_TRUE(Dtype().empty());
  EXPECT_EQ(Dtype(""), Dtype());
}

TEST(Dtype, AnyOtherNameIsKeptAsWritten) {
  const std::string odd = "random_op" + std::string(1, '\0') + std::string(40, 'x');
  Dtype d(odd);
  EXPECT_EQ(d.name(), odd);
  EXPECT_EQ(d.element_size(), 0u);
  Dtype copy = d;
  EXPECT_EQ(copy, d);
  Dtype moved = std::move(copy);
  EXPECT_EQ(moved.name(), odd);
  Dtype assigned("Float32");
  assigned = d;
  EXPECT_EQ(assigned.name(), odd);
  assigned = Dtype("Int4");
  EXPECT_EQ(assigned, "Int4");
  EXPECT_NE(assigned, d);
  EXPECT_EQ(fmt::format("[{}]", assigned), "[Int4]");
}

}  // namespace
}  // namespace ckptfs::scan
