// AnonymousMapping: whether the pages are mapped is asked of the kernel (mincore fails with
// ENOMEM on an address no mapping covers), not of the type.
#include "ckptfs/util/anonymous_mapping.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

namespace ckptfs {
namespace {

bool mapped(const uint8_t* p) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  unsigned char residency = 0;
  void* start = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) & ~(page - 1));
  if (::mincore(start, 1, &residency) == 0) return true;
  EXPECT_EQ(errno, ENOMEM);
  return false;
}

TEST(AnonymousMapping, MapsZeroedWritablePagesOfTheSizeAsked) {
  const size_t size = (3u << 16) + 5;  // not a whole number of pages
  AnonymousMapping m(size);
  ASSERT_NE(m.data(), nullptr);
  EXPECT_EQ(m.size(), size);
  EXPECT_EQ(std::vector<uint8_t>(m.data(), m.data() + size), std::vector<uint8_t>(size, 0));
  std::memset(m.data(), 0xa5, size);
  EXPECT_EQ(m.data()[0], 0xa5);
  EXPECT_EQ(m.data()[size - 1], 0xa5);
  EXPECT_TRUE(mapped(m.data() + size - 1));
}

bool resident(const uint8_t* p) {
  unsigned char residency = 0;
  EXPECT_EQ(::mincore(const_cast<uint8_t*>(p), 1, &residency), 0);  // p is page-aligned here
  return (residency & 1) != 0;
}

TEST(AnonymousMapping, PagesNowAreMadeBeforeTheFirstTouchAndZeroed) {
  const size_t size = 1u << 20;
  AnonymousMapping lazy(size);
  EXPECT_FALSE(resident(lazy.data() + size / 2));  // made on first touch
  AnonymousMapping now(size, AnonymousMapping::Pages::kNow);
  ASSERT_NE(now.data(), nullptr);
  EXPECT_EQ(now.size(), size);
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  for (size_t at = 0; at < size; at += page) ASSERT_TRUE(resident(now.data() + at)) << at;
  EXPECT_EQ(std::vector<uint8_t>(now.data(), now.data() + size), std::vector<uint8_t>(size, 0));
}

TEST(AnonymousMapping, SizeZeroMapsNothing) {
  AnonymousMapping m(0);
  EXPECT_EQ(m.data(), nullptr);
  EXPECT_EQ(m.size(), 0u);
  AnonymousMapping empty;
  EXPECT_EQ(empty.data(), nullptr);
}

TEST(AnonymousMapping, ResetAndDestructionUnmap) {
  AnonymousMapping m(1u << 20);
  const uint8_t* p = m.data();
  ASSERT_TRUE(mapped(p));
  m.reset();
  EXPECT_EQ(m.data(), nullptr);
  EXPECT_EQ(m.size(), 0u);
  EXPECT_FALSE(mapped(p));
  m.reset();  // twice: nothing more to do

  const uint8_t* q = nullptr;
  {
    AnonymousMapping scoped(1u << 20);
    q = scoped.data();
    ASSERT_TRUE(mapped(q));
  }
  EXPECT_FALSE(mapped(q));
}

TEST(AnonymousMapping, AMoveHandsThePagesOverAndEmptiesTheSource) {
  AnonymousMapping a(1u << 20);
  uint8_t* p = a.data();
  p[7] = 42;
  AnonymousMapping b(std::move(a));
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(a.size(), 0u);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.size(), 1u << 20);
  EXPECT_EQ(b.data()[7], 42);

  // Assigning over a mapping unmaps the one it held.
  AnonymousMapping c(1u << 20);
  const uint8_t* old = c.data();
  c = std::move(b);
  EXPECT_FALSE(mapped(old));
  EXPECT_EQ(c.data(), p);
  EXPECT_TRUE(mapped(p));
  EXPECT_EQ(b.data(), nullptr);  // NOLINT(bugprone-use-after-move)

  AnonymousMapping& self = c;
  c = std::move(self);  // a self-move keeps the pages
  EXPECT_EQ(c.data(), p);
  EXPECT_TRUE(mapped(p));
}

TEST(AnonymousMapping, AFailedMapThrowsBadAlloc) {
  // More than the address space: mmap fails whatever the overcommit policy.
  EXPECT_THROW(AnonymousMapping(~size_t{0} - (1u << 20)), std::bad_alloc);
}

}  // namespace
}  // namespace ckptfs
