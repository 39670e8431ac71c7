// Sources opened once per path for a mount's plans: a path opened before gives the same open
// file (no second open(2), which on FUSE drops the file's cached pages), unless it names another
// file now.
#include "ckptfs/source/open_files.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <optional>
#include <thread>

#include "ckptfs/error.h"
#include "support/test_support.h"

namespace ckptfs::source {
namespace {

namespace fs = std::filesystem;
using testsupport::set_mtime;
using testsupport::write_file;

// Whether two descriptors share one open file description: its offset is shared.
bool same_open_file(int a, int b) {
  const off_t before = ::lseek(b, 0, SEEK_CUR);
  ::lseek(a, before + 3, SEEK_SET);
  const bool same = ::lseek(b, 0, SEEK_CUR) == before + 3;
  ::lseek(a, before, SEEK_SET);
  return same;
}

class OpenFilesTest : public ::testing::Test {
 protected:
  void SetUp() override { write_file(path_, "0123456789"); }

  testsupport::TempDir tmp_{"ckptfs-open-files"};
  fs::path path_ = tmp_.path() / "rank_0.ckpt";
  OpenFiles opens_;
};

TEST_F(OpenFilesTest, APathOpenedBeforeIsTheSameOpenFile) {
  const fs::path& path = path_;
  const SourceFile first = opens_.open(path);
  const SourceFile second = opens_.open(path);
  EXPECT_NE(first.fd.get(), second.fd.get());
  EXPECT_TRUE(same_open_file(first.fd.get(), second.fd.get()));
  EXPECT_EQ(second.path, path);
  EXPECT_EQ(second.fingerprint, SourceFile::open(path).fingerprint);
  EXPECT_TRUE(second.unchanged());
  // A plain open is a file of its own.
  const SourceFile other = SourceFile::open(path);
  EXPECT_FALSE(same_open_file(first.fd.get(), other.fd.get()));
}

TEST_F(OpenFilesTest, AFileReplacedSinceIsOpenedAnew) {
  const fs::path& path = path_;
  const SourceFile first = opens_.open(path);
  const fs::path next = tmp_.path() / "next";
  write_file(next, "abcdefghijklmnop");
  fs::rename(next, path);
  const SourceFile second = opens_.open(path);
  EXPECT_FALSE(same_open_file(first.fd.get(), second.fd.get()));
  EXPECT_EQ(second.fingerprint.size, 16u);
  char byte = 0;
  ASSERT_EQ(::pread(second.fd.get(), &byte, 1, 0), 1);
  EXPECT_EQ(byte, 'a');
  // The new file is the one handed out from then on.
  const SourceFile third = opens_.open(path);
  EXPECT_TRUE(same_open_file(second.fd.get(), third.fd.get()));
}

TEST_F(OpenFilesTest, AStructureCheckHoldsUntilTheFileChanges) {
  const SourceFile first = opens_.open(path_);
  EXPECT_FALSE(opens_.checked(first));
  opens_.mark_checked(first);
  EXPECT_TRUE(opens_.checked(opens_.open(path_)));
  // Rewritten in place, same size, the mtime put back: the ctime moved.
  set_mtime(path_, 1'000'000'000, 0);
  const SourceFile before = opens_.open(path_);
  opens_.mark_checked(before);
  ::usleep(20'000);  // a ctime tick apart on coarse clocks
  write_file(path_, "9876543210");
  set_mtime(path_, 1'000'000'000, 0);
  const SourceFile after = opens_.open(path_);
  EXPECT_EQ(after.fingerprint.mtime_ns, before.fingerprint.mtime_ns);
  EXPECT_FALSE(opens_.checked(after));
  // A path never opened through it was never checked.
  const fs::path other = tmp_.path() / "rank_1.ckpt";
  write_file(other, "0123456789");
  EXPECT_FALSE(opens_.checked(SourceFile::open(other)));
}

// Descriptors this process holds on `path`'s file.
size_t descriptors_of(const fs::path& path) {
  struct stat want;
  if (::stat(path.c_str(), &want) != 0) return 0;
  size_t n = 0;
  for (const fs::directory_entry& fd : fs::directory_iterator("/proc/self/fd")) {
    struct stat st;
    if (::stat(fd.path().c_str(), &st) == 0 && st.st_dev == want.st_dev && st.st_ino == want.st_ino)
      ++n;
  }
  return n;
}

// A check made as the file is served (index::DeferredCheck) is one object for all the plans of
// a mount, until the file changes.
TEST_F(OpenFilesTest, ACheckIsSharedByThePlansOfOneFileUntilItChanges) {
  int made = 0;
  const auto make = [&made]() -> std::shared_ptr<const void> {
    ++made;
    return std::make_shared<int>(made);
  };
  const SourceFile first = opens_.open(path_);
  const std::shared_ptr<const void> a = opens_.shared_check(first, make);
  const SourceFile second = opens_.open(path_);
  EXPECT_EQ(opens_.shared_check(second, make), a);
  EXPECT_EQ(made, 1);
  set_mtime(path_, 1'000'000'000, 0);
  ::usleep(20'000);
  write_file(path_, "9876543210");
  set_mtime(path_, 1'000'000'000, 0);
  const std::shared_ptr<const void> b = opens_.shared_check(opens_.open(path_), make);
  EXPECT_NE(b, a);
  EXPECT_EQ(made, 2);
  // Another path's file has its own.
  const fs::path other = tmp_.path() / "rank_1.ckpt";
  write_file(other, "0123456789");
  EXPECT_NE(opens_.shared_check(opens_.open(other), make), b);
  EXPECT_EQ(made, 3);
}

TEST_F(OpenFilesTest, AFileIsHeldOnlyWhileAPlanUsesIt) {
  std::optional<SourceFile> first = opens_.open(path_);
  std::optional<SourceFile> second = opens_.open(path_);
  EXPECT_EQ(descriptors_of(path_), 3u);  // each SourceFile's and the one shared
  first.reset();
  EXPECT_EQ(descriptors_of(path_), 2u);
  // The last one gone (a step dropped, its files deleted): nothing keeps the file open.
  second.reset();
  EXPECT_EQ(descriptors_of(path_), 0u);
  // Opened anew afterwards, and shared again from there.
  const SourceFile third = opens_.open(path_);
  const SourceFile fourth = opens_.open(path_);
  EXPECT_TRUE(same_open_file(third.fd.get(), fourth.fd.get()));
}

TEST_F(OpenFilesTest, ASymlinkRetargetedOpensItsNewTarget) {
  const fs::path link = tmp_.path() / "rank_1.ckpt";
  const fs::path other = tmp_.path() / "other.ckpt";
  write_file(other, "abcdefghij");
  fs::create_symlink(path_, link);
  const SourceFile first = opens_.open(link);
  fs::remove(link);
  fs::create_symlink(other, link);
  const SourceFile second = opens_.open(link);
  EXPECT_FALSE(same_open_file(first.fd.get(), second.fd.get()));
  char byte = 0;
  ASSERT_EQ(::pread(second.fd.get(), &byte, 1, 0), 1);
  EXPECT_EQ(byte, 'a');
}

// Two planning threads open, check and drop the path while a third renames new files over it:
// each SourceFile's descriptor is the file it fingerprinted, whole, and a structure check is
// only ever seen for the fingerprint it was made for.
TEST_F(OpenFilesTest, ThreadsPlanningWhileTheFileIsReplacedEachGetTheFileTheyFingerprinted) {
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  const auto plan = [&] {
    while (!stop.load()) {
      const SourceFile file = opens_.open(path_);
      struct stat st;
      char byte = 0;
      if (::fstat(file.fd.get(), &st) != 0 ||
          static_cast<uint64_t>(st.st_ino) != file.fingerprint.ino ||
          ::pread(file.fd.get(), &byte, 1, 0) != 1 || byte != '0')
        ++failures;
      if (!opens_.checked(file)) opens_.mark_checked(file);
    }
  };
  std::thread a(plan), b(plan);
  for (int i = 0; i < 300; ++i) {
    const fs::path next = tmp_.path() / "next";
    write_file(next, "0123456789");
    fs::rename(next, path_);
  }
  stop = true;
  a.join();
  b.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(OpenFilesForLife, KeepsEveryFileOpenUntilDestroyed) {
  testsupport::TempDir tmp("ckptfs-open-files");
  const fs::path path = tmp.path() / "rank_0.ckpt";
  write_file(path, "0123456789");
  {
    OpenFiles opens(OpenFiles::Keep::kForLife);
    std::optional<SourceFile> first = opens.open(path);
    first.reset();
    EXPECT_EQ(descriptors_of(path), 1u);
    const SourceFile again = opens.open(path);  // a duplicate of the one kept
    EXPECT_EQ(descriptors_of(path), 2u);
  }
  EXPECT_EQ(descriptors_of(path), 0u);
}

TEST_F(OpenFilesTest, AMissingPathThrowsNamingIt) {
  const fs::path& path = path_;
  opens_.open(path);
  fs::remove(path);
  try {
    opens_.open(path);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ckptfs::source
