// Reply buffers: two 1 MiB buffers share one 2 MiB-aligned page and keep their bytes apart; a
// buffer made for a READ grows to 1 MiB in place; freeing returns pages, so a steady stream of
// buffers does not map ever more memory.
#include "../../src/fs/reply_buffer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace ckptfs::fs {
namespace {

constexpr uintptr_t kPage = 2 * detail::kHalfPage;

uintptr_t page_of(const void* p) { return reinterpret_cast<uintptr_t>(p) & ~(kPage - 1); }

TEST(ReplyBufferTest, TwoBuffersShareOneAlignedPageAndKeepTheirBytes) {
  ReplyBuffer a(detail::kHalfPage), b(detail::kHalfPage);
  ASSERT_NE(a.data(), b.data());
  EXPECT_EQ(page_of(a.data()), page_of(b.data()));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % detail::kHalfPage, 0u);
  std::memset(a.data(), 0x5a, a.size());
  std::memset(b.data(), 0xa5, b.size());
  for (size_t i = 0; i < a.size(); i += 4093) {
    ASSERT_EQ(static_cast<unsigned char>(a[i]), 0x5a) << i;
    ASSERT_EQ(static_cast<unsigned char>(b[i]), 0xa5) << i;
  }
}

TEST(ReplyBufferTest, AReadBufferGrowsToOneMibInPlace) {
  ReplyBuffer buffer = make_reply_buffer();
  buffer.resize(4096);
  const char* first = buffer.data();
  buffer.resize(detail::kHalfPage - 100);
  buffer.resize(detail::kHalfPage);
  EXPECT_EQ(buffer.data(), first);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % detail::kHalfPage, 0u);
}

TEST(ReplyBufferTest, OtherSizesComeFromTheHeap) {
  const size_t before = detail::huge_pages_mapped();
  std::vector<ReplyBuffer> small;
  for (int i = 0; i < 8; ++i) small.emplace_back(4096);
  ReplyBuffer large(3 * detail::kHalfPage);
  EXPECT_EQ(detail::huge_pages_mapped(), before);
}

TEST(ReplyBufferTest, FreedPagesAreReturned) {
  const size_t before = detail::huge_pages_mapped();
  {
    std::vector<ReplyBuffer> held;
    for (int i = 0; i < 6; ++i) held.emplace_back(detail::kHalfPage);
    EXPECT_GE(detail::huge_pages_mapped(), 3u);
    EXPECT_LE(detail::huge_pages_mapped(), before + 3);
  }
  // At most kKeptEmptyPages empty pages stay for the next buffers.
  EXPECT_LE(detail::huge_pages_mapped(), detail::kKeptEmptyPages);
  for (int round = 0; round < 100; ++round) {
    std::vector<ReplyBuffer> held;
    for (int i = 0; i < 3; ++i) held.emplace_back(detail::kHalfPage);
  }
  EXPECT_LE(detail::huge_pages_mapped(), detail::kKeptEmptyPages);
  // More buffers than that, all freed: the pages beyond are returned.
  {
    std::vector<ReplyBuffer> held;
    for (size_t i = 0; i < 4 * detail::kKeptEmptyPages; ++i) held.emplace_back(detail::kHalfPage);
    EXPECT_GE(detail::huge_pages_mapped(), 2 * detail::kKeptEmptyPages);
  }
  EXPECT_LE(detail::huge_pages_mapped(), detail::kKeptEmptyPages);
}

}  // namespace
}  // namespace ckptfs::fs
