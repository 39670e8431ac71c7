// Scanner behaviour on hand-built files: the byte-level examples of spec §1.3 and §1.7, and
// every malformed shape we can name. Expected offsets are counted by hand from those bytes.
#include "ckptfs/ckpt/scanner.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ckptfs/ckpt/crc32.h"
#include "ckptfs/error.h"
#include "ckptfs/util/fd.h"
#include "support/test_support.h"

namespace ckptfs::ckpt {
namespace {

using scan::EntryKind;
using scan::Extent;
using scan::FileScan;
using scan::Param;

using ::testing::ElementsAre;
using ::testing::HasSubstr;
// bytes(), and a minimal protobuf writer for the cases the spec has no literal bytes for.
using namespace testsupport;

// Spec §1.3: "w" = [1.0f, 2.0f], 28 bytes, content at 20.
const std::string kW =
    bytes({0x0A, 0x1A, 0x0A, 0x01, 'w',  0x12, 0x15, 0x08, 0x02, 0x12, 0x07, 'F',  'l',  'o',
           'a',  't',  '3',  '2',  0x1A, 0x08, 0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x00, 0x40});
// ≥2.3 scalar epoch_num = 3, no dims, 32 bytes, content at 24.
const std::string kEpoch23 = bytes({0x0A, 0x1E, 0x0A, 0x09}) + "epoch_num" +
                             bytes({0x12, 0x11, 0x12, 0x05}) + "Int64" +
                             bytes({0x1A, 0x08, 3, 0, 0, 0, 0, 0, 0, 0});
// ≤2.2 scalar with dims [0], 34 bytes, content at 26.
const std::string kEpoch22 = bytes({0x0A, 0x20, 0x0A, 0x09}) + "epoch_num" +
                             bytes({0x12, 0x13, 0x08, 0x00, 0x12, 0x05}) + "Int64" +
                             bytes({0x1A, 0x08, 3, 0, 0, 0, 0, 0, 0, 0});
// String "ab", 27 bytes, content at 19.
const std::string kNote = bytes({0x0A, 0x19, 0x0A, 0x04}) + "note" +
                          bytes({0x12, 0x11, 0x08, 0x00, 0x12, 0x03}) + "str" +
                          bytes({0x1A, 0x08, 'a', 0, 0, 0, 'b', 0, 0, 0});
// Spec §1.7 trailer for the body kW + kEpoch23.
const std::string kCrcTrailer =
    std::string("crc_num") + bytes({0, 0, 0, 0, 0, 0, 0xB1, 0x91, 0xEA, 0xB2});

// One chunk of parameter "c", dims [4], Int8, 2 content bytes; 19 bytes, content at 17.
std::string chunk_c(char a, char b) {
  return bytes({0x0A, 0x11, 0x0A, 0x01, 'c', 0x12, 0x0C, 0x08, 0x04, 0x12, 0x04}) + "Int8" +
         bytes({0x1A, 0x02, a, b});
}

class ScannerTest : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& content) {
    return testsupport::write_file(dir_ + "/" + name, content).string();
  }

  FileScan scan(const std::string& content, ScanOptions options = {}) {
    return scan_checkpoint(write("f.ckpt", content), options);
  }

  // Scanning must fail with an Error naming the file and the given byte offset.
  std::string expect_error(const std::string& content, uint64_t offset, ScanOptions options = {}) {
    const std::string path = write("bad.ckpt", content);
    try {
      scan_checkpoint(path, options);
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_THAT(msg, HasSubstr(path));
      EXPECT_THAT(msg, HasSubstr("byte offset " + std::to_string(offset) + ":"));
      return msg;
    }
    ADD_FAILURE() << "no error for a malformed file";
    return "";
  }

  testsupport::TempDir tmp_{"ckptfs_scanner"};
  std::string dir_ = tmp_.path().string();
};

