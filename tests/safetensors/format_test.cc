// The header encoder against a file the reference writer wrote, and against hand-counted bytes.
#include "ckptfs/safetensors/format.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ckptfs/safetensors/scanner.h"
#include "support/test_support.h"

namespace ckptfs::safetensors {
namespace {

const std::string kReference =
    std::string(CKPTFS_SOURCE_DIR) + "/tests/data/safetensors/merged_model_t113.safetensors";

TEST(Encoder, RebuildsTheReferenceWritersHeaderByteForByte) {
  const scan::FileScan scan = scan_safetensors(kReference);
  std::vector<HeaderEntry> entries;
  for (const scan::Param& p : scan.params)  // name order: the encoder must re-sort
    entries.push_back({p.name, dtype_by_mindspore(p.dtype)->code, p.shape, p.nbytes()});
  sort_like_writer(entries);
  const std::vector<std::pair<std::string, std::string>> metadata{{"format", "pt"}};
  const std::string header = encode_header(entries, metadata);
  const std::string file = testsupport::read_file(kReference);
  ASSERT_EQ(header.size(), 8u + 1112u);  // spec §4.4: N = 1112
  EXPECT_EQ(header, file.substr(0, header.size()));
}

TEST(Encoder, PadsWithSpacesToAMultipleOfEight) {
  const std::vector<HeaderEntry> entries{{"a", "F32", {2}, 8}};
  const std::vector<std::pair<std::string, std::string>> metadata{{"format", "ms"}};
  const std::string json =
      R"({"__metadata__":{"format":"ms"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string expected = json + std::string((8 - json.size() % 8) % 8, ' ');
  const std::string header = encode_header(entries, metadata);
  ASSERT_EQ(header.size(), 8 + expected.size());
  EXPECT_EQ(header.substr(8), expected);
  EXPECT_EQ(static_cast<unsigned char>(header[0]), expected.size());
  EXPECT_EQ(header.substr(1, 7), std::string(7, '\0'));
}

TEST(Encoder, EmptyFileWithoutMetadata) {
  EXPECT_EQ(encode_header({}, {}), std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
}

TEST(Encoder, EscapesLikeSerdeJson) {
  std::string out;
  append_json_string(out, std::string("a\"b\\c\n\x01\x7f\xc3\xa9", 10));
  EXPECT_EQ(out, std::string("\"a\\\"b\\\\c\\n\\u0001\x7f\xc3\xa9\""));
}

TEST(Encoder, WriterOrderIsDtypeDescendingThenNameBytes) {
  std::vector<HeaderEntry> e{{"b", "F16", {}, 2}, {"a", "F16", {}, 2},  {"z", "BOOL", {}, 1},
                             {"c", "I64", {}, 8}, {"d", "BF16", {}, 2}, {"e", "F32", {}, 4},
                             {"B", "F16", {}, 2}};
  sort_like_writer(e);
  std::string names;
  for (const auto& x : e) names += x.name;
  EXPECT_EQ(names, "cedBabz");
}

}  // namespace
}  // namespace ckptfs::safetensors
