// The header scanner on hand-built files: one good file with every feature, and one damaged
// file per rule. Offsets are counted by hand from the bytes written here.
#include "ckptfs/safetensors/scanner.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "ckptfs/error.h"
#include "ckptfs/util/fd.h"
#include "support/test_support.h"

namespace ckptfs::safetensors {
namespace {

using ::testing::HasSubstr;
using testsupport::TempDir;

// 8-byte little-endian length, the header text as given, then `data`.
std::string file_bytes(const std::string& header, const std::string& data, uint64_t length) {
  std::string out;
  for (int i = 0; i < 8; ++i) out += static_cast<char>(length >> (8 * i));
  return out + header + data;
}
std::string file_bytes(const std::string& header, const std::string& data) {
  return file_bytes(header, data, header.size());
}

class ScannerTest : public ::testing::Test {
 protected:
  std::string write(const std::string& bytes) {
    return testsupport::write_file(dir_.path() / "x.safetensors", bytes).string();
  }
  // The message of the Error the scan throws ("" if it does not).
  std::string error_of(const std::string& bytes) {
    try {
      scan_safetensors(write(bytes));
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  std::string error_of(const std::string& header, const std::string& data) {
    return error_of(file_bytes(header, data));
  }
  TempDir dir_;
};

// Found by fuzz_safetensors: a number too large for a double made the JSON parser throw
// out_of_range, which escaped the scanner and ended the process.
TEST_F(ScannerTest, NumberBeyondDoubleRangeIsRefusedInOneLine) {
  const std::string msg = error_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                   R"("x":1.5E99999})",
                                   std::string(4, 'x'));
  EXPECT_THAT(msg, HasSubstr("x.safetensors: safetensors header cannot be read"));
}

TEST_F(ScannerTest, GoodFileGivesParamsInOffsetOrderWithAbsoluteExtents) {
  // Offset order: z (I64 scalar) [0,8), q (Int4-marked I8 [4]) [8,12), a (F32 [2]) [12,20),
  // e (F16 [0,3]) [20,20).
  const std::string header = R"({"__metadata__":{"q":"Int4","format":"ms"},)"
                             R"("a":{"dtype":"F32","shape":[2],"data_offsets":[12,20],"extra":1},)"
                             R"("z":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
                             R"("e":{"dtype":"F16","shape":[0,3],"data_offsets":[20,20]},)"
                             R"("q":{"dtype":"I8","shape":[4],"data_offsets":[8,12]}}  )";
  const std::string path = write(file_bytes(header, std::string(20, 'x')));
  const scan::FileScan scan = scan_safetensors(path);
  EXPECT_EQ(scan.format, scan::SourceFormat::Safetensors);
  EXPECT_EQ(scan.file_size, 8 + header.size() + 20);
  ASSERT_EQ(scan.params.size(), 4u);
  const uint64_t d = 8 + header.size();
  EXPECT_EQ(scan.params[0].name, "z");
  EXPECT_EQ(scan.params[0].dtype, "Int64");
  EXPECT_TRUE(scan.params[0].shape.empty());
  EXPECT_EQ(scan.params[1].name, "q");
  EXPECT_EQ(scan.params[1].dtype, "Int8");
  EXPECT_EQ(scan.params[1].kind, scan::EntryKind::Opaque);
  EXPECT_EQ(scan.params[1].content, (scan::Extents{{d + 8, 4}}));
  EXPECT_EQ(scan.params[2].name, "a");
  EXPECT_EQ(scan.params[2].dtype, "Float32");
  EXPECT_EQ(scan.params[2].element_size, 4u);
  EXPECT_EQ(scan.params[2].shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(scan.params[2].content, (scan::Extents{{d + 12, 8}}));
  EXPECT_EQ(scan.params[3].name, "e");
  EXPECT_EQ(scan.params[3].nbytes(), 0u);

  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  const Header h = read_header(fd.get(), path);
  ASSERT_EQ(h.metadata.size(), 2u);
  EXPECT_EQ(h.metadata[0].first, "q");  // file order kept
  EXPECT_EQ(h.tensors[0].name, "z");    // offset order
  EXPECT_EQ(h.tensors[3].name, "e");
}

TEST_F(ScannerTest, RefusesAFileShorterThanTheLength) {
  EXPECT_THAT(error_of("abc"), HasSubstr("too short"));
}

TEST_F(ScannerTest, RefusesAHugeHeaderLength) {
  EXPECT_THAT(error_of(file_bytes("{}", "", 1ull << 40)), HasSubstr("over the 100 MB limit"));
  EXPECT_THAT(error_of(file_bytes("{}", "", 100'000'001)), HasSubstr("byte offset 0"));
}

TEST_F(ScannerTest, RefusesAHeaderLongerThanTheFile) {
  EXPECT_THAT(error_of(file_bytes("{}", "", 50)),
              HasSubstr("header length field is larger than the file (10 bytes)"));
}

TEST_F(ScannerTest, RefusesInvalidJsonAndInvalidUtf8WithTheByteOffset) {
  EXPECT_THAT(error_of(R"({"a":)", ""), HasSubstr("not valid UTF-8 JSON"));
  const std::string bad_utf8 = "{\"a\xff\":{}}";
  const std::string msg = error_of(bad_utf8, "");
  EXPECT_THAT(msg, HasSubstr("not valid UTF-8 JSON"));
  EXPECT_THAT(msg, HasSubstr("byte offset 11"));  // 8 + the 4th header byte (0xff at index 3)
}

TEST_F(ScannerTest, RefusesANonObjectHeader) {
  EXPECT_THAT(error_of("[1,2]   ", ""), HasSubstr("not an object"));
}

TEST_F(ScannerTest, RefusesADuplicateName) {
  EXPECT_THAT(error_of(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                       R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                       "xy"),
              HasSubstr("names tensor \"a\" twice"));
}

// The header is read as a stream of events (a tree of ordered objects took O(n^2) of the tensor
// count): a key repeated at any level is still refused, never silently one of the copies.
TEST_F(ScannerTest, RefusesAKeyRepeatedInsideAnEntryOrTheMetadata) {
  EXPECT_THAT(
      error_of(R"({"a":{"dtype":"U8","shape":[1],"dtype":"I8","data_offsets":[0,1]}})", "x"),
      HasSubstr("\"a\" names \"dtype\" twice"));
  EXPECT_THAT(error_of(R"({"__metadata__":{"format":"pt","format":"ms"},)"
                       R"("a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
                       "x"),
              HasSubstr("\"__metadata__\" names \"format\" twice"));
  EXPECT_THAT(error_of(R"({"__metadata__":{},"__metadata__":{}})", ""),
              HasSubstr("names tensor \"__metadata__\" twice"));
}

// What keeps the file's order: the metadata, and among tensors of one offset (empty ones) the
// order they are listed in; the rest is offset order.
TEST_F(ScannerTest, KeepsFileOrderForMetadataAndForTensorsOfOneOffset) {
  const std::string header = R"({"z":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},)"
                             R"("__metadata__":{"m":"1","b":"2","k":"3"},)"
                             R"("y":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                             R"("c":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},)"
                             R"("a":{"dtype":"U8","shape":[0],"data_offsets":[1,1]}})";
  const std::string path = write(file_bytes(header, "x"));
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  const Header h = read_header(fd.get(), path);
  ASSERT_EQ(h.metadata.size(), 3u);
  EXPECT_EQ(h.metadata[0], (std::pair<std::string, std::string>{"m", "1"}));
  EXPECT_EQ(h.metadata[1], (std::pair<std::string, std::string>{"b", "2"}));
  EXPECT_EQ(h.metadata[2], (std::pair<std::string, std::string>{"k", "3"}));
  std::vector<std::string> names;
  for (const Tensor& t : h.tensors) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"z", "c", "y", "a"}));
}