TEST_F(ScannerTest, EmptyFileHasNoParams) {
  const FileScan s = scan("");
  EXPECT_EQ(s.file_size, 0u);
  EXPECT_EQ(s.body_size, 0u);
  EXPECT_FALSE(s.has_crc_trailer);
  EXPECT_TRUE(s.params.empty());
}

TEST_F(ScannerTest, SpecRecordW) {
  const FileScan s = scan(kW);
  EXPECT_EQ(s.file_size, 28u);
  EXPECT_EQ(s.body_size, 28u);
  ASSERT_EQ(s.params.size(), 1u);
  const Param& p = s.params[0];
  EXPECT_EQ(p.name, "w");
  EXPECT_EQ(p.dtype, "Float32");
  EXPECT_THAT(p.shape, ElementsAre(2));
  EXPECT_FALSE(p.dims_zero);
  EXPECT_EQ(p.kind, EntryKind::Tensor);
  EXPECT_EQ(p.element_size, 4u);
  EXPECT_THAT(p.content, ElementsAre(Extent{20, 8}));
  EXPECT_THAT(p.records, ElementsAre(Extent{0, 28}));
  EXPECT_EQ(p.nbytes(), 8u);
  EXPECT_EQ(p.elements(), 2u);
}

TEST_F(ScannerTest, ScalarWithoutDims) {
  const FileScan s = scan(kW + kEpoch23);
  ASSERT_EQ(s.params.size(), 2u);
  const Param& p = s.params[1];
  EXPECT_EQ(p.name, "epoch_num");
  EXPECT_EQ(p.dtype, "Int64");
  EXPECT_TRUE(p.shape.empty());
  EXPECT_FALSE(p.dims_zero);
  EXPECT_EQ(p.kind, EntryKind::Tensor);
  EXPECT_THAT(p.content, ElementsAre(Extent{28 + 24, 8}));
  EXPECT_THAT(p.records, ElementsAre(Extent{28, 32}));
  EXPECT_EQ(p.elements(), 1u);
}

TEST_F(ScannerTest, ScalarWithDimsZero) {
  const FileScan s = scan(kEpoch22);
  ASSERT_EQ(s.params.size(), 1u);
  const Param& p = s.params[0];
  EXPECT_TRUE(p.shape.empty());
  EXPECT_TRUE(p.dims_zero);
  EXPECT_EQ(p.kind, EntryKind::Tensor);
  EXPECT_THAT(p.content, ElementsAre(Extent{26, 8}));
  EXPECT_THAT(p.records, ElementsAre(Extent{0, 34}));
}

TEST_F(ScannerTest, StringEntry) {
  const FileScan s = scan(kNote);
  ASSERT_EQ(s.params.size(), 1u);
  const Param& p = s.params[0];
  EXPECT_EQ(p.name, "note");
  EXPECT_EQ(p.dtype, "str");
  EXPECT_EQ(p.kind, EntryKind::String);
  EXPECT_EQ(p.element_size, 0u);
  EXPECT_TRUE(p.dims_zero);
  EXPECT_THAT(p.shape, ElementsAre(0));
  EXPECT_THAT(p.content, ElementsAre(Extent{19, 8}));
}

TEST_F(ScannerTest, SeveralRecordsInOrder) {
  const FileScan s = scan(kW + kEpoch23 + kNote + kEpoch22);
  // The second epoch_num is not adjacent to the first: two entries, as recorded.
  ASSERT_EQ(s.params.size(), 4u);
  EXPECT_EQ(s.params[0].name, "w");
  EXPECT_EQ(s.params[1].name, "epoch_num");
  EXPECT_EQ(s.params[2].name, "note");
  EXPECT_EQ(s.params[3].name, "epoch_num");
  EXPECT_THAT(s.params[2].content, ElementsAre(Extent{60 + 19, 8}));
  EXPECT_THAT(s.params[3].content, ElementsAre(Extent{87 + 26, 8}));
  EXPECT_THAT(s.params[3].records, ElementsAre(Extent{87, 34}));
}

