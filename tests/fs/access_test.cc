// The owner and read bits a target file takes from its sources (src/fs/access.h).
#include "../../src/fs/access.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <vector>

namespace ckptfs::fs {
namespace {

TEST(CombineAccess, CommonOwnerKeepsTheBitsEverySourceGrants) {
  const std::vector<Access> sources{{7, 8, 0444}, {7, 8, 0440}, {7, 8, 0404}};
  EXPECT_EQ(combine_access(sources, 0, 0), (Access{7, 8, 0400}));
}

TEST(CombineAccess, OwnersDifferTheMounterOwnsAndReads) {
  const std::vector<Access> sources{{7, 8, 0044}, {9, 8, 0044}};
  EXPECT_EQ(combine_access(sources, 1, 2), (Access{1, 8, 0444}));
}

TEST(CombineAccess, GroupsDifferNoGroupBit) {
  const std::vector<Access> sources{{7, 8, 0444}, {7, 9, 0444}};
  EXPECT_EQ(combine_access(sources, 1, 2), (Access{7, 2, 0404}));
}

TEST(CombineAccess, PrivateSourceMakesThePrivateFile) {
  const std::vector<Access> sources{{0, 0, 0444}, {0, 0, 0400}};
  EXPECT_EQ(combine_access(sources, 0, 0), (Access{0, 0, 0400}));
}

TEST(CombineAccess, NoSourcesTheMounters) {
  EXPECT_EQ(combine_access({}, 3, 4), (Access{3, 4, 0444}));
}

class SourceAccessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("ckptfs_access_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_ / "inner");
    std::ofstream(dir_ / "inner" / "f") << "x";
  }
  void TearDown() override {
    ::chmod(dir_.c_str(), 0755);
    std::filesystem::remove_all(dir_);
  }
  Access of(mode_t file_mode) {
    const std::filesystem::path f = dir_ / "inner" / "f";
    ::chmod(f.c_str(), file_mode);
    struct stat st {};
    EXPECT_EQ(::stat(f.c_str(), &st), 0);
    DirStats dirs;
    return source_access(f, st, dirs);
  }
  std::filesystem::path dir_;
};

TEST_F(SourceAccessTest, FileBitsWhereEveryDirectoryIsSearchable) {
  ::chmod(dir_.c_str(), 0755);
  ::chmod((dir_ / "inner").c_str(), 0755);
  EXPECT_EQ(of(0644).read, mode_t{0444});
  EXPECT_EQ(of(0640).read, mode_t{0440});
  EXPECT_EQ(of(0600).read, mode_t{0400});
  EXPECT_EQ(of(0604).read, mode_t{0404});
}

TEST_F(SourceAccessTest, AClosedDirectoryTakesTheBitsAway) {
  ::chmod((dir_ / "inner").c_str(), 0755);
  ::chmod(dir_.c_str(), 0700);
  EXPECT_EQ(of(0644).read, mode_t{0400});
  ::chmod(dir_.c_str(), 0750);
  EXPECT_EQ(of(0644).read, mode_t{0440});
  ::chmod(dir_.c_str(), 0711);
  EXPECT_EQ(of(0644).read, mode_t{0444});
}

TEST_F(SourceAccessTest, ASymlinkTakesTheDirectoriesOfItsTarget) {
  // The link sits in an open directory; the file it reaches, 0644, in a closed one.
  ::chmod(dir_.c_str(), 0755);
  ::chmod((dir_ / "inner").c_str(), 0700);
  ::chmod((dir_ / "inner" / "f").c_str(), 0644);
  std::filesystem::create_directories(dir_ / "open");
  ::chmod((dir_ / "open").c_str(), 0755);
  const std::filesystem::path link = dir_ / "open" / "link";
  std::filesystem::create_symlink(dir_ / "inner" / "f", link);
  struct stat st {};
  ASSERT_EQ(::stat(link.c_str(), &st), 0);
  DirStats dirs;
  EXPECT_EQ(source_access(link, st, dirs).read, mode_t{0400});
  // A symlinked directory above the file likewise.
  std::filesystem::create_directory_symlink(dir_ / "inner", dir_ / "open" / "rank_0");
  DirStats more;
  EXPECT_EQ(source_access(dir_ / "open" / "rank_0" / "f", st, more).read, mode_t{0400});
}

}  // namespace
}  // namespace ckptfs::fs
