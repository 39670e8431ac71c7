// Record headers against the byte-level examples of spec §1.3.
#include "ckptfs/ckpt/encoder.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ckptfs/ckpt/varint.h"
#include "support/test_support.h"

namespace ckptfs::ckpt {
namespace {

using testsupport::bytes;

TEST(RecordHeader, SpecExampleFloat32Vector) {
  const std::vector<int64_t> dims{2};
  const std::string header = record_header("w", dims, "Float32", 8);
  const std::string expected = bytes({0x0A, 0x1A, 0x0A, 0x01, 'w', 0x12, 0x15, 0x08, 0x02, 0x12,
                                      0x07, 'F',  'l',  'o',  'a', 't',  '3',  '2',  0x1A, 0x08});
  EXPECT_EQ(header, expected);
  EXPECT_EQ(header.size() + 8, 28u);
}

// The status tree reads the plan's record headers back: the spec's example bytes give their
// fields, and any shorter prefix gives nothing (the caller then asks with more bytes).
TEST(RecordHeader, ParsesTheSpecExampleBackAndRefusesItsPrefixes) {
  const std::string header = bytes({0x0A, 0x1A, 0x0A, 0x01, 'w', 0x12, 0x15, 0x08, 0x02, 0x12,
                                    0x07, 'F',  'l',  'o',  'a', 't',  '3',  '2',  0x1A, 0x08});
  const std::string with_content = header + std::string(8, '\x7f');
  const auto as_span = [](const std::string& s) {
    return std::span(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  };
  const std::optional<RecordHeader> h = parse_record_header(as_span(with_content));
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->tag, "w");
  EXPECT_EQ(h->dims, std::vector<int64_t>{2});
  EXPECT_EQ(h->tensor_type, "Float32");
  EXPECT_EQ(h->content_length, 8u);
  EXPECT_EQ(h->size, header.size());
  for (size_t n = 0; n < header.size(); ++n)
    EXPECT_FALSE(parse_record_header(as_span(header.substr(0, n)))) << n;
}

TEST(RecordHeader, SpecExampleScalarWithoutDims) {
  const std::string header = record_header("epoch_num", {}, "Int64", 8);
  std::string expected = bytes({0x0A, 0x1E, 0x0A, 0x09});
  expected += "epoch_num";
  expected += bytes({0x12, 0x11, 0x12, 0x05});
  expected += "Int64";
  expected += bytes({0x1A, 0x08});
  EXPECT_EQ(header, expected);
}

TEST(RecordHeader, RealRouterRecordPrefix) {
  // mindformers_golden_router.ckpt: 0A A2 02 | 0A 0D "gating.weight" | 12 90 02 | 08 04 08 10 |
  // 12 07 "Float32" | 1A 80 02
  const std::vector<int64_t> dims{4, 16};
  std::string expected = bytes({0x0A, 0xA2, 0x02, 0x0A, 0x0D});
  expected += "gating.weight";
  expected += bytes({0x12, 0x90, 0x02, 0x08, 0x04, 0x08, 0x10, 0x12, 0x07});
  expected += "Float32";
  expected += bytes({0x1A, 0x80, 0x02});
  EXPECT_EQ(record_header("gating.weight", dims, "Float32", 256), expected);
}

// A summary's file sizes come from record_header_size: the spec example's 20 header bytes, and
// the written header's length wherever a length's varint grows a byte (tag, type, dims,
// content and the record's own length at 127/128 and 16383/16384).
TEST(RecordHeader, SizeWithoutWritingIt) {
  EXPECT_EQ(record_header_size("w", std::vector<int64_t>{2}, "Float32", 8), 20u);
  for (size_t tag : {1, 100, 127, 128, 16383, 16384})
    for (uint64_t content : {0ull, 127ull, 128ull, 16384ull, 536870912ull, ~0ull >> 2})
      for (const std::vector<int64_t>& dims :
           {std::vector<int64_t>{}, {0}, {127, 128}, {-1}, std::vector<int64_t>(64, 300)}) {
        const std::string name(tag, 'x');
        EXPECT_EQ(record_header_size(name, dims, "BFloat16", content),
                  record_header(name, dims, "BFloat16", content).size())
            << tag << " " << content << " " << dims.size();
      }
}

TEST(Varint, RoundTripsAndSizes) {
  for (uint64_t v : {0ull, 1ull, 127ull, 128ull, 300ull, 536870912ull, ~0ull}) {
    std::string out;
    put_varint(out, v);
    EXPECT_EQ(out.size(), varint_size(v));
    size_t used = 0;
    auto decoded =
        get_varint(std::span(reinterpret_cast<const uint8_t*>(out.data()), out.size()), used);
    ASSERT_TRUE(decoded.has_value());
    EXPECT_EQ(*decoded, v);
    EXPECT_EQ(used, out.size());
  }
  std::string minus_one;
  put_varint(minus_one, static_cast<uint64_t>(int64_t{-1}));
  EXPECT_EQ(minus_one, bytes({0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01}));
}

TEST(Varint, RejectsTruncatedAndOverlong) {
  size_t used = 0;
  const uint8_t truncated[] = {0x80, 0x80};
  EXPECT_FALSE(get_varint(truncated, used).has_value());
  const uint8_t overlong[] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01};
  EXPECT_FALSE(get_varint(overlong, used).has_value());
}

}  // namespace
}  // namespace ckptfs::ckpt