TEST_F(ScannerTest, CrcExampleOfSpec) {
  const std::string body = kW + kEpoch23;
  ASSERT_EQ(crc32_update(0, std::span(reinterpret_cast<const uint8_t*>(body.data()), body.size())),
            0xB191EAB2u);
  for (bool verify : {false, true}) {
    const FileScan s = scan(body + kCrcTrailer, ScanOptions{.verify_crc = verify});
    EXPECT_TRUE(s.has_crc_trailer);
    EXPECT_EQ(s.file_size, 77u);
    EXPECT_EQ(s.body_size, 60u);
    ASSERT_EQ(s.params.size(), 2u);
    EXPECT_EQ(s.params[1].name, "epoch_num");
    EXPECT_THAT(s.params[1].content, ElementsAre(Extent{52, 8}));
  }
}

TEST_F(ScannerTest, CrcMismatchFailsOnlyWhenVerifying) {
  std::string damaged = kW + kEpoch23 + kCrcTrailer;
  damaged[21] ^= 0x01;  // a content byte of "w": still a well-formed file
  EXPECT_EQ(scan(damaged).params.size(), 2u);
  const std::string path = write("damaged.ckpt", damaged);
  try {
    scan_checkpoint(path, ScanOptions{.verify_crc = true});
    ADD_FAILURE() << "CRC mismatch not detected";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("crc check failed"));
    EXPECT_THAT(e.what(), HasSubstr(path));
  }

  std::string bad_trailer = kW + kEpoch23 + kCrcTrailer;
  bad_trailer.back() ^= 0x80;
  EXPECT_THROW(scan(bad_trailer, ScanOptions{.verify_crc = true}), Error);
  // A value above 32 bits can never equal a CRC-32.
  std::string high_bits = kW + kEpoch23 + kCrcTrailer;
  high_bits[60 + 7] = 0x01;
  EXPECT_THROW(scan(high_bits, ScanOptions{.verify_crc = true}), Error);
}

// A body longer than the CRC check's 1 MiB read block (its buffer is sized to the body, at most
// one block): the bytes past the first block are checked too.
TEST_F(ScannerTest, CrcOverMoreThanOneReadBlock) {
  const size_t n = (size_t{1} << 20) + 100;
  std::string content(n, '\0');
  for (size_t i = 0; i < n; ++i) content[i] = static_cast<char>(i * 7);
  const std::string tensor = varint_field(1, n) + len_field(2, "Int8") + len_field(3, content);
  const std::string body = len_field(1, len_field(1, "big") + len_field(2, tensor));
  const uint32_t crc =
      crc32_update(0, std::span(reinterpret_cast<const uint8_t*>(body.data()), body.size()));
  std::string file = body + "crc_num" + std::string(6, '\0');
  for (int shift = 24; shift >= 0; shift -= 8) file.push_back(static_cast<char>(crc >> shift));
  const FileScan s = scan(file, {.verify_crc = true});
  EXPECT_EQ(s.body_size, body.size());
  ASSERT_EQ(s.params.size(), 1u);
  EXPECT_EQ(s.params[0].nbytes(), n);
  file[body.size() - 10] ^= 0x01;  // a content byte in the second block
  EXPECT_EQ(scan(file).params.size(), 1u);
  EXPECT_THROW(scan(file, {.verify_crc = true}), Error);
}

TEST_F(ScannerTest, CrcTrailerOnEmptyBody) {
  // CRC-32 of no bytes is 0.
  const FileScan s = scan(std::string("crc_num") + std::string(10, '\0'), {.verify_crc = true});
  EXPECT_TRUE(s.has_crc_trailer);
  EXPECT_EQ(s.body_size, 0u);
  EXPECT_TRUE(s.params.empty());
}

