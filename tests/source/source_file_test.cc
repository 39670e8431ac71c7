// Fingerprints: what changes them, what does not, and the key encoding the index relies on.
#include "ckptfs/source/source_file.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <utility>

#include "ckptfs/error.h"
#include "support/test_support.h"

namespace ckptfs::source {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testsupport::set_mtime;
using testsupport::write_file;

class SourceFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    write_file(path_, "0123456789");
    // An old, exact timestamp, so that any later write moves the mtime even on filesystems
    // whose clock ticks coarsely.
    set_mtime(path_, 1'000'000'000, 123'456'789);
  }

  testsupport::TempDir tmp_{"ckptfs-source"};
  fs::path root_ = tmp_.path();
  fs::path path_ = root_ / "a.ckpt";
};

TEST(FingerprintKey, IsFixedWidthBigEndian) {
  const Fingerprint fp{0x0102030405060708, 0x1112131415161718, 0x21, -1, 0x3132};
  const std::string key = fp.key();
  ASSERT_EQ(key.size(), Fingerprint::kKeySize);
  const std::string expected =
      std::string("\x01\x02\x03\x04\x05\x06\x07\x08\x11\x12\x13\x14\x15\x16\x17\x18", 16) +
      std::string("\0\0\0\0\0\0\0\x21", 8) + std::string(8, '\xff') +
      std::string("\0\0\0\0\0\0\x31\x32", 8);
  EXPECT_EQ(key, expected);
  EXPECT_EQ(Fingerprint::from_key(key), fp);
  EXPECT_EQ(Fingerprint{}.key(), std::string(40, '\0'));
}

TEST(FingerprintKey, FromKeyRejectsOtherLengths) {
  EXPECT_FALSE(Fingerprint::from_key("").has_value());
  EXPECT_FALSE(Fingerprint::from_key(std::string(32, 'x')).has_value());
  EXPECT_FALSE(Fingerprint::from_key(std::string(39, 'x')).has_value());
  EXPECT_FALSE(Fingerprint::from_key(std::string(41, 'x')).has_value());
}

TEST_F(SourceFileTest, OpenTakesTheStatIdentity) {
  const SourceFile file = SourceFile::open(path_);
  struct stat st;
  ASSERT_EQ(::stat(path_.c_str(), &st), 0);
  EXPECT_EQ(file.path, path_);
  EXPECT_TRUE(file.fd);
  EXPECT_EQ(file.fingerprint.dev, st.st_dev);
  EXPECT_EQ(file.fingerprint.ino, st.st_ino);
  EXPECT_EQ(file.fingerprint.size, 10u);
  EXPECT_EQ(file.fingerprint.mtime_ns, 1'000'000'000'123'456'789);
  EXPECT_EQ(fingerprint_of(file.fd.get(), "x"), file.fingerprint);
  EXPECT_TRUE(file.unchanged());
  const int flags = ::fcntl(file.fd.get(), F_GETFD);
  EXPECT_TRUE(flags & FD_CLOEXEC);
  EXPECT_EQ(::fcntl(file.fd.get(), F_GETFL) & O_ACCMODE, O_RDONLY);
}

