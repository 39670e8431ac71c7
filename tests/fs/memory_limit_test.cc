#include "../../src/fs/memory_limit.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "support/test_support.h"

namespace ckptfs::fs {
namespace {

namespace stdfs = std::filesystem;
constexpr uint64_t kLimitMiB = 1 << 20;

// A made-up /proc/self/cgroup and /sys/fs/cgroup.
class MemoryLimitTest : public ::testing::Test {
 protected:
  void SetUp() override { stdfs::create_directories(root_ / "sys"); }
  void write(const stdfs::path& file, const std::string& text) {
    stdfs::create_directories(file.parent_path());
    std::ofstream(file) << text;
  }
  uint64_t limit(const std::string& proc) {
    write(root_ / "cgroup", proc);
    return memory_limit(root_ / "cgroup", root_ / "sys");
  }
  static uint64_t machine() {
    return static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
           static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  }
  testsupport::TempDir temp_{"memory_limit_test"};
  const stdfs::path root_ = temp_.path();
};

TEST_F(MemoryLimitTest, NoLimitIsTheMachinesMemory) {
  write(root_ / "sys/memory.max", "max\n");
  EXPECT_EQ(limit("0::/\n"), machine());
  EXPECT_EQ(memory_limit(root_ / "none", root_ / "sys"), machine());
}

// cgroup v2: the least memory.max of the group and the groups above it.
TEST_F(MemoryLimitTest, AGroupAboveLimitsToo) {
  write(root_ / "sys/a/b/memory.max", "max\n");
  write(root_ / "sys/a/memory.max", fmt::format("{}\n", 512 * kLimitMiB));
  EXPECT_EQ(limit("0::/a/b\n"), 512 * kLimitMiB);
}

// In a container the kernel may name a group from outside: the mount's own root group is the
// container's.
TEST_F(MemoryLimitTest, AGroupNamedFromOutsideIsTheRootGroup) {
  write(root_ / "sys/memory.max", fmt::format("{}\n", 300 * kLimitMiB));
  EXPECT_EQ(limit("0::/host/slice/x\n"), 300 * kLimitMiB);
}

// cgroup v1: the memory controller's memory.limit_in_bytes; other controllers' lines are not
// memory limits.
TEST_F(MemoryLimitTest, CgroupV1MemoryController) {
  write(root_ / "sys/memory/job/memory.limit_in_bytes", fmt::format("{}\n", 768 * kLimitMiB));
  write(root_ / "sys/memory/memory.limit_in_bytes", "9223372036854771712\n");
  write(root_ / "sys/cpu/job/memory.limit_in_bytes", "1\n");
  EXPECT_EQ(limit("5:cpu,cpuacct:/job\n4:memory:/job\n0::/\n"), 768 * kLimitMiB);
}

}  // namespace
}  // namespace ckptfs::fs