TEST_F(ScannerTest, EncryptedFilesAreRefused) {
  const std::pair<int, const char*> magics[] = {
      {0xD8, "AES-GCM"}, {0xD9, "AES-CBC"}, {0xDA, "SM4-CBC"}};
  for (const auto& [first, mode] : magics) {
    const std::string content = bytes({first, 0x5E, 0x3A, 0x7F}) + std::string(60, 'x');
    const std::string msg = expect_error(content, 0);
    EXPECT_THAT(msg, HasSubstr("encrypted checkpoint"));
    EXPECT_THAT(msg, HasSubstr(mode));
    EXPECT_THAT(msg, HasSubstr("--dec-key-file"));
  }
  // Only the three magics: a neighbour value is parsed (and fails) as protobuf instead.
  const std::string other = expect_error(bytes({0xDB, 0x5E, 0x3A, 0x7F}), 0);
  EXPECT_THAT(other, ::testing::Not(HasSubstr("encrypted")));
}

TEST_F(ScannerTest, PackedDims) {
  // dims [2,3] packed: 0A 02 02 03.
  const std::string tensor =
      len_field(1, bytes({2, 3})) + len_field(2, "Int8") + len_field(3, "ABCDEF");
  const std::string rec = len_field(1, len_field(1, "p") + len_field(2, tensor));
  const FileScan s = scan(rec);
  ASSERT_EQ(s.params.size(), 1u);
  EXPECT_THAT(s.params[0].shape, ElementsAre(2, 3));
  EXPECT_THAT(s.params[0].content, ElementsAre(Extent{rec.find("ABCDEF"), 6}));
}

TEST_F(ScannerTest, PackedAndUnpackedDimsMix) {
  const std::string tensor = varint_field(1, 2) + len_field(1, bytes({3, 4})) +
                             len_field(2, "Int8") + len_field(3, std::string(24, 'z'));
  const FileScan s = scan(len_field(1, len_field(1, "m") + len_field(2, tensor)));
  ASSERT_EQ(s.params.size(), 1u);
  EXPECT_THAT(s.params[0].shape, ElementsAre(2, 3, 4));
}

TEST_F(ScannerTest, UnknownFieldsAreSkippedAtEveryLevel) {
  // TensorProto: content first, unknown fields of each wire type in between.
  const std::string tensor = len_field(3, "CONTENT!") + bytes({0x25, 1, 2, 3, 4}) +  // 4: fixed32
                             len_field(5, "junk") + bytes({0x31, 1, 2, 3, 4, 5, 6, 7, 8}) +
                             varint_field(7, 300) + len_field(2, "UInt16") + varint_field(1, 4);
  const std::string value = varint_field(7, 1) + len_field(2, tensor) + len_field(9, "xyz") +
                            bytes({0x25, 9, 9, 9, 9}) + len_field(1, "u");
  // Top level: the 0.5-era model_type (field 2), and other wire types.
  const std::string file = len_field(2, "model") + varint_field(15, 1u << 20) +
                           bytes({0x19, 1, 2, 3, 4, 5, 6, 7, 8}) + len_field(1, value) +
                           bytes({0x1D, 1, 2, 3, 4}) + kW;
  const FileScan s = scan(file);
  ASSERT_EQ(s.params.size(), 2u);
  const Param& p = s.params[0];
  EXPECT_EQ(p.name, "u");
  EXPECT_EQ(p.dtype, "UInt16");
  EXPECT_THAT(p.shape, ElementsAre(4));
  EXPECT_THAT(p.content, ElementsAre(Extent{file.find("CONTENT!"), 8}));
  const uint64_t rec_at = file.find(len_field(1, value));
  EXPECT_THAT(p.records, ElementsAre(Extent{rec_at, len_field(1, value).size()}));
  EXPECT_EQ(s.params[1].name, "w");
  EXPECT_THAT(s.params[1].content, ElementsAre(Extent{file.size() - 8, 8}));
}

