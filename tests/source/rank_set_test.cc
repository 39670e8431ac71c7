#include "ckptfs/util/rank_set.h"

#include <gtest/gtest.h>

#include <string>

namespace ckptfs::util {
namespace {

std::string refusal(std::string_view text) {
  try {
    parse_rank_set(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RankSet, ListsAndRanges) {
  EXPECT_EQ(parse_rank_set("0-3,16"), (std::vector<int64_t>{0, 1, 2, 3, 16}));
  EXPECT_EQ(parse_rank_set("5,1,2-3,3"), (std::vector<int64_t>{1, 2, 3, 5}));
  EXPECT_EQ(parse_rank_set("7-7"), (std::vector<int64_t>{7}));
}

TEST(RankSet, Refusals) {
  EXPECT_NE(refusal("").find("'' is not a rank"), std::string::npos);
  EXPECT_NE(refusal("1,,2").find("'' is not a rank"), std::string::npos);
  EXPECT_NE(refusal("-1").find("is not a rank"), std::string::npos);
  EXPECT_NE(refusal("4-2").find("range 4-2 runs backwards"), std::string::npos);
  EXPECT_NE(refusal("0-1048576").find("too long"), std::string::npos);
  EXPECT_EQ(refusal("0-1048575"), "");
}

// Each range within bounds, but together 2^26 ranks: gigabytes of set nodes before anything
// looked at them (what a fuzzer's rss limit catches).
TEST(RankSet, ManyLongRangesAreRefusedEarly) {
  std::string text = "0-1048575";
  for (int i = 1; i < 64; ++i) text += fmt::format(",{}-{}", i << 20, (i << 20) + 1048575);
  EXPECT_NE(refusal(text).find("more than 1048576 ranks"), std::string::npos);
}

// Found by fuzz_rank_set under -rss_limit_mb=512: one range of 765,302 ranks held in a std::set
// (about 64 bytes a node under ASan) went past the limit; the ranks are a sorted vector now.
TEST(RankSet, LongRangeFromTheFuzzer) {
  const std::vector<int64_t> ranks = parse_rank_set("3,8,4-0765305,7,05");
  ASSERT_EQ(ranks.size(), 765306u - 3);
  EXPECT_EQ(ranks.front(), 3);
  EXPECT_EQ(ranks.back(), 765305);
}

// Found by reading the parser for its fuzz target: a rank equal to the largest int64_t made the
// loop that stored a range step past it (a signed overflow: UBSan reports it; what an optimized
// build does is undefined).
TEST(RankSet, LargestRankEndsItsRange) {
  EXPECT_EQ(parse_rank_set("9223372036854775807"), (std::vector<int64_t>{9223372036854775807}));
  EXPECT_EQ(parse_rank_set("9223372036854775806-9223372036854775807,9223372036854775807"),
            (std::vector<int64_t>{9223372036854775806, 9223372036854775807}));
}

// Ranges out of order, overlapping, nested and repeated give each rank once, ascending (the
// ranges are sorted and merged; the ranks themselves are no longer sorted).
TEST(RankSet, OverlappingRangesAreMerged) {
  EXPECT_EQ(parse_rank_set("10-12,0-3,2-5,4,11,1-2,20,6-6"),
            (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 10, 11, 12, 20}));
  EXPECT_EQ(parse_rank_set("3-9,4-5,0-99").size(), 100u);
}

}  // namespace
}  // namespace ckptfs::util
