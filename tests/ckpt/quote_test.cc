// What messages may quote from a file (include/ckptfs/util/quote.h).
#include "ckptfs/util/quote.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ckptfs {
namespace {

TEST(FileText, EscapesControlsQuotesAndBytesThatAreNotUtf8) {
  EXPECT_EQ(file_text("layer.0.weight"), "\"layer.0.weight\"");
  EXPECT_EQ(file_text(std::string("a\0b", 3)), "\"a\\x00b\"");
  EXPECT_EQ(file_text("\x1b[31m\n\"\\\xe4"), "\"\\x1b[31m\\x0a\\x22\\\\\\xe4\"");
  EXPECT_EQ(file_text("\xc3\xa9t\xc3\xa9"), "\"\xc3\xa9t\xc3\xa9\"");  // UTF-8 letters are kept
}

TEST(FileText, ShowsAtMostTheLimit) {
  const std::string long_name(300, 'A');
  EXPECT_EQ(file_text(long_name), "\"" + std::string(kQuoteLimit, 'A') + "...\" (300 bytes)");
  EXPECT_EQ(file_text(std::string(kQuoteLimit, 'A')), "\"" + std::string(kQuoteLimit, 'A') + "\"");
}

TEST(FileNumber, OnlyNumbersNoLargerThanTheFile) {
  EXPECT_EQ(file_number(100, 100), "100");
  EXPECT_EQ(file_number(0, 0), "0");
  // "S3cr3t!K" read as a little-endian length: never printed.
  EXPECT_EQ(file_number(5413735991387304787ull, 4096), ">4096");
  EXPECT_EQ(file_shape(std::vector<int64_t>{2, 3}, 64), "[2,3]");
  EXPECT_EQ(file_shape(std::vector<int64_t>{2, 5413735991387304787}, 64),
            "[...] (a dimension negative or larger than the 64-byte file)");
  EXPECT_EQ(file_shape(std::vector<int64_t>{-1}, 64),
            "[...] (a dimension negative or larger than the 64-byte file)");
}

TEST(JsonErrorText, CutsTheInputTheParserQuotes) {
  EXPECT_EQ(json_error_text("[json.exception.parse_error.101] parse error at line 1, column 9: "
                            "syntax error while parsing value - invalid literal; last read: "
                            "'S3cr3t!K'; expected end of input"),
            "[json.exception.parse_error.101] parse error at line 1, column 9: syntax error while "
            "parsing value - invalid literal");
  EXPECT_EQ(json_error_text("[json.exception.out_of_range.406] number overflow parsing '1e999'"),
            "[json.exception.out_of_range.406] number overflow parsing");
}

}  // namespace
}  // namespace ckptfs
