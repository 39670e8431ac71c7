#include "../../src/fs/spool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "ckptfs/error.h"
#include "support/test_support.h"

namespace ckptfs::fs {
namespace {

namespace stdfs = std::filesystem;
constexpr uint64_t kSpoolMiB = 1 << 20;

class SpoolTest : public ::testing::Test {
 protected:
  testsupport::TempDir temp_{"spool_test"};
  const stdfs::path dir_ = temp_.path();
};

TEST_F(SpoolTest, LeavesNoFileBehindInItsDirectory) {
  Spool spool(dir_, 4 * kSpoolMiB);
  EXPECT_EQ(spool.capacity(), 4 * kSpoolMiB);
  EXPECT_TRUE(stdfs::is_empty(dir_));
}

// What one allocation holds survives the others' writes, and a freed extent is reused.
TEST_F(SpoolTest, AllocationsAreDisjointAndFreedOnesReused) {
  Spool spool(dir_, 4 * kSpoolMiB);
  const std::vector<uint64_t> sizes = {100, kSpoolMiB, 5000, 3 * kSpoolMiB / 2};
  std::vector<uint8_t*> got;
  for (size_t i = 0; i < sizes.size(); ++i) {
    got.push_back(spool.allocate(sizes[i]));
    ASSERT_NE(got.back(), nullptr);
    std::memset(got.back(), static_cast<int>(i + 1), sizes[i]);
  }
  for (size_t i = 0; i < sizes.size(); ++i)
    for (uint64_t k = 0; k < sizes[i]; k += 97) ASSERT_EQ(got[i][k], i + 1) << i << " at " << k;
  EXPECT_EQ(spool.used(), 4096 + kSpoolMiB + 8192 + 3 * kSpoolMiB / 2);
  spool.free(got[1], sizes[1]);
  EXPECT_EQ(spool.allocate(kSpoolMiB), got[1]) << "the freed extent is the best fit";
}

// A freed extent's blocks leave the disk at once (a hole is punched), and the spool's room is
// twice its capacity, no more: past that an allocation fails, it does not fault.
TEST_F(SpoolTest, FreedBlocksLeaveTheDiskAndAFullSpoolSaysSo) {
  Spool spool(dir_, 4 * kSpoolMiB);
  uint8_t* a = spool.allocate(4 * kSpoolMiB);
  ASSERT_NE(a, nullptr);
  std::memset(a, 7, 4 * kSpoolMiB);
  EXPECT_GE(spool.disk_bytes(), 4 * kSpoolMiB);
  uint8_t* b = spool.allocate(4 * kSpoolMiB);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(spool.allocate(4096), nullptr);
  spool.free(a, 4 * kSpoolMiB);
  EXPECT_LT(spool.disk_bytes(), 4 * kSpoolMiB + kSpoolMiB);  // b's blocks, and a's are gone
  EXPECT_NE(spool.allocate(4096), nullptr);
}

TEST_F(SpoolTest, ADirectoryItCannotUseIsNamed) {
  const stdfs::path missing = dir_ / "no such dir";
  try {
    Spool spool(missing, 4 * kSpoolMiB);
    FAIL() << "a spool in a missing directory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing.string()), std::string::npos) << e.what();
  }
}

TEST_F(SpoolTest, KnowsADirectoryInMemory) {
  EXPECT_FALSE(Spool::in_memory("/var/tmp"));  // on the root filesystem, a disk
  if (stdfs::is_directory("/dev/shm")) {
    EXPECT_TRUE(Spool::in_memory("/dev/shm"));
  }
  EXPECT_GT(Spool::default_capacity(dir_), 0u);
}

}  // namespace
}  // namespace ckptfs::fs
