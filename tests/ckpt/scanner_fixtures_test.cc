// The scanner on the real MindSpore files of tests/data/fixtures/real, checked twice: against the
// decodes listed in that folder's README, and against Google's protobuf parser, which must find
// each tensor_content exactly at the offsets the scanner reports.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cctype>
#include <cstdint>
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "checkpoint.pb.h"
#include "ckptfs/ckpt/scanner.h"
#include "ckptfs/error.h"
#include "ckptfs/util/fd.h"
#include "support/test_support.h"

namespace ckptfs::ckpt {
namespace {

using scan::EntryKind;
using scan::Extent;
using scan::FileScan;
using scan::Param;

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using testsupport::read_file;

const std::string kReal = std::string(CKPTFS_TEST_DATA) + "/fixtures/real/";

struct Expected {
  std::string name;
  std::vector<int64_t> dims;  // as written in the file
  std::string dtype;
  uint64_t nbytes;
};

struct Fixture {
  std::string file;
  std::vector<Expected> records;
};

// Names the parameter in test listings instead of dumping its bytes.
void PrintTo(const Fixture& f, std::ostream* os) { *os << f.file; }

std::vector<Expected> lenet_weights(const std::string& prefix) {
  return {
      {prefix + "conv1.weight", {6, 1, 5, 5}, "Float32", 600},
      {prefix + "conv2.weight", {16, 6, 5, 5}, "Float32", 9600},
      {prefix + "fc1.weight", {120, 400}, "Float32", 192000},
      {prefix + "fc1.bias", {120}, "Float32", 480},
      {prefix + "fc2.weight", {84, 120}, "Float32", 40320},
      {prefix + "fc2.bias", {84}, "Float32", 336},
      {prefix + "fc3.weight", {10, 84}, "Float32", 3360},
      {prefix + "fc3.bias", {10}, "Float32", 40},
  };
}

template <typename... Lists>
std::vector<Expected> concat(Lists... lists) {
  std::vector<Expected> out;
  (out.insert(out.end(), lists.begin(), lists.end()), ...);
  return out;
}

// Transcribed from tests/data/fixtures/real/README.md ("Decoded contents").
std::vector<Fixture> fixtures() {
  std::vector<Expected> mlp;
  for (int i = 0; i < 4; ++i) {
    const std::string p = std::to_string(i);
    mlp.push_back({p + ".w1.weight", {16, 4}, "Float32", 256});
    mlp.push_back({p + ".w2.weight", {4, 16}, "Float32", 256});
    mlp.push_back({p + ".w3.weight", {16, 4}, "Float32", 256});
  }
  return {
      {"golden-stick_test_linears_woq_predict_2stage_fp32.ckpt",
       {{"linear1.weight", {6, 5}, "Float32", 120},
        {"linear1.bias", {6}, "Float32", 24},
        {"linear2.weight", {5, 6}, "Float32", 120},
        {"linear2.bias", {5}, "Float32", 20}}},
      {"golden-stick_test_sq_predict_simplenet_2stage_fp.ckpt",
       {{"linear.weight", {8, 4}, "Float32", 128}, {"linear.bias", {8}, "Float32", 32}}},
      {"golden-stick_test_sq_predict_simplenet_2stage_fp_notranb.ckpt",
       {{"linear.weight", {4, 8}, "Float32", 128}, {"linear.bias", {8}, "Float32", 32}}},
      {"serving_lenet_ascend_v111_offical_cv_mnist_bs32_acc98.ckpt",
       concat(lenet_weights(""),
              std::vector<Expected>{{"scale_sense", {0}, "Float32", 4},
                                    {"learning_rate", {0}, "Float32", 4},
                                    {"momentum", {0}, "Float32", 4}},
              lenet_weights("moments."),
              std::vector<Expected>{{"current_iterator_step", {0}, "Int32", 4},
                                    {"last_overflow_iterator_step", {0}, "Int32", 4}})},
      {"mindarmour_checkpoint_lenet-10_1875.ckpt",
       concat(lenet_weights(""),
              std::vector<Expected>{{"learning_rate", {0}, "Float64", 8},
                                    {"momentum", {0}, "Float64", 8}},
              lenet_weights("moments."))},
      {"mindformers_golden_moe.ckpt",
       {{"feed_forward.ffn.w1.weight", {4, 64, 16}, "Float32", 16384},
        {"feed_forward.ffn.w2.weight", {4, 16, 64}, "Float32", 16384},
        {"feed_forward.ffn.w3.weight", {4, 64, 16}, "Float32", 16384},
        {"feed_forward.router.dense.weight", {4, 16}, "Float32", 256}}},
      {"mindformers_golden_sequential_mlp.ckpt", mlp},
      {"mindformers_golden_router.ckpt", {{"gating.weight", {4, 16}, "Float32", 256}}},
  };
}

class RealCheckpoint : public ::testing::TestWithParam<Fixture> {};

TEST_P(RealCheckpoint, MatchesReadme) {
  const Fixture& f = GetParam();
  const FileScan scan = scan_checkpoint(kReal + "ckpt/" + f.file);
  EXPECT_FALSE(scan.has_crc_trailer);
  EXPECT_EQ(scan.body_size, scan.file_size);
  ASSERT_EQ(scan.params.size(), f.records.size());
  for (size_t i = 0; i < f.records.size(); ++i) {
    const Expected& e = f.records[i];
    const Param& p = scan.params[i];
    SCOPED_TRACE(e.name);
    EXPECT_EQ(p.name, e.name);
    EXPECT_EQ(p.dtype, e.dtype);
    EXPECT_EQ(p.kind, EntryKind::Tensor);
    EXPECT_EQ(p.nbytes(), e.nbytes);
    ASSERT_EQ(p.content.size(), 1u);
    ASSERT_EQ(p.records.size(), 1u);
    const bool old_scalar = e.dims == std::vector<int64_t>{0};
    EXPECT_EQ(p.dims_zero, old_scalar);
    EXPECT_EQ(p.shape, old_scalar ? std::vector<int64_t>{} : e.dims);
  }
  // Records tile the file: each starts where the previous ended.
  uint64_t at = 0;
  for (const Param& p : scan.params) {
    EXPECT_EQ(p.records.front().offset, at);
    at = p.records.back().offset + p.records.back().length;
  }
  EXPECT_EQ(at, scan.file_size);
  // README: the router file is one 293-byte record (spec §1.3: 256 content bytes at the end).
  if (f.file == "mindformers_golden_router.ckpt") {
    EXPECT_EQ(scan.file_size, 293u);
    EXPECT_EQ(scan.params[0].content.front(), (Extent{37, 256}));
  }
}

TEST_P(RealCheckpoint, ContentOffsetsMatchGoogleParser) {
  const Fixture& f = GetParam();
  const std::string path = kReal + "ckpt/" + f.file;
  const std::string data = read_file(path);
  Checkpoint parsed;
  ASSERT_TRUE(parsed.ParseFromString(data));
  const FileScan scan = scan_checkpoint(path, ScanOptions{.verify_crc = true});
  ASSERT_EQ(scan.file_size, data.size());

  int v = 0;
  for (const Param& p : scan.params) {
    for (size_t c = 0; c < p.content.size(); ++c, ++v) {
      ASSERT_LT(v, parsed.value_size());
      const auto& value = parsed.value(v);
      EXPECT_EQ(value.tag(), p.name);
      EXPECT_EQ(value.tensor().tensor_type(), p.dtype);
      std::vector<int64_t> dims(value.tensor().dims().begin(), value.tensor().dims().end());
      EXPECT_EQ(dims.empty() || p.dims_zero ? std::vector<int64_t>{} : dims, p.shape);
      const Extent e = p.content[c];
      ASSERT_LE(e.offset + e.length, data.size());
      EXPECT_EQ(data.substr(e.offset, e.length), value.tensor().tensor_content()) << p.name;
    }
  }
  EXPECT_EQ(v, parsed.value_size());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, RealCheckpoint, ::testing::ValuesIn(fixtures()),
                         [](const auto& test) {  // not "info": gtest's own name
                           std::string name = test.param.file.substr(0, test.param.file.size() - 5);
                           for (char& ch : name)
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name;
                         });

TEST(RealCheckpointSet, EveryFileIsCovered) {
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kReal + "ckpt")) {
    ++files;
    bool listed = false;
    for (const Fixture& f : fixtures()) listed |= entry.path().filename() == f.file;
    EXPECT_TRUE(listed) << entry.path();
  }
  EXPECT_EQ(files, fixtures().size());
}