TEST_F(ScannerTest, RepeatedTensorFieldMergesAsProtobufDoes) {
  // Two occurrences of Value.tensor merge: dims append, the later type/content win.
  const std::string t1 = varint_field(1, 2) + len_field(2, "Int8") + len_field(3, "no");
  const std::string t2 = varint_field(1, 3) + len_field(2, "UInt8") + len_field(3, "SIXSIX");
  const std::string file = len_field(1, len_field(1, "r") + len_field(2, t1) + len_field(2, t2));
  const FileScan s = scan(file);
  ASSERT_EQ(s.params.size(), 1u);
  EXPECT_EQ(s.params[0].dtype, "UInt8");
  EXPECT_THAT(s.params[0].shape, ElementsAre(2, 3));
  EXPECT_THAT(s.params[0].content, ElementsAre(Extent{file.find("SIXSIX"), 6}));
}

std::string map_record(const std::string& tag, const std::string& rows_marker) {
  const std::string keys =
      varint_field(1, 2) + len_field(2, "int64") + len_field(3, rows_marker + "8bytes..");
  const std::string values =
      varint_field(1, 2) + varint_field(1, 1) + len_field(2, "float32") + len_field(3, "VALS4321");
  const std::string status = varint_field(1, 2) + len_field(2, "int32") + len_field(3, "st");
  const std::string map = len_field(1, keys) + len_field(1, values) + len_field(1, status);
  return len_field(1, len_field(1, tag) + len_field(3, map));
}

TEST_F(ScannerTest, MapTensorRecords) {
  const std::string m1 = map_record("emb", "K1");
  const std::string m2 = map_record("emb", "K2");
  const FileScan s = scan(m1 + m2 + kW);
  ASSERT_EQ(s.params.size(), 2u);
  const Param& p = s.params[0];
  EXPECT_EQ(p.name, "emb");
  EXPECT_EQ(p.kind, EntryKind::MapTensor);
  EXPECT_EQ(p.dtype, "");
  EXPECT_TRUE(p.content.empty());
  EXPECT_EQ(p.nbytes(), 0u);
  EXPECT_THAT(p.records, ElementsAre(Extent{0, m1.size()}, Extent{m1.size(), m2.size()}));
  EXPECT_EQ(s.params[1].name, "w");
  EXPECT_THAT(s.params[1].content, ElementsAre(Extent{m1.size() + m2.size() + 20, 8}));
}

TEST_F(ScannerTest, OpaqueTypesAreNotValidated) {
  const std::string int4 = len_field(
      1, len_field(1, "q") + len_field(2, varint_field(1, 4) + varint_field(1, 4) +
                                              len_field(2, "Int4") + len_field(3, "12345678")));
  const std::string rnd = len_field(
      1, len_field(1, "random_op") +
             len_field(2, varint_field(1, 3) + len_field(2, "random_op") + len_field(3, "abc")));
  const FileScan s = scan(int4 + rnd);
  ASSERT_EQ(s.params.size(), 2u);
  EXPECT_EQ(s.params[0].kind, EntryKind::Opaque);
  EXPECT_EQ(s.params[0].element_size, 0u);
  EXPECT_THAT(s.params[0].shape, ElementsAre(4, 4));
  EXPECT_EQ(s.params[0].nbytes(), 8u);
  EXPECT_EQ(s.params[1].kind, EntryKind::Opaque);
  EXPECT_THAT(s.params[1].shape, ElementsAre(3));
}

TEST_F(ScannerTest, ChunkedParameter) {
  const std::string file = kW + chunk_c(1, 2) + chunk_c(3, 4) + kNote;
  const FileScan s = scan(file);
  ASSERT_EQ(s.params.size(), 3u);
  const Param& c = s.params[1];
  EXPECT_EQ(c.name, "c");
  EXPECT_THAT(c.shape, ElementsAre(4));
  EXPECT_EQ(c.dtype, "Int8");
  EXPECT_THAT(c.content, ElementsAre(Extent{28 + 17, 2}, Extent{47 + 17, 2}));
  EXPECT_THAT(c.records, ElementsAre(Extent{28, 19}, Extent{47, 19}));
  EXPECT_EQ(c.nbytes(), 4u);
  EXPECT_EQ(s.params[2].name, "note");
}

