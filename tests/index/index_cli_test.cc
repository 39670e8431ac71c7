// `ckptfs index build|list|clear`, run as a user would.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "ckptfs/ckpt/encoder.h"
#include "support/test_support.h"

namespace ckptfs::index {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

// out is stdout and stderr together.
using CliRun = testsupport::CommandResult;

// The paths in these tests come from mkdtemp and hold no shell metacharacters.
CliRun ckptfs(const std::string& args, const std::string& env = "") {
  return testsupport::run_command(fmt::format("env {} {} {} 2>&1", env, CKPTFS_BINARY, args));
}

class IndexCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    write("rank_0/net.ckpt", {"a", "b", "c"});
    write("rank_1/net.ckpt", {"a", "b"});
  }

  void write(const std::string& relative, const std::vector<std::string>& names) {
    std::string bytes;
    const std::vector<int64_t> dims{1};
    for (const std::string& name : names) {
      bytes += ckpt::record_header(name, dims, "Float32", 4) + std::string(4, '\0');
    }
    testsupport::write_file(src_ / relative, bytes);
  }

  testsupport::TempDir tmp_{"ckptfs-cli"};
  fs::path root_ = tmp_.path(), src_ = root_ / "src", index_ = root_ / "index";
};

TEST_F(IndexCliTest, BuildListClear) {
  const std::string dir = "--index-dir " + index_.string();
  CliRun run = ckptfs(fmt::format("index build {} {}", src_.string(), dir));
  EXPECT_EQ(run.status, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("2 files, 5 parameters: 0 from the index, 2 scanned"));

  run = ckptfs(fmt::format("index build {} {}", src_.string(), dir));
  EXPECT_EQ(run.status, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("2 files, 5 parameters: 2 from the index, 0 scanned"));

  run = ckptfs("index list " + dir);
  EXPECT_EQ(run.status, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr((src_ / "rank_0/net.ckpt").string()));
  EXPECT_THAT(run.out, HasSubstr((src_ / "rank_1/net.ckpt").string()));
  EXPECT_THAT(run.out, HasSubstr("2 files in"));

  run = ckptfs("index clear " + dir);
  EXPECT_EQ(run.status, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("removed 2 entries"));

  run = ckptfs("index list " + dir);
  EXPECT_THAT(run.out, Not(HasSubstr("net.ckpt")));
  EXPECT_THAT(run.out, HasSubstr("0 files in"));
}

TEST_F(IndexCliTest, DefaultDirectoryFollowsXdgCacheHome) {
  const CliRun run = ckptfs(fmt::format("index build {}", src_.string()),
                            "XDG_CACHE_HOME=" + (root_ / "cache").string());
  EXPECT_EQ(run.status, 0) << run.out;
  EXPECT_TRUE(fs::exists(root_ / "cache/ckptfs/index/data.mdb"));
}

TEST_F(IndexCliTest, FailuresExitNonZeroNamingTheProblem) {
  CliRun run = ckptfs(
      fmt::format("index build {} --index-dir {}", (root_ / "nope").string(), index_.string()));
  EXPECT_NE(run.status, 0);
  EXPECT_THAT(run.out, HasSubstr((root_ / "nope").string()));

  fs::create_directories(root_ / "empty");
  run = ckptfs(
      fmt::format("index build {} --index-dir {}", (root_ / "empty").string(), index_.string()));
  EXPECT_NE(run.status, 0);
  EXPECT_THAT(
      run.out,
      HasSubstr(": no source checkpoints (expected rank_<N>/ directories holding *.ckpt files)"));
}

}  // namespace
}  // namespace ckptfs::index
