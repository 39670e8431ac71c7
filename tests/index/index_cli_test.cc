// `ckptfs index build|list|clear`, run as a user would.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ckptfs/ckpt/encoder.h"

namespace ckptfs::index {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

struct CliRun {
  int status = -1;
  std::string out;  // stdout and stderr together
};

// The paths in these tests come from mkdtemp and hold no shell metacharacters.
CliRun ckptfs(const std::string& args, const std::string& env = "") {
  CliRun run;
  const std::string command = fmt::format("env {} {} {} 2>&1", env, CKPTFS_BINARY, args);
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return run;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) run.out.append(buf, n);
  const int status = ::pclose(pipe);
  run.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

class IndexCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "ckptfs-cli-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
    src_ = root_ / "src";
    index_ = root_ / "index";
    write("rank_0/net.ckpt", {"a", "b", "c"});
    write("rank_1/net.ckpt", {"a", "b"});
  }
  void TearDown() override { fs::remove_all(root_); }

  void write(const std::string& relative, const std::vector<std::string>& names) {
    const fs::path path = src_ / relative;
    fs::create_directories(path.parent_path());
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    const std::vector<int64_t> dims{1};
    for (const std::string& name : names) {
      out << ckpt::record_header(name, dims, "Float32", 4) << std::string(4, '\0');
    }
  }

  fs::path root_, src_, index_;
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
  EXPECT_THAT(run.out, HasSubstr("no rank_<digits> directory holds a *.ckpt file"));
}

}  // namespace
}  // namespace ckptfs::index