TEST(CorruptCheckpoint, IsRejectedWithFileAndOffset) {
  const std::string path = kReal + "corrupt/mindformers_golden_router_utf8-mangled.ckpt";
  // Google's parser rejects it too.
  Checkpoint parsed;
  EXPECT_FALSE(parsed.ParseFromString(read_file(path)));
  try {
    scan_checkpoint(path);
    FAIL() << "corrupt file accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_THAT(msg, HasSubstr(path));
    EXPECT_THAT(msg, MatchesRegex(".*byte offset [0-9]+:.*"));
    // The record length EF BF BD 02 (at byte 1) claims 5,201,903 bytes of a 500-byte file.
    EXPECT_THAT(msg, HasSubstr("byte offset 1:"));
  }
}

// Single-byte damage anywhere in a real file: the scanner either throws Error or returns a scan
// that Google's parser agrees with, byte for byte. Never a crash, never an extent outside the file.
TEST(DamagedCheckpoint, EveryByteMutationIsRejectedOrAgreesWithGoogle) {
  const std::string original =
      read_file(kReal + "ckpt/golden-stick_test_linears_woq_predict_2stage_fp32.ckpt");
  // An in-memory file: thousands of variants, no disk traffic.
  UniqueFd fd(::memfd_create("mutated", MFD_CLOEXEC));
  ASSERT_TRUE(fd);
  const std::string name = "mutated.ckpt";
  int accepted = 0, rejected = 0;
  for (size_t i = 0; i < original.size(); ++i) {
    const uint8_t orig = static_cast<uint8_t>(original[i]);
    for (uint8_t value : {uint8_t{0x00}, uint8_t{0x01}, uint8_t{0x7F}, uint8_t{0x80}, uint8_t{0xFF},
                          static_cast<uint8_t>(orig ^ 0x08)}) {
      if (value == orig) continue;
      std::string data = original;
      data[i] = static_cast<char>(value);
      ASSERT_EQ(::pwrite(fd.get(), data.data(), data.size(), 0), static_cast<ssize_t>(data.size()));
      FileScan scan;
      try {
        scan = scan_checkpoint_fd(fd.get(), name);
      } catch (const Error& e) {
        ++rejected;
        EXPECT_THAT(e.what(), HasSubstr(name + ": byte offset "));
        continue;
      }
      ++accepted;
      SCOPED_TRACE(::testing::Message() << "byte " << i << " = " << int{value});
      Checkpoint parsed;
      ASSERT_TRUE(parsed.ParseFromString(data));
      int v = 0;
      for (const Param& p : scan.params) {
        for (const Extent& e : p.content) {
          ASSERT_LE(e.offset + e.length, data.size());
          ASSERT_LT(v, parsed.value_size());
          EXPECT_EQ(parsed.value(v).tag(), p.name);
          EXPECT_EQ(data.substr(e.offset, e.length), parsed.value(v).tensor().tensor_content());
          ++v;
        }
      }
      EXPECT_EQ(v, parsed.value_size());
    }
  }
  // Content bytes can take any value, so most single-byte changes are still valid files.
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rejected, 0);
}

}  // namespace
}  // namespace ckptfs::ckpt