TEST_F(SourceFileTest, TouchChangesOnlyTheMtime) {
  const SourceFile file = SourceFile::open(path_);
  set_mtime(path_, 1'000'000'000, 123'456'790);
  const Fingerprint now = fingerprint_of(file.fd.get(), path_.string());
  EXPECT_NE(now, file.fingerprint);
  EXPECT_NE(now.key(), file.fingerprint.key());
  EXPECT_EQ(now.mtime_ns, file.fingerprint.mtime_ns + 1);
  EXPECT_EQ(now.ino, file.fingerprint.ino);
  EXPECT_FALSE(file.unchanged());
}

TEST_F(SourceFileTest, TruncateChangesTheSize) {
  const SourceFile file = SourceFile::open(path_);
  ASSERT_EQ(::truncate(path_.c_str(), 4), 0);
  set_mtime(path_, 1'000'000'000, 123'456'789);  // even with the old mtime put back
  EXPECT_EQ(fingerprint_of(file.fd.get(), path_.string()).size, 4u);
  EXPECT_FALSE(file.unchanged());
}

TEST_F(SourceFileTest, RewriteInPlaceWithTheSameSizeChangesTheMtime) {
  const SourceFile file = SourceFile::open(path_);
  write_file(path_, "9876543210");
  const Fingerprint now = SourceFile::open(path_).fingerprint;
  EXPECT_EQ(now.size, file.fingerprint.size);
  EXPECT_EQ(now.ino, file.fingerprint.ino);
  EXPECT_NE(now.mtime_ns, file.fingerprint.mtime_ns);
  EXPECT_FALSE(file.unchanged());
}

// rsync -a --inplace and touch -r put the mtime back after a rewrite; only the ctime, which no
// call can set, still tells.
TEST_F(SourceFileTest, RewriteInPlaceWithTheMtimeRestoredChangesTheCtime) {
  const SourceFile file = SourceFile::open(path_);
  // Past the ctime's clock tick, so the rewrite cannot land on the same ctime.
  ::usleep(20'000);
  write_file(path_, "9876543210");
  set_mtime(path_, 1'000'000'000, 123'456'789);
  const Fingerprint now = SourceFile::open(path_).fingerprint;
  EXPECT_EQ(now.size, file.fingerprint.size);
  EXPECT_EQ(now.ino, file.fingerprint.ino);
  EXPECT_EQ(now.mtime_ns, file.fingerprint.mtime_ns);
  EXPECT_NE(now.ctime_ns, file.fingerprint.ctime_ns);
  EXPECT_NE(now.key(), file.fingerprint.key());
  EXPECT_FALSE(file.unchanged());
}

TEST_F(SourceFileTest, ReplacementByRenameChangesTheInodeButNotTheOpenFile) {
  const SourceFile file = SourceFile::open(path_);
  const fs::path next = root_ / "a.ckpt.tmp";
  write_file(next, "0123456789");
  set_mtime(next, 1'000'000'000, 123'456'789);
  fs::rename(next, path_);
  const Fingerprint now = SourceFile::open(path_).fingerprint;
  EXPECT_NE(now.ino, file.fingerprint.ino);
  EXPECT_NE(now, file.fingerprint);
  // The open descriptor still reads the bytes it fingerprinted.
  EXPECT_TRUE(file.unchanged());
}

// A job that rotates checkpoints deletes files the mount still holds open: nobody can write
// them any more, so they keep being served although the unlink moved their ctime.
TEST_F(SourceFileTest, UnlinkedButNotWrittenStaysUnchanged) {
  const SourceFile file = SourceFile::open(path_);
  ::usleep(20'000);
  ASSERT_EQ(::unlink(path_.c_str()), 0);
  struct stat st;
  ASSERT_EQ(::fstat(file.fd.get(), &st), 0);
  EXPECT_EQ(st.st_nlink, 0u);
  EXPECT_NE(Fingerprint::from_stat(st).ctime_ns, file.fingerprint.ctime_ns);
  EXPECT_TRUE(file.unchanged());
}

// Whoever still holds a writable descriptor of a deleted file can rewrite it and put the mtime
// back (futimens); the unlink's own ctime move must not hide that write.
TEST_F(SourceFileTest, UnlinkedThenWrittenThroughAHeldDescriptorWithTheMtimePutBack) {
  const SourceFile file = SourceFile::open(path_);
  const UniqueFd writer(::open(path_.c_str(), O_WRONLY | O_CLOEXEC));
  ASSERT_TRUE(writer);
  ASSERT_EQ(::unlink(path_.c_str()), 0);
  ::usleep(20'000);
  ASSERT_EQ(::pwrite(writer.get(), "98765", 5, 0), 5);
  const struct timespec times[2] = {{0, UTIME_OMIT}, {1'000'000'000, 123'456'789}};
  ASSERT_EQ(::futimens(writer.get(), times), 0);
  const Fingerprint now = fingerprint_of(file.fd.get(), path_.string());
  EXPECT_EQ(now.size, file.fingerprint.size);
  EXPECT_EQ(now.mtime_ns, file.fingerprint.mtime_ns);
  EXPECT_FALSE(file.unchanged());
}

// Written (mtime put back) while it still had its name, then deleted before anyone looked:
// the unlink moves the ctime again, and still the write counts.
TEST_F(SourceFileTest, WrittenWithTheMtimePutBackThenUnlinked) {
  const SourceFile file = SourceFile::open(path_);
  ::usleep(20'000);
  write_file(path_, "9876543210");
  set_mtime(path_, 1'000'000'000, 123'456'789);
  ASSERT_EQ(::unlink(path_.c_str()), 0);
  EXPECT_FALSE(file.unchanged());
}

TEST_F(SourceFileTest, UnchangedIsFalseWithoutADescriptor) {
  SourceFile file = SourceFile::open(path_);
  file.fd.reset();
  EXPECT_FALSE(file.unchanged());
  EXPECT_THROW(fingerprint_of(-1, "nothing"), Error);
}

TEST_F(SourceFileTest, OpenErrorsNameThePath) {
  const fs::path missing = root_ / "missing.ckpt";
  try {
    SourceFile::open(missing);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(missing.string()));
    EXPECT_THAT(e.what(), HasSubstr("No such file or directory"));
  }
  try {
    SourceFile::open(root_);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(root_.string() + ": the checkpoint file is a directory, not a "
                                                     "regular file"));
  }
}

// A FIFO would block open(2) until a writer came; a device such as /dev/zero reads without end.
// Neither is opened for reading: each is refused at once, naming what it is.
TEST_F(SourceFileTest, SpecialFilesAreRefusedWithoutBlocking) {
  const fs::path fifo = root_ / "fifo.ckpt";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  const fs::path zero = root_ / "zero.ckpt";
  fs::create_symlink("/dev/zero", zero);
  const fs::path loop = root_ / "loop.ckpt";
  fs::create_symlink(loop, loop);
  for (const auto& [path, kind] :
       {std::pair{fifo, std::string("a FIFO (named pipe)")},
        std::pair{zero, std::string("a symlink to /dev/zero, a character device")},
        std::pair{fs::path("/dev/null"), std::string("a character device")},
        std::pair{loop, std::string("a symlink loop")}}) {
    try {
      SourceFile::open(path);
      ADD_FAILURE() << path << " opened";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(path.string() + ": the checkpoint file is " + kind));
    }
  }
}

}  // namespace
}  // namespace ckptfs::source
