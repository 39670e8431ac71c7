// The chosen files a shipped index keeps: written and read back, and every malformed text refused.
#include "ckptfs/source/pinned_files.h"

#include <gtest/gtest.h>

#include <string>

namespace ckptfs::source {
namespace {

TEST(PinnedFilesTest, RoundTrip) {
  Choice choice;
  choice.mixed_allowed = true;
  choice.files = {{0, "/ckpt/rank_0/net-1_10.ckpt"}, {12, "/ckpt/rank 12/a\tb.ckpt"}};
  const std::string text = files_text(choice);
  EXPECT_EQ(text, "mixed 1\n0\t/ckpt/rank_0/net-1_10.ckpt\n12\t/ckpt/rank 12/a\tb.ckpt\n");
  const std::optional<Choice> back = parse_files_text(text);
  ASSERT_TRUE(back.has_value());
  EXPECT_TRUE(back->mixed_allowed);
  EXPECT_EQ(back->files, choice.files);
}

TEST(PinnedFilesTest, MalformedTextsAreRefused) {
  for (const char* text : {
           "",                                     // nothing
           "mixed 0\n",                            // no file
           "mixed 2\n0\t/a\n",                     // unknown first line
           "0\t/a\n",                              // no first line
           "mixed 0\n0\t/a",                       // no final newline
           "mixed 0\n0 /a\n",                      // no tab
           "mixed 0\n\t/a\n",                      // no rank
           "mixed 0\n-1\t/a\n",                    // negative rank
           "mixed 0\n+1\t/a\n",                    // not a plain decimal
           "mixed 0\n1x\t/a\n",                    // trailing garbage in the rank
           "mixed 0\n99999999999999999999\t/a\n",  // beyond int64
           "mixed 0\n0\t\n",                       // empty path
           "mixed 0\n0\trank_0/a.ckpt\n",          // relative path
           "mixed 0\n0\t/a\n0\t/b\n",              // a rank twice
       })
    EXPECT_FALSE(parse_files_text(text).has_value()) << text;
  EXPECT_FALSE(parse_files_text(std::string("mixed 0\n0\t/a\0b\n", 15)).has_value());
}

// Found reading the parser for its fuzz target: a line without a tab had the parser compute
// line.data() + npos (a pointer far outside the text) before it checked for the tab.
TEST(PinnedFilesTest, LineWithoutATabIsRefusedBeforeParsingItsRank) {
  EXPECT_FALSE(parse_files_text("mixed 0\n12345\n").has_value());
}

}  // namespace
}  // namespace ckptfs::source