TEST_F(ScannerTest, ChunksThatDisagreeAreRefused) {
  std::string other_dims = chunk_c(3, 4);
  other_dims[8] = 0x05;  // dims [5]
  EXPECT_THAT(expect_error(chunk_c(1, 2) + other_dims, 19), HasSubstr("\"c\""));
  std::string other_type = chunk_c(3, 4);
  other_type[14] = '6';  // "Int6": same length, another type
  EXPECT_THAT(expect_error(chunk_c(1, 2) + other_type, 19), HasSubstr("type"));
  EXPECT_THAT(expect_error(chunk_c(1, 2) + map_record("c", "K"), 19), HasSubstr("map tensor"));
}

TEST_F(ScannerTest, ChunkContentMustSumToShape) {
  // One chunk alone holds 2 of the 4 bytes [4] x Int8 needs.
  const std::string msg = expect_error(kW + chunk_c(1, 2) + kNote, 28);
  EXPECT_THAT(msg, HasSubstr("\"c\""));
  EXPECT_THAT(msg, HasSubstr("2 content bytes"));
}

TEST_F(ScannerTest, LoadedParamsOverwriteNonAdjacentDuplicates) {
  const std::string w2 = bytes({0x0A, 0x1A, 0x0A, 0x01, 'w', 0x12, 0x15, 0x08, 0x02, 0x12,
                                0x07, 'F',  'l',  'o',  'a', 't',  '3',  '2',  0x1A, 0x08}) +
                         std::string(8, 'n');
  const FileScan s = scan(kW + kEpoch23 + w2);
  ASSERT_EQ(s.params.size(), 3u);
  const auto loaded = loaded_params(s);
  ASSERT_EQ(loaded.size(), 2u);
  EXPECT_EQ(loaded[0].name, "w");
  EXPECT_THAT(loaded[0].content, ElementsAre(Extent{60 + 20, 8}));
  EXPECT_EQ(loaded[1].name, "epoch_num");
}

std::string float_record(const std::string& tag, const std::string& content4) {
  return len_field(
      1, len_field(1, tag) +
             len_field(2, varint_field(1, 1) + len_field(2, "Float32") + len_field(3, content4)));
}

TEST_F(ScannerTest, ParamKeySuffixIsStrippedAndMovedToTheEnd) {
  const std::string file = float_record("emb.__param_key__3", "EMB!") + float_record("a", "AAAA") +
                           float_record("b", "BBBB");
  const auto loaded = loaded_params(scan(file));
  ASSERT_EQ(loaded.size(), 3u);
  EXPECT_EQ(loaded[0].name, "a");
  EXPECT_EQ(loaded[1].name, "b");
  EXPECT_EQ(loaded[2].name, "emb");
  EXPECT_THAT(loaded[2].content, ElementsAre(Extent{file.find("EMB!"), 4}));
}

TEST_F(ScannerTest, ParamKeyOntoAnExistingNameKeepsThatPosition) {
  // MindSpore does dict[name] = dict.pop(suffixed): an existing key keeps its slot.
  const std::string file = float_record("x", "XXXX") + float_record("x.__param_key__1", "KKKK") +
                           float_record("y", "YYYY");
  const auto loaded = loaded_params(scan(file));
  ASSERT_EQ(loaded.size(), 2u);
  EXPECT_EQ(loaded[0].name, "x");
  EXPECT_THAT(loaded[0].content, ElementsAre(Extent{file.find("KKKK"), 4}));
  EXPECT_EQ(loaded[1].name, "y");
}

TEST_F(ScannerTest, LoadsAsSavedOnlyWithUniqueNamesAndNoCacheKey) {
  const FileScan plain = scan(float_record("a", "AAAA") + float_record("b", "BBBB"));
  EXPECT_TRUE(loads_as_saved(plain.params));
  EXPECT_EQ(loaded_params(plain).size(), plain.params.size());
  const FileScan repeated =
      scan(float_record("a", "AAAA") + float_record("b", "BBBB") + float_record("a", "CCCC"));
  EXPECT_FALSE(loads_as_saved(repeated.params));
  EXPECT_FALSE(loads_as_saved(scan(float_record("a.__param_key__1", "AAAA")).params));
}

