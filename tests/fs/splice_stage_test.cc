// SpliceStage over a hand-built tree: which READs it takes, that the bytes it puts in the pipe
// are the target's bytes (read back from the pipe and compared with the plain concatenation),
// that a source changed or cut short fails the READ instead of staging it, and that a leased
// source's writer waits until the staged pages are out of the pipe.
#include "../../src/fs/splice_stage.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "../../src/fs/scratch.h"
#include "test_data.h"

namespace ckptfs::fs {
namespace {

using testing::ino_of;
using testing::TempDir;
using testing::TestData;

// Everything in the pipe (staging never puts more than a READ in it).
std::string drain(const StagePipe& pipe) {
  std::string out;
  char chunk[65536];
  for (;;) {
    const ssize_t n = ::read(pipe.read_end(), chunk, sizeof chunk);
    if (n <= 0) break;
    out.append(chunk, static_cast<size_t>(n));
  }
  return out;
}

plan::Run source_run(uint64_t offset, uint64_t length) { return {nullptr, 0, offset, length}; }

TEST(SpliceStageRules, FewLongRunsAreStaged) {
  EXPECT_TRUE(SpliceStage::worth_it(std::vector{source_run(0, 512 << 10)}, 512 << 10, 256));
  const std::vector<plan::Run> two = {plan::Run{"hdr", 0, 0, 3}, source_run(4093, 100000)};
  EXPECT_TRUE(SpliceStage::worth_it(two, 100003, 256));
}

TEST(SpliceStageRules, A1MiBReadNeeds2MiBPipes) {
  const std::vector<plan::Run> one = {source_run(0, 1 << 20)};
  EXPECT_FALSE(SpliceStage::worth_it(one, 1 << 20, 256));  // 256 pages + the header
  EXPECT_TRUE(SpliceStage::worth_it(one, 1 << 20, 512));
}

TEST(SpliceStageRules, ManyOrShortRunsAreGathered) {
  std::vector<plan::Run> many;
  for (uint64_t i = 0; i <= SpliceStage::kMaxRuns; ++i) many.push_back(source_run(i << 20, 16384));
  EXPECT_FALSE(SpliceStage::worth_it(many, many.size() * 16384, 512));
  // Three runs averaging under kMinRunBytes.
  const std::vector<plan::Run> shortish = {source_run(0, 20000), source_run(1 << 20, 4000),
                                           source_run(2 << 20, 4000)};
  EXPECT_FALSE(SpliceStage::worth_it(shortish, 28000, 256));
  EXPECT_FALSE(SpliceStage::worth_it(std::vector{source_run(0, 8192)}, 8192, 256));
  EXPECT_FALSE(SpliceStage::worth_it(std::span<const plan::Run>{}, 0, 256));
}

TEST(SpliceStageRules, RunsThatWouldOverflowTheReplyPipeAreGathered) {
  // 480 KiB: libfuse sizes its pipe to 124 pages, rounded to 128 slots. Eight 60 KiB runs that
  // each start one byte before a page boundary touch 16 pages each: 128 + the header > 128.
  std::vector<plan::Run> ragged;
  for (uint64_t i = 0; i < 8; ++i) ragged.push_back(source_run((i << 20) + 4095, 60 << 10));
  EXPECT_FALSE(SpliceStage::worth_it(ragged, 480 << 10, 256));
  // The same runs page-aligned touch 15 pages each: 121 slots fit.
  std::vector<plan::Run> aligned;
  for (uint64_t i = 0; i < 8; ++i) aligned.push_back(source_run(i << 20, 60 << 10));
  EXPECT_TRUE(SpliceStage::worth_it(aligned, 480 << 10, 256));
}

class SpliceStageTest : public ::testing::Test {
 protected:
  SpliceStageTest()
      : data_(dir_.path()), tree_(data_.make_plan()), stage_(tree_, 256), pipe_(256) {}

