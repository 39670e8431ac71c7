// The read service without FUSE: open, read and release through it on the hand-built tree of
// test_data.h, in each way it can serve a READ (gathered, read ahead, spliced, page-cache mode),
// and compare the bytes with the plain concatenation of the pieces (computed from the source
// files, never through ckptfs).
#include "../../src/fs/service.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "test_data.h"

namespace ckptfs::fs {
namespace {

using testing::ino_of;
using testing::TempDir;
using testing::TestData;

// Keeps what the service answered to one READ.
class Captured final : public ReadSink {
 public:
  void bytes(std::span<const char> data) override {
    ++replies;
    err = 0;
    got.assign(data.data(), data.size());
  }
  void pipe(int fd, size_t length) override {
    ++replies;
    err = 0;
    spliced = true;
    got.assign(length, '\0');
    for (size_t done = 0; done < length;) {
      const ssize_t n = ::read(fd, got.data() + done, length - done);
      if (n <= 0) {
        err = EIO;  // the pipe held less than announced
        return;
      }
      done += static_cast<size_t>(n);
    }
  }
  void error(int e) override {
    ++replies;
    err = e;
  }

  int replies = 0;
  int err = -1;
  bool spliced = false;
  std::string got;
};

class ServiceTest : public ::testing::Test {
 protected:
  ServiceTest() : data_(dir_.path()), tree_(data_.make_plan()) {}

  std::unique_ptr<Service> make(Service::Options options, bool can_splice = false) {
    auto service = std::make_unique<Service>(tree_, "test mount", options);
    static_cast<void>(service->start({can_splice, 1u << 20}));
    return service;
  }

  // One READ through handle `fh`; checks that exactly one reply was given.
  static Captured read(Service& service, uint64_t ino, uint64_t fh, int64_t off, size_t size) {
    Captured c;
    service.read(ino, fh, off, size, /*paged=*/false, /*mappable=*/false, c);
    EXPECT_EQ(c.replies, 1);
    return c;
  }

  // Opens target `t`, reads it front to back in READs of the sizes in `sizes` (in turn),
  // releases it, and returns the bytes.
  static std::string read_whole(Service& service, size_t t, const std::vector<size_t>& sizes,
                                bool* spliced = nullptr) {
    const Service::Opened o = service.open(ino_of(t), O_RDONLY, false);
    EXPECT_EQ(o.err, 0);
    std::string all;
    for (size_t i = 0;; ++i) {
      const Captured c =
          read(service, ino_of(t), o.fh, static_cast<int64_t>(all.size()), sizes[i % sizes.size()]);
      EXPECT_EQ(c.err, 0) << "at " << all.size();
      if (c.err != 0 || c.got.empty()) break;
      if (spliced != nullptr) *spliced = *spliced || c.spliced;
      all += c.got;
    }
    service.release(o.fh);
    return all;
  }