TEST_F(ScannerTest, SameNamesComparesNamesInOrder) {
  const FileScan ab = scan(float_record("a", "AAAA") + float_record("b", "BBBB"));
  EXPECT_TRUE(
      same_names(ab.params, scan(float_record("a", "1111") + float_record("b", "2222")).params));
  EXPECT_FALSE(
      same_names(ab.params, scan(float_record("b", "BBBB") + float_record("a", "AAAA")).params));
  EXPECT_FALSE(same_names(ab.params, scan(float_record("a", "AAAA")).params));
  EXPECT_FALSE(
      same_names(ab.params, scan(float_record("a", "AAAA") + float_record("bb", "BBBB")).params));
  // Against names kept from an earlier file.
  const std::vector<std::string> kept{"a", "b"};
  EXPECT_TRUE(same_names(kept, ab.params));
  EXPECT_FALSE(same_names(std::vector<std::string>{"b", "a"}, ab.params));
  EXPECT_FALSE(same_names(std::vector<std::string>{"a"}, ab.params));
  EXPECT_FALSE(same_names(std::vector<std::string>{"a", "b", "c"}, ab.params));
}

// Every prefix of a multi-record file either ends on a record boundary outside a chunk run
// (valid, with the records so far) or fails with an Error naming the file.
TEST_F(ScannerTest, EveryTruncationIsDetected) {
  const std::string file = kW + kEpoch23 + kNote + chunk_c(1, 2) + chunk_c(3, 4);
  // Boundaries: 28, 60, 87, 106 (inside the "c" run, so incomplete), 125.
  const std::map<size_t, size_t> valid = {{0, 0}, {28, 1}, {60, 2}, {87, 3}, {125, 4}};
  ASSERT_EQ(file.size(), 125u);
  for (size_t len = 0; len <= file.size(); ++len) {
    // fmt, not "t" + std::to_string(len): GCC 12 warns (-Wrestrict) on that inlined insert.
    const std::string path = write(fmt::format("t{}.ckpt", len), file.substr(0, len));
    auto it = valid.find(len);
    if (it != valid.end()) {
      EXPECT_EQ(scan_checkpoint(path).params.size(), it->second) << "prefix " << len;
      continue;
    }
    try {
      scan_checkpoint(path);
      ADD_FAILURE() << "prefix of " << len << " bytes accepted";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(path)) << "prefix " << len;
      EXPECT_THAT(e.what(), HasSubstr("byte offset")) << "prefix " << len;
    }
  }
}

TEST_F(ScannerTest, MalformedInputsNameTheOffset) {
  // Truncated varints: a record length, and a key at the end of the file.
  EXPECT_THAT(expect_error(bytes({0x0A}), 1), HasSubstr("truncated varint"));
  EXPECT_THAT(expect_error(kW + bytes({0x0A, 0x80}), 29), HasSubstr("truncated varint"));
  EXPECT_THAT(expect_error(kW + bytes({0x80}), 28), HasSubstr("truncated varint"));
  // Eleven continuation bytes: not a varint at all.
  EXPECT_THAT(expect_error(bytes({0x0A}) + std::string(11, '\xFF') + std::string(20, 'a'), 1),
              HasSubstr("malformed varint"));
  // A record length beyond the end of the file (the corrupt fixture's failure).
  EXPECT_THAT(expect_error(bytes({0x0A, 0x40}) + kW.substr(2), 1),
              HasSubstr("length of Checkpoint.value is larger than the whole file (28 bytes)"));
  // A tag longer than its Value, though still inside the file.
  EXPECT_THAT(expect_error(bytes({0x0A, 0x03, 0x0A, 0x05}) + "abcde" + kW, 3),
              HasSubstr("length 5 of tag"));
  // Content longer than its TensorProto.
  std::string long_content = kW;
  long_content[19] = 0x09;
  EXPECT_THAT(expect_error(long_content, 19), HasSubstr("tensor_content"));
  // Field key 0 and invalid / group wire types.
  EXPECT_THAT(expect_error(kW + bytes({0x00}), 28), HasSubstr("invalid field key"));
  EXPECT_THAT(expect_error(bytes({0x13, 0x14}), 0), HasSubstr("group"));
  EXPECT_THAT(expect_error(bytes({0x16, 0x00}), 0), HasSubstr("invalid wire type"));
  EXPECT_THAT(expect_error(bytes({0x08, 0x01}), 0), HasSubstr("wrong wire type (expected 2)"));
  // A CRC trailer is only recognized at the very end: elsewhere 0x63 is a start-group key.
  EXPECT_THAT(expect_error(kCrcTrailer + kW, 0), HasSubstr("group"));
}