  // Stages [off, off + len) of target t, from unleased sources as -o splice=always does;
  // `bytes`: what the pipe held after it.
  ReadResult stage(size_t t, uint64_t off, size_t len, std::string& bytes) {
    SourceLeases::Hold hold(nullptr);
    const ReadResult staged = stage_.stage(ino_of(t), off, len, pipe_, hold, true);
    bytes = drain(pipe_);
    if (staged.ok()) {
      EXPECT_EQ(bytes.size(), staged.bytes());
    }
    return staged;
  }

  TempDir dir_;
  TestData data_;
  Tree tree_;
  SpliceStage stage_;
  StagePipe pipe_;
};

TEST_F(SpliceStageTest, StagedBytesAreTheTargetBytes) {
  const std::string& want = data_.expected(2);  // rank 5: a header, then MiBs of source 2
  size_t staged = 0;
  // READ-sized windows at page offsets and at odd ones, across the record seams.
  for (uint64_t off : {0ull, 4096ull, 512ull << 10, 1000003ull, (2ull << 20) - 100,
                       (2ull << 20) + 20, (3ull << 20) - 7}) {
    std::string bytes;
    const ReadResult staged_now = stage(2, off, 512 << 10, bytes);
    ASSERT_EQ(staged_now.error(), 0) << off;
    if (!staged_now.ok()) continue;
    ++staged;
    EXPECT_TRUE(bytes == want.substr(off, 512 << 10)) << "at " << off;
  }
  EXPECT_GE(staged, 5u);
}

TEST_F(SpliceStageTest, TheEndOfAFileStagesShort) {
  const std::string& want = data_.expected(2);
  std::string bytes;
  const uint64_t off = want.size() - 100000;
  ASSERT_TRUE(stage(2, off, 512 << 10, bytes).ok());
  EXPECT_TRUE(bytes == want.substr(off));
}

TEST_F(SpliceStageTest, ManyTinyRunsAreDeclinedAndLeaveThePipeEmpty) {
  std::string bytes;
  EXPECT_TRUE(stage(1, 0, 512 << 10, bytes).is_declined());  // rank 1: 13-byte runs
  EXPECT_TRUE(bytes.empty());
  // Declined after mapping just past kMaxRuns runs, not the READ's tens of thousands (which
  // the gather then maps again).
  EXPECT_LE(detail::scratch().splice_runs.size(), SpliceStage::kMaxRuns + 2);
  EXPECT_FALSE(stage_.would_stage(ino_of(1), 0, 512 << 10));
  EXPECT_LE(detail::scratch().splice_runs.size(), SpliceStage::kMaxRuns + 2);
  EXPECT_TRUE(stage_.would_stage(ino_of(2), 0, 512 << 10));
  EXPECT_FALSE(stage_.would_stage(1, 0, 512 << 10));  // the root is not a file
}

TEST_F(SpliceStageTest, AFullPipeIsDeclinedNotWaitedOn) {
  // Leave room for less than a READ: staging must give up (the caller then replaces the pipe
  // and gathers), not block.
  const std::string junk(240 * 4096, 'j');
  ASSERT_EQ(::write(pipe_.write_end(), junk.data(), junk.size()),
            static_cast<ssize_t>(junk.size()));
  SourceLeases::Hold hold(nullptr);
  const ReadResult staged = stage_.stage(ino_of(2), 4096, 512 << 10, pipe_, hold, true);
  EXPECT_TRUE(staged.is_declined());
  EXPECT_EQ(staged.bytes(), 0u);
  EXPECT_GE(pipe_.pending(), junk.size());
}

TEST_F(SpliceStageTest, ChangedSourceFails) {
  data_.change_source(2);
  std::string bytes;
  EXPECT_EQ(stage(2, 4096, 512 << 10, bytes).error(), EIO);
}

TEST_F(SpliceStageTest, SourceCutShortFails) {
  ASSERT_EQ(::truncate(data_.source_path(2).c_str(), 1 << 20), 0);
  std::string bytes;
  // Past the new end: the splice finds nothing to read.
  EXPECT_EQ(stage(2, (2ull << 20) - 100, 512 << 10, bytes).error(), EIO);
  // Before it: the bytes are there, but the fingerprint no longer matches.
  EXPECT_EQ(stage(2, 0, 512 << 10, bytes).error(), EIO);
}

// The tree's sources, for SourceLeases.
std::vector<SourceLeases::Source> sources_of(const Tree& tree) {
  std::vector<SourceLeases::Source> out;
  for (const auto& source : tree.plan().sources)
    out.push_back({source.file.fd.get(), source.file.path.string()});
  return out;
}

TEST_F(SpliceStageTest, UnleasedSourcesAreDeclinedUnlessForced) {
  // The default mount's rule: a source without a lease could be written while its pages wait
  // in the pipe, so its READs are gathered.
  SourceLeases::Hold hold(nullptr);
  EXPECT_TRUE(stage_.stage(ino_of(2), 4096, 512 << 10, pipe_, hold, false).is_declined());
  EXPECT_EQ(pipe_.pending(), 0u);
}

TEST_F(SpliceStageTest, WithoutALeaseAWriteAfterTheCheckReachesThePipe) {
  // Why the default splices leased sources only: the pipe holds the source's cached pages, not
  // a copy, so a write between the stage's check and the reply's copy shows, with no EIO.
  const std::string& want = data_.expected(2);
  SourceLeases::Hold hold(nullptr);
  const ReadResult staged = stage_.stage(ino_of(2), 0, 512 << 10, pipe_, hold, true);
  ASSERT_TRUE(staged.ok());
  const std::string path = data_.source_path(2).string();
  std::string source(std::filesystem::file_size(path), '\0');
  {
    const int fd = ::open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pread(fd, source.data(), source.size(), 0), static_cast<ssize_t>(source.size()));
    for (char& c : source) c = static_cast<char>(~c);
    ASSERT_EQ(::pwrite(fd, source.data(), source.size(), 0), static_cast<ssize_t>(source.size()));
    ::close(fd);
  }
  EXPECT_NE(drain(pipe_), want.substr(0, staged.bytes()));
}

TEST_F(SpliceStageTest, AWriterWaitsForTheSplicedReplyThenTheSourceIsGathered) {
  SourceLeases leases(sources_of(tree_));
  if (leases.leased() == 0) GTEST_SKIP() << "no lease here (not root, or no CAP_LEASE)";
  const std::string& want = data_.expected(2);
  std::atomic<bool> opened{false};
  std::thread writer;
  {
    SourceLeases::Hold hold(&leases);
    const ReadResult staged = stage_.stage(ino_of(2), 0, 512 << 10, pipe_, hold, false);
    ASSERT_TRUE(staged.ok());
    writer = std::thread([&] {
      const int fd = ::open(data_.source_path(2).c_str(), O_WRONLY);
      opened = true;
      if (fd >= 0) {
        EXPECT_EQ(::pwrite(fd, "changed!", 8, 0), 8);
        ::close(fd);
      }
    });
    // The kernel told the lease holder; the writer waits while the pipe holds the pages.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_FALSE(opened.load());
    EXPECT_EQ(drain(pipe_), want.substr(0, staged.bytes()));
  }
  writer.join();  // the hold is gone: the lease is let go, the writer gets in
  EXPECT_TRUE(opened.load());
  EXPECT_EQ(leases.broken(), 1u);
  // From now on that source is gathered (and a gather's check fails it).
  SourceLeases::Hold hold(&leases);
  EXPECT_TRUE(stage_.stage(ino_of(2), 0, 512 << 10, pipe_, hold, true).is_declined());
  EXPECT_EQ(pipe_.pending(), 0u);
}

}  // namespace
}  // namespace ckptfs::fs