  TempDir dir_;
  TestData data_;
  Tree tree_;
};

TEST_F(ServiceTest, GatheredReadsAreTheTargetBytes) {
  auto service = make({});
  for (size_t t = 0; t < data_.targets(); ++t) {
    const Service::Opened o = service->open(ino_of(t), O_RDONLY, false);
    ASSERT_EQ(o.err, 0);
    EXPECT_EQ(o.fh, 0u);  // no read-ahead: nothing to hold
    EXPECT_TRUE(o.direct_io);
    EXPECT_FALSE(o.keep_cache);
    EXPECT_TRUE(read_whole(*service, t, {1 << 20}) == data_.expected(t)) << "target " << t;
  }
  const Service::Counters c = service->counters();
  EXPECT_GT(c.served, 0u);
  EXPECT_EQ(c.failed, 0u);
  EXPECT_EQ(c.spliced, 0u);
  service->stop();
}

TEST_F(ServiceTest, ReadAheadServesSequentialReadsAndHoldsAHandle) {
  auto service = make({.read_ahead = true});
  const Service::Opened o = service->open(ino_of(2), O_RDONLY, false);
  ASSERT_EQ(o.err, 0);
  EXPECT_NE(o.fh, 0u);
  EXPECT_EQ(service->open_handles(), 1u);
  service->release(o.fh);
  EXPECT_EQ(service->open_handles(), 0u);
  // Unaligned READ sizes: blocks are cut across, as a reader with an unaligned buffer gets.
  for (size_t t = 0; t < data_.targets(); ++t)
    EXPECT_TRUE(read_whole(*service, t, {(1 << 20) - 100, 100, 333333}) == data_.expected(t))
        << "target " << t;
  EXPECT_EQ(service->open_handles(), 0u);
  EXPECT_EQ(service->counters().failed, 0u);
  service->stop();
}

TEST_F(ServiceTest, RandomReadsMatch) {
  auto service = make({.read_ahead = true});
  std::mt19937_64 rng(7);
  for (size_t t = 0; t < data_.targets(); ++t) {
    const std::string& want = data_.expected(t);
    const Service::Opened o = service->open(ino_of(t), O_RDONLY, false);
    ASSERT_EQ(o.err, 0);
    for (int i = 0; i < 40; ++i) {
      const uint64_t off = want.empty() ? 0 : rng() % (want.size() + 10);
      const size_t size = rng() % (1 << 20);
      const Captured c = read(*service, ino_of(t), o.fh, static_cast<int64_t>(off), size);
      ASSERT_EQ(c.err, 0);
      const std::string expect = off < want.size() ? want.substr(off, size) : std::string();
      ASSERT_TRUE(c.got == expect) << "target " << t << " at " << off << " size " << size;
    }
    service->release(o.fh);
  }
  service->stop();
}

TEST_F(ServiceTest, SplicedReadsAreTheTargetBytes) {
  if (StagePipe::max_slots() == 0) GTEST_SKIP() << "pipes cannot hold 1 MiB here";
  auto service = make({.read_ahead = true, .splice = Service::Splice::kAlways},
                      /*can_splice=*/true);
  bool spliced = false;
  // Target 2 (rank 5) is MiBs of long runs: READs that get spliced.
  EXPECT_TRUE(read_whole(*service, 2, {512 << 10}, &spliced) == data_.expected(2));
  EXPECT_TRUE(spliced);
  EXPECT_GT(service->counters().spliced, 0u);
  // Target 1 has 13-byte runs: its READs are declined by the stage and gathered.
  EXPECT_TRUE(read_whole(*service, 1, {512 << 10}) == data_.expected(1));
  service->stop();
}

TEST_F(ServiceTest, PageCacheModeOpensWithKeepCache) {
  auto service = make({.cache = true, .read_ahead = true});
  const Service::Opened o = service->open(ino_of(0), O_RDONLY, false);
  ASSERT_EQ(o.err, 0);
  EXPECT_FALSE(o.direct_io);
  EXPECT_TRUE(o.keep_cache);
  EXPECT_EQ(o.fh, 0u);  // the kernel reads ahead itself
  Captured c;
  service->read(ino_of(0), o.fh, 0, 1 << 20, /*paged=*/true, false, c);
  EXPECT_TRUE(c.got == data_.expected(0));
  EXPECT_EQ(service->counters().paged, 1u);
  service->stop();
}

TEST_F(ServiceTest, RefusalsAreErrnos) {
  auto service = make({.read_ahead = true});
  EXPECT_EQ(service->open(ino_of(0), O_WRONLY, false).err, EROFS);
  EXPECT_EQ(service->open(ino_of(0), O_RDONLY | O_TRUNC, false).err, EROFS);
  EXPECT_EQ(service->open(Tree::kRootIno, O_RDONLY, false).err, EISDIR);
  EXPECT_EQ(service->open(999999, O_RDONLY, false).err, ENOENT);
  EXPECT_EQ(read(*service, Tree::kRootIno, 0, 0, 10).err, EISDIR);
  EXPECT_EQ(read(*service, 999999, 0, 0, 10).err, ENOENT);
  EXPECT_EQ(read(*service, ino_of(0), 0, -1, 10).err, EINVAL);
  const Captured past = read(*service, ino_of(0), 0, 1 << 30, 10);
  EXPECT_EQ(past.err, 0);
  EXPECT_TRUE(past.got.empty());
  EXPECT_EQ(service->opendir(Tree::kRootIno, O_WRONLY).err, EROFS);
  EXPECT_EQ(service->opendir(ino_of(0), O_RDONLY).err, ENOTDIR);
  EXPECT_EQ(service->list(ino_of(0)).err, ENOTDIR);
  EXPECT_EQ(service->lookup(ino_of(0), "x").err, ENOTDIR);
  EXPECT_EQ(service->lookup(Tree::kRootIno, "no such").ino, 0u);  // a negative entry
  EXPECT_EQ(service->access(ino_of(0), W_OK), EROFS);
  EXPECT_EQ(service->getattr(999999).err, ENOENT);
  service->stop();
}

TEST_F(ServiceTest, ChangedSourceFailsTheReadAndIsCounted) {
  auto service = make({.read_ahead = true});
  const Service::Opened o = service->open(ino_of(2), O_RDONLY, false);
  ASSERT_EQ(o.err, 0);
  data_.change_source(2);
  EXPECT_EQ(read(*service, ino_of(2), o.fh, 0, 1 << 20).err, EIO);
  EXPECT_EQ(service->counters().failed, 1u);
  EXPECT_EQ(service->open(ino_of(2), O_RDONLY, false).err, EIO);
  service->release(o.fh);
  service->stop();
}

// At unmount the kernel drops the RELEASEs it has not sent: stop() frees those handles (a leak
// under LeakSanitizer otherwise).
TEST_F(ServiceTest, StopFreesHandlesLeftOpen) {
  auto service = make({.read_ahead = true});
  for (size_t t = 0; t < 3; ++t) {
    const Service::Opened o = service->open(ino_of(t), O_RDONLY, false);
    ASSERT_EQ(o.err, 0);
    EXPECT_EQ(read(*service, ino_of(t), o.fh, 0, 4096).err, 0);
  }
  EXPECT_EQ(service->open_handles(), 3u);
  service->stop();
  EXPECT_EQ(service->open_handles(), 0u);
}

TEST_F(ServiceTest, StatusFilesAreReadFromTheirOpen) {
  auto service = make({});
  const Service::Entry dir = service->lookup(Tree::kRootIno, ".ckptfs");
  ASSERT_EQ(dir.err, 0);
  ASSERT_NE(dir.ino, 0u);
  const Service::Entry file = service->lookup(dir.ino, "sources.json");
  ASSERT_EQ(file.err, 0);
  ASSERT_NE(file.ino, 0u);
  const Service::Opened o = service->open(file.ino, O_RDONLY, false);
  ASSERT_EQ(o.err, 0);
  EXPECT_TRUE(o.direct_io);
  ASSERT_NE(o.fh, 0u);
  const Captured c = read(*service, file.ino, o.fh, 0, 1 << 20);
  EXPECT_EQ(c.err, 0);
  EXPECT_NE(c.got.find("test mount"), std::string::npos) << c.got;
  service->release(o.fh);
  EXPECT_EQ(service->open_handles(), 0u);
  service->stop();
}

}  // namespace
}  // namespace ckptfs::fs