TEST_F(ScannerTest, MissingRequiredFields) {
  const std::string tensor = len_field(2, "Int8") + len_field(3, "x");
  EXPECT_THAT(expect_error(kW + len_field(1, len_field(2, tensor)), 28), HasSubstr("no tag"));
  EXPECT_THAT(expect_error(len_field(1, len_field(1, "n")), 0), HasSubstr("neither tensor"));
  EXPECT_THAT(expect_error(len_field(1, len_field(1, "n") + len_field(2, len_field(3, "x"))), 0),
              HasSubstr("no tensor_type"));
  EXPECT_THAT(expect_error(len_field(1, len_field(1, "n") + len_field(2, len_field(2, "Int8"))), 0),
              HasSubstr("no tensor_content"));
}

TEST_F(ScannerTest, NegativeDimsAreRefused) {
  // -1 as protobuf writes an int64: ten bytes. The dims varint starts at byte 8.
  const std::string tensor =
      varint_field(1, static_cast<uint64_t>(int64_t{-1})) + len_field(2, "Int8") + len_field(3, "");
  EXPECT_THAT(expect_error(len_field(1, len_field(1, "n") + len_field(2, tensor)), 8),
              HasSubstr("negative dimension"));
}

TEST_F(ScannerTest, ContentSizeMustMatchShape) {
  // "w" claims [2] x Float32 but holds 12 bytes.
  const std::string w12 = bytes({0x0A, 0x1E, 0x0A, 0x01, 'w', 0x12, 0x19, 0x08, 0x02, 0x12,
                                 0x07, 'F',  'l',  'o',  'a', 't',  '3',  '2',  0x1A, 0x0C}) +
                          std::string(12, '\0');
  const std::string msg = expect_error(kEpoch23 + w12, 32);
  EXPECT_THAT(msg, HasSubstr("\"w\""));
  EXPECT_THAT(msg, HasSubstr("12 content bytes"));
  EXPECT_THAT(msg, HasSubstr("needs 8"));
  // A ≤2.2 scalar is one element: dims [0] with 0 bytes is wrong for Int64.
  const std::string empty_scalar = bytes({0x0A, 0x18, 0x0A, 0x09}) + "epoch_num" +
                                   bytes({0x12, 0x0B, 0x08, 0x00, 0x12, 0x05}) + "Int64" +
                                   bytes({0x1A, 0x00});
  EXPECT_THAT(expect_error(empty_scalar, 0), HasSubstr("needs 8"));
}

TEST_F(ScannerTest, ScanByDescriptorUsesTheDisplayName) {
  const std::string path = write("fd.ckpt", bytes({0x0A, 0x40}));
  UniqueFd fd(::open(path.c_str(), O_RDONLY));
  ASSERT_TRUE(fd);
  try {
    scan_checkpoint_fd(fd.get(), "rank_7/display.ckpt");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank_7/display.ckpt: byte offset 1:"));
  }
  EXPECT_THROW(scan_checkpoint(dir_ + "/missing.ckpt"), Error);
}

}  // namespace
}  // namespace ckptfs::ckpt