// A NUL in a dtype would end the message there (what() is a C string).
TEST_F(ScannerTest, EscapesControlCharactersOfAnUnknownDtype) {
  const std::string msg =
      error_of(R"({"a":{"dtype":"F3\u00002\n","shape":[1],"data_offsets":[0,4]}})", "xxxx");
  EXPECT_THAT(msg, HasSubstr(R"(dtype "F3\x002\x0a" is not one of)"));
  EXPECT_EQ(msg.find('\0'), std::string::npos);
}

TEST_F(ScannerTest, RefusesUnknownDtypes) {
  for (const char* code : {"F8_E4M3", "C64", "f32", "STR"}) {
    const std::string header =
        std::string(R"({"a":{"dtype":")") + code + R"(","shape":[1],"data_offsets":[0,1]}})";
    EXPECT_THAT(error_of(header, "x"), HasSubstr("is not one of BOOL")) << code;
  }
}

TEST_F(ScannerTest, RefusesBadShapesAndOffsets) {
  EXPECT_THAT(error_of(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", ""),
              HasSubstr("non-negative integers"));
  EXPECT_THAT(error_of(R"({"a":{"dtype":"U8","shape":["1"],"data_offsets":[0,1]}})", "x"),
              HasSubstr("non-negative integers"));
  EXPECT_THAT(error_of(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", "x"),
              HasSubstr("not two non-negative integers"));
  EXPECT_THAT(error_of(R"({"a":{"dtype":"U8","shape":[1]}})", "x"),
              HasSubstr("not two non-negative integers"));
  EXPECT_THAT(error_of(R"({"a":{"shape":[1],"data_offsets":[0,1]}})", "x"),
              HasSubstr("no \"dtype\""));
  EXPECT_THAT(error_of(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[1,0]}})", "x"),
              HasSubstr("end before they begin"));
}

TEST_F(ScannerTest, RefusesShapeTimesSizeNotEqualToTheExtent) {
  EXPECT_THAT(error_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "xxxx"),
              HasSubstr("shape [2] is 8 bytes, but data_offsets [0,4] hold 4"));
  EXPECT_THAT(
      error_of(R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", ""),
      HasSubstr("overflows"));
}

TEST_F(ScannerTest, RefusesHolesOverlapsAndUncoveredBytes) {
  EXPECT_THAT(error_of(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", "xy"),
              HasSubstr("leave bytes [0,1)"));
  EXPECT_THAT(error_of(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                       R"("b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})",
                       "xyz"),
              HasSubstr("overlap tensor \"a\""));
  EXPECT_THAT(error_of(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "xy"),
              HasSubstr("longer than its header says"));
  EXPECT_THAT(error_of(R"({"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}})", "xy"),
              HasSubstr("truncated"));
}

TEST_F(ScannerTest, RefusesMetadataThatIsNotAStringMap) {
  EXPECT_THAT(error_of(R"({"__metadata__":[]})", ""), HasSubstr("not a string-to-string map"));
  EXPECT_THAT(error_of(R"({"__metadata__":{"format":1}})", ""),
              HasSubstr("\"format\" is a JSON number, not a string"));
}

TEST_F(ScannerTest, RefusesAnInt4MarkerForNoTensor) {
  EXPECT_THAT(error_of(R"({"__metadata__":{"w":"Int4"}})", ""),
              HasSubstr("marks \"w\" as Int4, but the file has no tensor"));
}

TEST_F(ScannerTest, ErrorsNameTheFile) {
  EXPECT_THAT(error_of("[1]     ", ""), HasSubstr("x.safetensors"));
}

}  // namespace
}  // namespace ckptfs::safetensors
