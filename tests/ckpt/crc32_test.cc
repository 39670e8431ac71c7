// crc32_update must give zlib's CRC-32 (the independent oracle here) for every length, alignment
// and split of the input.
#include "ckptfs/ckpt/crc32.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace ckptfs::ckpt {
namespace {

uint32_t zlib_crc(std::span<const uint8_t> bytes) {
  return static_cast<uint32_t>(::crc32(0, bytes.data(), static_cast<uInt>(bytes.size())));
}

std::vector<uint8_t> noise(size_t n) {
  std::vector<uint8_t> out(n);
  uint32_t x = 2463534242u;
  for (uint8_t& b : out) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<uint8_t>(x);
  }
  return out;
}

TEST(Crc32, CheckValue) {
  constexpr std::string_view kText = "123456789";  // CRC-32's published check input
  EXPECT_EQ(crc32_update(0, std::span(reinterpret_cast<const uint8_t*>(kText.data()), 9)),
            0xCBF43926u);
}

TEST(Crc32, EveryLengthAndAlignmentMatchesZlib) {
  const std::vector<uint8_t> bytes = noise(1200);
  for (size_t start = 0; start < 8; ++start)
    for (size_t n = 0; start + n <= 700; ++n) {
      const std::span<const uint8_t> span(bytes.data() + start, n);
      ASSERT_EQ(crc32_update(0, span), zlib_crc(span))
          << "start " << start << ", " << n << " bytes";
    }
}

TEST(Crc32, SplitsContinueTheCrc) {
  const std::vector<uint8_t> bytes = noise(4096);
  const uint32_t whole = zlib_crc(bytes);
  // Short pieces (record headers one after another), long ones, and a mix.
  for (size_t piece : {1, 7, 52, 255, 256, 257, 1000, 4096}) {
    uint32_t crc = 0;
    for (size_t at = 0; at < bytes.size(); at += piece)
      crc = crc32_update(crc, std::span(bytes).subspan(at, std::min(piece, bytes.size() - at)));
    EXPECT_EQ(crc, whole) << "pieces of " << piece;
  }
}

}  // namespace
}  // namespace ckptfs::ckpt
