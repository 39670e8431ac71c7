// Tree without FUSE: inode layout, names, attributes, listings, and reads against the plain
// concatenation of the pieces each file is built from.
#include "ckptfs/fs/tree.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "../../src/fs/check_ahead.h"
#include "../../src/fs/prefetcher.h"
#include "ckptfs/ckpt/crc32.h"
#include "ckptfs/error.h"
#include "ckptfs/index/deferred_check.h"
#include "ckptfs/index/structure.h"
#include "support/test_support.h"
#include "test_data.h"

namespace ckptfs::fs {
namespace {

using testing::tree_read;

using ::testing::ElementsAre;
using testing::TempDir;
using testing::TestData;

// Reads windows of the single file (inode 3) of `tree`, starting every `step` bytes with random
// lengths up to `max_len`, and compares each with `want`.
void expect_windows_match(const Tree& tree, const std::string& want, size_t step, size_t max_len,
                          unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<size_t> len_of(1, max_len);
  for (size_t off = 0; off < want.size(); off += step) {
    const size_t len = len_of(rng);
    std::string buf(len, '\xEE');
    size_t got = 0;
    ASSERT_EQ(tree_read(tree, 3, off, std::span<char>(buf.data(), buf.size()), got), 0);
    buf.resize(got);
    ASSERT_EQ(buf, want.substr(off, len)) << "off " << off << " len " << len;
  }
}

// The newest mtime, by stat(2) of the paths, of the sources target i reads; false if it reads
// none.
bool newest_source_mtime(const Tree& tree, size_t i, struct timespec& out) {
  bool found = false;
  for (uint32_t s : tree.plan().targets[i].file.sources()) {
    struct stat st;
    if (::stat(tree.plan().sources[s].file.path.c_str(), &st) != 0) continue;
    if (!found || st.st_mtim.tv_sec > out.tv_sec ||
        (st.st_mtim.tv_sec == out.tv_sec && st.st_mtim.tv_nsec > out.tv_nsec))
      out = st.st_mtim;
    found = true;
  }
  return found;
}

class TreeTest : public ::testing::Test {
 protected:
  TreeTest() : data_(dir_.path()), tree_(data_.make_plan()) {}

  // Reads [off, off + len) through read_into, as a string of what it returned.
  // Without `err`, the read must succeed.
  std::string read(uint64_t ino, uint64_t off, size_t len, int* err = nullptr) {
    std::string buf(len, '\xEE');
    size_t got = 0;
    const int e = tree_read(tree_, ino, off, std::span<char>(buf.data(), buf.size()), got);
    if (err)
      *err = e;
    else
      EXPECT_EQ(e, 0) << "read of inode " << ino << " at " << off;
    EXPECT_LE(got, len);
    buf.resize(e == 0 ? got : 0);
    return buf;
  }

  TempDir dir_;
  TestData data_;
  Tree tree_;
};

TEST_F(TreeTest, LooksUpFixedInodes) {
  EXPECT_EQ(tree_.lookup(Tree::kRootIno, "rank_0"), 2u);
  EXPECT_EQ(tree_.lookup(2, "checkpoint_0.ckpt"), 3u);
  EXPECT_EQ(tree_.lookup(Tree::kRootIno, "rank_1"), 4u);
  EXPECT_EQ(tree_.lookup(4, "checkpoint_1.ckpt"), 5u);
  EXPECT_EQ(tree_.lookup(Tree::kRootIno, "rank_5"), 6u);
  EXPECT_EQ(tree_.lookup(6, "checkpoint_5.ckpt"), 7u);
  EXPECT_EQ(tree_.lookup(Tree::kRootIno, "rank_7"), 8u);
  EXPECT_EQ(tree_.lookup(8, "checkpoint_7.ckpt"), 9u);
  EXPECT_EQ(tree_.lookup(Tree::kRootIno, "."), Tree::kRootIno);
  EXPECT_EQ(tree_.lookup(4, ".."), Tree::kRootIno);
}

TEST_F(TreeTest, LookupMissesGiveZero) {
  EXPECT_EQ(tree_.lookup(Tree::kRootIno, "rank_2"), 0u);   // no such rank
  EXPECT_EQ(tree_.lookup(Tree::kRootIno, "rank_00"), 0u);  // not the canonical name
  EXPECT_EQ(tree_.lookup(Tree::kRootIno, "checkpoint_0.ckpt"), 0u);
  EXPECT_EQ(tree_.lookup(2, "checkpoint_1.ckpt"), 0u);  // another rank's file
  EXPECT_EQ(tree_.lookup(2, "rank_0"), 0u);
  EXPECT_EQ(tree_.lookup(3, "x"), 0u);                   // a file is not a directory
  EXPECT_EQ(tree_.lookup(10, "checkpoint_8.ckpt"), 0u);  // past the last inode
  EXPECT_EQ(tree_.lookup(0, "rank_0"), 0u);
}

TEST_F(TreeTest, StatGivesModesSizesAndOwner) {
  struct stat st;
  ASSERT_TRUE(tree_.stat(Tree::kRootIno, st));
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0555u);
  EXPECT_EQ(st.st_nlink, 2u + data_.targets());
  EXPECT_EQ(st.st_ino, Tree::kRootIno);
  EXPECT_EQ(st.st_uid, ::getuid());
  EXPECT_EQ(st.st_gid, ::getgid());
  const struct timespec mtime = st.st_mtim;
  EXPECT_LE(std::abs(mtime.tv_sec - std::time(nullptr)), 60);

  for (size_t i = 0; i < data_.targets(); ++i) {
    ASSERT_TRUE(tree_.stat(2 + 2 * i, st)) << i;
    EXPECT_TRUE(S_ISDIR(st.st_mode));
    EXPECT_EQ(st.st_mode & 07777, 0555u);
    EXPECT_EQ(st.st_nlink, 2u);

    ASSERT_TRUE(tree_.stat(3 + 2 * i, st)) << i;
    EXPECT_TRUE(S_ISREG(st.st_mode));
    // The sources sit in a mkdtemp directory (0700): only their owner may read them, so only
    // the owner may read what is made of them.
    EXPECT_EQ(st.st_mode & 07777, 0400u);
    EXPECT_EQ(st.st_uid, ::getuid());
    EXPECT_EQ(st.st_nlink, 1u);
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), data_.expected(i).size()) << i;
    EXPECT_EQ(static_cast<uint64_t>(st.st_blocks), (data_.expected(i).size() + 511) / 512);
    EXPECT_EQ(st.st_ino, 3 + 2 * i);
    // The newest mtime of the file's sources, the same on its directory; none is newer than
    // the root's.
    EXPECT_LE(st.st_mtim.tv_sec, mtime.tv_sec);
    struct timespec want {};
    if (!newest_source_mtime(tree_, i, want)) continue;
    EXPECT_EQ(st.st_mtim.tv_sec, want.tv_sec) << i;
    EXPECT_EQ(st.st_mtim.tv_nsec, want.tv_nsec) << i;
    struct stat dir;
    ASSERT_TRUE(tree_.stat(2 + 2 * i, dir));
    EXPECT_EQ(dir.st_mtim.tv_nsec, want.tv_nsec) << i;
  }
  ASSERT_EQ(data_.expected(3).size(), 0u) << "the test data should hold one empty file";
  EXPECT_FALSE(tree_.stat(0, st));
  EXPECT_FALSE(tree_.stat(2 + 2 * data_.targets(), st));
  EXPECT_FALSE(tree_.stat(3 + 2 * data_.targets(), st));
}

TEST_F(TreeTest, ListsDirectories) {
  std::vector<std::string> names;
  std::vector<uint64_t> inos;
  for (const Tree::DirEntry& e : tree_.list(Tree::kRootIno)) {
    names.emplace_back(e.name);
    inos.push_back(e.ino);
    EXPECT_TRUE(e.is_dir);
    EXPECT_EQ(e.name.data()[e.name.size()], '\0');
  }
  EXPECT_THAT(names, ElementsAre(".", "..", "rank_0", "rank_1", "rank_5", "rank_7"));
  EXPECT_THAT(inos, ElementsAre(1, 1, 2, 4, 6, 8));

  const std::vector<Tree::DirEntry> dir = tree_.list(6);
  ASSERT_EQ(dir.size(), 3u);
  EXPECT_EQ(dir[0].name, ".");
  EXPECT_EQ(dir[0].ino, 6u);
  EXPECT_EQ(dir[1].name, "..");
  EXPECT_EQ(dir[1].ino, Tree::kRootIno);
  EXPECT_EQ(dir[2].name, "checkpoint_5.ckpt");
  EXPECT_EQ(dir[2].ino, 7u);
  EXPECT_FALSE(dir[2].is_dir);

  EXPECT_TRUE(tree_.list(7).empty());
  EXPECT_TRUE(tree_.list(99).empty());
}

TEST_F(TreeTest, FileOnlyForFileInodes) {
  EXPECT_EQ(tree_.file(Tree::kRootIno), nullptr);
  EXPECT_EQ(tree_.file(2), nullptr);
  ASSERT_NE(tree_.file(3), nullptr);
  EXPECT_EQ(tree_.file(3)->size(), data_.expected(0).size());
  EXPECT_EQ(tree_.file(9)->size(), 0u);
  EXPECT_EQ(tree_.file(11), nullptr);
  EXPECT_EQ(tree_.total_bytes(),
            data_.expected(0).size() + data_.expected(1).size() + data_.expected(2).size());
  EXPECT_EQ(tree_.inode_count(), 9u);
}

TEST_F(TreeTest, ReadsMatchAtEveryOffsetOfSmallFiles) {
  std::mt19937 rng(42);
  for (size_t t : {0u, 1u}) {
    const std::string& want = data_.expected(t);
    const uint64_t ino = 3 + 2 * t;
    std::uniform_int_distribution<size_t> len_of(1, 700);
    for (size_t off = 0; off < want.size(); ++off) {
      const size_t len = len_of(rng);
      int err = -1;
      const std::string got = read(ino, off, len, &err);
      ASSERT_EQ(err, 0) << "file " << t << " off " << off;
      ASSERT_EQ(got, want.substr(off, len)) << "file " << t << " off " << off << " len " << len;
    }
  }
}

TEST_F(TreeTest, StridedRunsWithGapsAndJumpsMatch) {
  // Many short runs of one source separated by short gaps, a long gap and a backward jump,
  // then alternating sources.
  testing::TargetSpec strided{9, {}};
  for (uint32_t k = 0; k < 1500; ++k) strided.pieces.push_back(testing::Range{1, k * 41ull, 17});
  strided.pieces.push_back(testing::Range{1, 69000, 100});
  strided.pieces.push_back(testing::Range{1, 10, 30});
  for (uint32_t k = 0; k < 50; ++k)
    strided.pieces.push_back(testing::Range{k % 2, 3000ull + k * 7, 5});
  const Tree tree(data_.make_plan_from({strided}));
  expect_windows_match(tree, data_.concat(strided), 97, 9000, 11);
}

TEST_F(TreeTest, LargeGathersOverTwoSourcesAndHeaders) {
  // Hundreds of KiB of short runs from two sources, with header bytes in between.
  testing::TargetSpec big{11, {}};
  for (uint32_t k = 0; k < 700; ++k) {
    big.pieces.push_back(testing::Range{2, k * 4096ull, 1000 + k % 7});
    big.pieces.push_back(testing::Range{1, k * 90ull, 60});
    if (k % 100 == 0) big.pieces.push_back(testing::Bytes{"header"});
  }
  const Tree tree(data_.make_plan_from({big}));
  const std::string want = data_.concat(big);
  for (int round = 0; round < 20; ++round) {
    std::string buf(want.size() + 10, '\xEE');
    size_t got = 0;
    ASSERT_EQ(tree_read(tree, 3, 0, std::span<char>(buf.data(), buf.size()), got), 0);
    buf.resize(got);
    ASSERT_EQ(buf, want);
  }
  // A changed source fails the whole read.
  data_.change_source(2);
  std::string buf(want.size(), '\0');
  size_t got = 0;
  EXPECT_EQ(tree_read(tree, 3, 0, std::span<char>(buf.data(), buf.size()), got), EIO);
}

TEST_F(TreeTest, RowsInterleavingThreeSourcesAreCopiedSourceBySource) {
  // A merge of column blocks: every row takes a piece of each source, so a request reads
  // more sources than MappedSources::kFewSources and is copied one source at a time.
  testing::TargetSpec merged{13, {testing::Bytes{"rows:"}}};
  for (uint32_t row = 0; row < 3000; ++row)
    for (uint32_t s = 0; s < 3; ++s)
      merged.pieces.push_back(testing::Range{s, row * 3ull + s * 7, 3 + s});
  const Tree tree(data_.make_plan_from({merged}));
  expect_windows_match(tree, data_.concat(merged), 1111, 40000, 3);
}

TEST_F(TreeTest, RowsTakingSourcesOutOfOrderAndUnevenlyAreCopiedSourceBySource) {
  // The sources met in a request in an order not theirs (2 first), one of them (0) not in
  // every row: grouping the runs by source must keep every run once (a run lost or copied twice
  // shows in the bytes; whether they are grouped at all is the copy's speed, not its bytes).
  testing::TargetSpec merged{13, {testing::Bytes{"rows:"}}};
  for (uint32_t row = 0; row < 3000; ++row) {
    merged.pieces.push_back(testing::Range{2, row * 5ull, 5});
    if (row % 3 != 0) merged.pieces.push_back(testing::Range{0, row * 3ull, 2});
    merged.pieces.push_back(testing::Range{1, 7 + row * 4ull, 3});
  }
  const Tree tree(data_.make_plan_from({merged}));
  expect_windows_match(tree, data_.concat(merged), 997, 30000, 3);
}

// A merge of column blocks where each source gives the next rows of its slice: per request,
// each source's runs are one stretch of its file, read with preadv (into place for runs of
// 4 KiB or more on average, else through a 256 KiB buffer).
testing::TargetSpec column_merge(uint32_t rows, uint64_t width0, uint64_t width1, uint64_t width2) {
  testing::TargetSpec merged{13, {testing::Bytes{"cols:"}}};
  for (uint32_t row = 0; row < rows; ++row) {
    merged.pieces.push_back(testing::Range{0, row * width0, width0});
    merged.pieces.push_back(testing::Range{1, 1000 + row * width1, width1});
    merged.pieces.push_back(testing::Range{2, 4096 + row * width2, width2});
  }
  return merged;
}

// Windows of up to `max_len` bytes every `step` bytes, then the whole file in one read.
void expect_merge_matches(const TestData& data, const testing::TargetSpec& merged, size_t step,
                          size_t max_len) {
  const Tree tree(data.make_plan_from({merged}));
  const std::string want = data.concat(merged);
  expect_windows_match(tree, want, step, max_len, 5);
  std::string buf(want.size(), '\0');
  size_t got = 0;
  ASSERT_EQ(tree_read(tree, 3, 0, std::span<char>(buf.data(), buf.size()), got), 0);
  EXPECT_EQ(got, want.size());
  EXPECT_TRUE(buf == want);
}

TEST_F(TreeTest, ColumnBlocksOfShortRunsMatch) {
  // 2-, 5- and 300-byte runs: whole, source 2's stretch (1.2 MB) takes several buffers.
  expect_merge_matches(data_, column_merge(4000, 2, 5, 300), 7919, 200000);
}

TEST_F(TreeTest, ShortRunsAroundOneLongerThanTheBufferMatch) {
  // Source 2 gives 3-byte runs around one of 300 KiB: short on average, so buffered, and the
  // long one read alone.
  testing::TargetSpec merged{13, {testing::Bytes{"mixed:"}}};
  uint64_t at = 100;
  for (uint32_t row = 0; row < 2000; ++row) {
    merged.pieces.push_back(testing::Range{0, row * 2ull, 2});
    merged.pieces.push_back(testing::Range{1, row * 3ull, 3});
    const uint64_t width = row == 700 ? 300 << 10 : 3;
    merged.pieces.push_back(testing::Range{2, at, width});
    at += width;
  }
  expect_merge_matches(data_, merged, 5003, 400000);
}

TEST_F(TreeTest, ColumnBlocksOfLongRunsMatch) {
  // 400-, 3000- and 8192-byte runs: source 2's are read straight into place.
  expect_merge_matches(data_, column_merge(20, 400, 3000, 8192), 3331, 100000);
}

TEST_F(TreeTest, StretchPastAShrunkSourceEndGivesEio) {
  const testing::TargetSpec merged = column_merge(4000, 2, 5, 300);
  const Tree tree(data_.make_plan_from({merged}));
  ASSERT_EQ(::truncate(data_.source_path(2).c_str(), 8192), 0);
  std::string buf(data_.concat(merged).size(), '\0');
  size_t got = 0;
  EXPECT_EQ(tree_read(tree, 3, 0, std::span<char>(buf.data(), buf.size()), got), EIO);
  // The gather alone, before any fingerprint check, fails too: each source's runs are one
  // stretch, and source 2's runs on past its new end, so its preadv comes up short.
  std::vector<plan::Run> runs;
  for (uint32_t row = 0; row < 100; ++row)
    for (uint32_t s = 0; s < 3; ++s)
      runs.push_back(plan::Run{nullptr, s, (s == 2 ? 8000 : 0) + row * 4ull, 4});
  std::vector<char> out(runs.size() * 4);
  EXPECT_EQ(tree.gather(runs, out.data()).error(), EIO);
}

TEST_F(TreeTest, ReadsWholeFilesAndLargeWindows) {
  std::mt19937 rng(7);
  for (size_t t = 0; t < data_.targets(); ++t) {
    const std::string& want = data_.expected(t);
    EXPECT_EQ(read(3 + 2 * t, 0, want.size() + 100), want) << t;
    std::uniform_int_distribution<uint64_t> off_of(0, want.size() + 10);
    std::uniform_int_distribution<size_t> len_of(1, 1500000);
    for (int i = 0; i < 30; ++i) {
      const uint64_t off = off_of(rng);
      const size_t len = len_of(rng);
      const std::string expect = off < want.size() ? want.substr(off, len) : std::string();
      ASSERT_EQ(read(3 + 2 * t, off, len), expect) << t << " " << off << " " << len;
    }
  }
}

TEST_F(TreeTest, ReadIntoListsTheSourcesItRead) {
  // Rank 5 (inode 7): a header, ~3 MiB of source 2, then 10,000 bytes of source 0.
  const std::string& want = data_.expected(2);
  std::string buf(want.size(), '\0');
  size_t got = 0;
  std::vector<uint32_t> sources{9, 9};
  ASSERT_EQ(tree_read(tree_, 7, 0, std::span<char>(buf.data(), 4096), got, &sources), 0);
  EXPECT_EQ(sources, std::vector<uint32_t>{2});
  ASSERT_EQ(tree_read(tree_, 7, 0, std::span<char>(buf.data(), buf.size()), got, &sources), 0);
  EXPECT_EQ(sources, (std::vector<uint32_t>{0, 2}));
  EXPECT_EQ(tree_.check_sources(std::span<const uint32_t>(sources)), 0);
  data_.change_source(0);
  EXPECT_EQ(tree_.check_sources(std::span<const uint32_t>(sources)), EIO);
  const std::vector<uint32_t> only_two{2};
  EXPECT_EQ(tree_.check_sources(std::span<const uint32_t>(only_two)), 0);
}

TEST_F(TreeTest, ReadIntoRejectsNonFiles) {
  int err = 0;
  read(Tree::kRootIno, 0, 10, &err);
  EXPECT_EQ(err, EISDIR);
  read(4, 0, 10, &err);
  EXPECT_EQ(err, EISDIR);
  read(100, 0, 10, &err);
  EXPECT_EQ(err, ENOENT);
  EXPECT_EQ(tree_.check_file(3), 0);
  EXPECT_EQ(tree_.check_file(2), EISDIR);
  EXPECT_EQ(tree_.check_file(100), ENOENT);
}

TEST_F(TreeTest, ChangedSourceGivesEio) {
  data_.change_source(1);
  const std::string& want = data_.expected(0);
  int err = 0;
  // Header and source 0 only: still served.
  EXPECT_EQ(read(3, 0, 5009, &err), want.substr(0, 5009));
  EXPECT_EQ(err, 0);
  // Anything touching source 1 fails, every time.
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(read(3, 5000, 100, &err), "");
    EXPECT_EQ(err, EIO);
  }
  EXPECT_EQ(tree_.check_file(3), EIO);  // rank 0 reads source 1
  EXPECT_EQ(tree_.check_file(7), 0);    // rank 5 does not
  read(7, 0, 1 << 20, &err);
  EXPECT_EQ(err, 0);
}

// A source changed and then put back (size and mtime restored) is not trusted again: the view
// was planned from bytes that may have been different in between.
TEST_F(TreeTest, ChangedSourceStaysRefusedWhenPutBack) {
  const std::filesystem::path& path = data_.source_path(1);
  struct stat before;
  ASSERT_EQ(::stat(path.c_str(), &before), 0);
  data_.change_source(1);
  int err = 0;
  EXPECT_EQ(read(3, 5000, 100, &err), "");
  EXPECT_EQ(err, EIO);
  ASSERT_EQ(::truncate(path.c_str(), before.st_size), 0);
  testsupport::set_mtime(path, before.st_mtim.tv_sec, before.st_mtim.tv_nsec);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(read(3, 5000, 100, &err), "");
    EXPECT_EQ(err, EIO);
  }
  EXPECT_EQ(tree_.check_file(3), EIO);
  EXPECT_EQ(tree_.check_file(7), 0);
}

// The digest of a file that is all structure (a scan of no parameter), by construction: the
// CRC-32 of its bytes, whole and by region of `region` bytes (none: no regions kept).
index::StructureDigest whole_digest(std::string_view bytes, uint64_t region = 0) {
  const auto crc = [](std::string_view b) {
    return ckpt::crc32_update(0, std::span(reinterpret_cast<const uint8_t*>(b.data()), b.size()));
  };
  index::StructureDigest d;
  d.bytes = bytes.size();
  d.crc = crc(bytes);
  d.region = region;
  for (uint64_t at = 0; region != 0 && at < bytes.size(); at += region)
    d.regions.push_back(crc(bytes.substr(at, region)));
  return d;
}

// Sources whose scans the index gave on trust of their size and mtime (a FUSE filesystem, whose
// daemon may put a ctime back): each one's structure bytes are compared with the stored digest
// before its first byte is served. One whose bytes differ fails every file that reads it, for
// good; the files that do not read it are served.
TEST(TreeDeferredChecks, ASourceIsServedOnlyOnceItsHeadersMatch) {
  TempDir dir("ckptfs-tree-deferred");
  TestData data(dir.path());
  plan::Plan plan = data.make_plan();
  std::vector<std::shared_ptr<const index::DeferredCheck>> checks;
  for (size_t i = 0; i < plan.sources.size(); ++i) {
    // No parameter: the whole file is structure, its digest the CRC-32 of all of it.
    const std::string& bytes = data.source_bytes(i);
    plan.sources[i].scan.file_size = bytes.size();
    // An entry without regions (as written before they were kept): checked whole, at open.
    index::StructureDigest want = whole_digest(bytes);
    if (i == 1) want.crc ^= 1;  // source 1 was rewritten since it was indexed
    checks.push_back(std::make_shared<const index::DeferredCheck>(
        want, plan.sources[i].scan, dir.path() / "index", std::string()));
    plan.sources[i].deferred = checks.back();
  }
  const Tree tree(std::move(plan));
  EXPECT_TRUE(checks[0]->pending());
  EXPECT_TRUE(checks[2]->pending());
  // Rank 5 reads sources 2 and 0: both checked at its open.
  EXPECT_EQ(tree.check_file(testing::ino_of(2)), 0);
  EXPECT_FALSE(checks[0]->pending());
  EXPECT_FALSE(checks[2]->pending());
  EXPECT_TRUE(checks[1]->pending());
  std::string buf(data.expected(2).size(), '\0');
  size_t got = 0;
  EXPECT_EQ(tree_read(tree, testing::ino_of(2), 0, std::span(buf.data(), buf.size()), got), 0);
  EXPECT_EQ(got, buf.size());
  EXPECT_EQ(buf, data.expected(2));
  // Rank 0 reads sources 0 and 1, rank 1 sources 1 and 2: refused, every time.
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(tree.check_file(testing::ino_of(0)), EIO);
    EXPECT_EQ(tree.check_file(testing::ino_of(1)), EIO);
    EXPECT_EQ(tree_read(tree, testing::ino_of(0), 5000, std::span(buf.data(), 100), got), EIO);
  }
  EXPECT_FALSE(checks[1]->pending());
  // Rank 0's header and source-0 bytes do not touch source 1.
  EXPECT_EQ(tree_read(tree, testing::ino_of(0), 0, std::span(buf.data(), 5009), got), 0);
  EXPECT_EQ(buf.substr(0, got), data.expected(0).substr(0, 5009));
}

// Every source of `plan` deferred with its digest by region of 1 MiB, source 2's third region
// said to be other than it is (rewritten since it was indexed). Labelled safetensors files, the
// one format checked by prefix (index/structure.h).
std::vector<std::shared_ptr<const index::DeferredCheck>> defer_by_region(
    plan::Plan& plan, const TestData& data, const std::filesystem::path& dir) {
  std::vector<std::shared_ptr<const index::DeferredCheck>> checks;
  for (size_t i = 0; i < plan.sources.size(); ++i) {
    const std::string& bytes = data.source_bytes(i);
    plan.sources[i].scan.file_size = bytes.size();
    plan.sources[i].scan.format = scan::SourceFormat::Safetensors;
    index::StructureDigest want = whole_digest(bytes, 1 << 20);
    if (i == 2) want.regions[2] ^= 1;
    checks.push_back(std::make_shared<const index::DeferredCheck>(want, plan.sources[i].scan,
                                                                  dir / "index", std::string()));
    plan.sources[i].deferred = checks.back();
  }
  return checks;
}

// A tree whose sources are all deferred as defer_by_region says.
class TreeRegionChecks : public ::testing::Test {
 protected:
  TreeRegionChecks() : tree_(deferred_plan()) {}
  plan::Plan deferred_plan() {
    plan::Plan plan = data_.make_plan();
    checks_ = defer_by_region(plan, data_, dir_.path());
    return plan;
  }
  TempDir dir_{"ckptfs-tree-regions"};
  TestData data_{dir_.path()};
  std::vector<std::shared_ptr<const index::DeferredCheck>> checks_;
  const Tree tree_;
};

// The same with the digest kept by region (index build writes them): a safetensors file says
// where every tensor lies before its first one, so a read waits only for the regions up to its
// last byte of each source. Source 2
// (3 MiB + 4 KiB, regions of 1 MiB) was rewritten in its third region: rank 5, which reads its
// first 2 MiB and then most of its third MiB, is served the first and refused the rest.
TEST_F(TreeRegionChecks, ASourceParsedFromItsStartIsCheckedAsFarAsReadsGo) {
  const uint64_t rank5 = testing::ino_of(2);
  // Not opened (an open starts the checks ahead of the reads: the test after this one).
  EXPECT_TRUE(checks_[2]->pending());
  EXPECT_TRUE(checks_[2]->needs(1));
  // Its header and first MiB of source 2: served, and only the first region was read.
  const std::string& want = data_.expected(2);
  std::string buf(1 << 20, '\0');
  size_t got = 0;
  ASSERT_EQ(tree_read(tree_, rank5, 0, std::span(buf.data(), buf.size()), got), 0);
  EXPECT_EQ(buf.substr(0, got), want.substr(0, buf.size()));
  EXPECT_FALSE(checks_[2]->needs(1 << 20));
  EXPECT_TRUE(checks_[2]->needs((1 << 20) + 1));
  EXPECT_FALSE(checks_[2]->differs());
  // The second MiB of source 2 as well; its third is refused, and from then on all of it.
  ASSERT_EQ(tree_read(tree_, rank5, 1 << 20, std::span(buf.data(), buf.size()), got), 0);
  EXPECT_EQ(buf.substr(0, got), want.substr(1 << 20, buf.size()));
  const uint64_t third = 10 + (2u << 20) + 13;  // "big header", 2 MiB, "second header"
  EXPECT_EQ(tree_read(tree_, rank5, third, std::span(buf.data(), 100), got), EIO);
  EXPECT_TRUE(checks_[2]->differs());
  EXPECT_EQ(tree_read(tree_, rank5, 0, std::span(buf.data(), 100), got), EIO);
  EXPECT_EQ(tree_.check_file(rank5), EIO);
  // Rank 0 (sources 0 and 1) is served whole; source 1's one region was checked on the way.
  std::string all(data_.expected(0).size(), '\0');
  ASSERT_EQ(tree_read(tree_, testing::ino_of(0), 0, std::span(all.data(), all.size()), got), 0);
  EXPECT_EQ(all.substr(0, got), data_.expected(0));
  EXPECT_FALSE(checks_[1]->pending());
}

// Opening a file has its sources checked to their end by helpers, ahead of its reads (over an
// S3 filesystem those reads fetch the sources, all at once). What they find is what a read
// would: source 2 differs in its third region, so rank 5 is refused from then on, even the
// bytes of its first regions; rank 0 is not.
TEST_F(TreeRegionChecks, OpeningAFileChecksItsSourcesAheadOfItsReads) {
  // Rank 5 (sources 2 and 0): the open itself fails if the helpers were that quick.
  const int opened = tree_.check_file(testing::ino_of(2));
  EXPECT_TRUE(opened == 0 || opened == EIO) << opened;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((checks_[0]->pending() || checks_[2]->pending()) &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(checks_[0]->pending());
  EXPECT_TRUE(checks_[2]->differs());
  EXPECT_TRUE(checks_[1]->pending());  // no file opened reads it
  std::string buf(100, '\0');
  size_t got = 0;
  EXPECT_EQ(tree_read(tree_, testing::ino_of(2), 0, std::span(buf.data(), buf.size()), got), EIO);
  EXPECT_EQ(tree_.check_file(testing::ino_of(2)), EIO);
  EXPECT_EQ(tree_.check_file(testing::ino_of(0)), 0);
  std::string all(data_.expected(0).size(), '\0');
  ASSERT_EQ(tree_read(tree_, testing::ino_of(0), 0, std::span(all.data(), all.size()), got), 0);
  EXPECT_EQ(all.substr(0, got), data_.expected(0));
}

// One source checked ahead by two trees (a rank's plan and steps/<latest>, or two ranks
// planned on first open, share its check): the tree that goes first (an unmount, a step
// dropped) stops its helpers, and they must not wait for the other tree's check of the whole
// file, which over an S3 filesystem fetches it (an unmount waited for that). Here 2 GiB of
// structure (a sparse file) in regions of 8 MiB, still under way when the first tree stops.
TEST(CheckAheadTest, StoppingDoesNotWaitForAnotherTreesCheckOfASharedSource) {
  TempDir dir("ckptfs-check-ahead");
  const std::filesystem::path path = dir.path() / "big.safetensors";
  constexpr uint64_t kSize = uint64_t{2} << 30;
  {
    const UniqueFd out(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    ASSERT_EQ(::ftruncate(out.get(), static_cast<off_t>(kSize)), 0);
  }
  index::IndexedSource source;
  source.file = source::SourceFile::open(path);
  source.scan.format = scan::SourceFormat::Safetensors;
  source.scan.file_size = source.scan.body_size = kSize;  // no tensor: all of it structure
  index::StructureDigest want;
  want.bytes = kSize;
  want.region = index::region_size(kSize);
  const std::string zeros(want.region, '\0');
  want.regions.assign(
      kSize / want.region,
      ckpt::crc32_update(0,
                         std::span(reinterpret_cast<const uint8_t*>(zeros.data()), zeros.size())));
  auto check = std::make_shared<const index::DeferredCheck>(want, source.scan, dir.path() / "index",
                                                            std::string());
  ASSERT_FALSE(check->whole());
  source.deferred = check;
  CheckAhead other(8);
  other.add(source);  // checks it to its end
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (check->needs(want.region) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_FALSE(check->needs(want.region));  // under way
  auto first = std::make_unique<CheckAhead>(8);
  first->add(source);  // its helper waits for the other's
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  first.reset();
  EXPECT_TRUE(check->pending()) << "stopped only once the other tree's check had read all of it";
}

// Reads ahead (fs::Prefetcher) gather blocks past the bytes asked for, and a hit is served with
// only the sources' fingerprints checked: the blocks' structure must have been checked up to
// their end when they were gathered. Rank 5 read in 64 KiB steps, the helpers let gather ahead
// before each: every byte served is the view's, none at or past the region of source 2 that
// differs (the third), and a read fails (once a block gathered ahead meets that region, the
// source is refused for good: every read of it).
TEST_F(TreeRegionChecks, ReadAheadServesNoByteOfARegionNotChecked) {
  const std::string& want = data_.expected(2);
  const uint64_t third = 10 + (2u << 20) + 13;  // rank 5's first byte of source 2's third MiB
  // spdlog builds its registry on first use: made here, before the helpers below log the
  // mismatch, or TSan (blind to libspdlog's own init guard) reports its construction as a race.
  spdlog::default_logger();
  Prefetcher prefetcher(tree_, 2);
  const auto stream = prefetcher.open(testing::ino_of(2));
  ReplyBuffer buf;
  std::string served;
  int err = 0;
  while (served.size() < want.size()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // let the helpers gather ahead
    size_t got = 0;
    err = testing::prefetch_read(prefetcher, *stream, served.size(), 64 << 10, buf, got);
    if (err != 0 || got == 0) break;
    served.append(buf.data(), got);
    prefetcher.start(*stream);
  }
  EXPECT_EQ(err, EIO);
  EXPECT_LE(served.size(), third);  // a block gathered ahead that met it failed the source
  EXPECT_EQ(served, want.substr(0, served.size()));
  EXPECT_GT(prefetcher.gathered_ahead(), 0u);
}

// Readers of many regions at once, two trees' helpers checking ahead and one of them stopped
// midway, over a check whose 41st region differs: no reader waits for ever, none past that
// region is told its bytes match, and the check ends found different. (Run under TSan too.)
TEST(CheckAheadTest, ManyReadersAndHelpersOfOneCheckAtOnce) {
  TempDir dir("ckptfs-check-ahead");
  const std::filesystem::path path = dir.path() / "f.safetensors";
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  constexpr uint64_t kSize = 64 * kMiB;
  {
    const UniqueFd out(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    ASSERT_EQ(::ftruncate(out.get(), static_cast<off_t>(kSize)), 0);
  }
  index::IndexedSource source;
  source.file = source::SourceFile::open(path);
  source.scan.format = scan::SourceFormat::Safetensors;
  source.scan.file_size = source.scan.body_size = kSize;
  index::StructureDigest want;
  want.bytes = kSize;
  want.region = kMiB;
  const std::string zeros(kMiB, '\0');
  want.regions.assign(
      64, ckpt::crc32_update(0, std::span(reinterpret_cast<const uint8_t*>(zeros.data()), kMiB)));
  want.regions[40] ^= 1;
  auto check = std::make_shared<const index::DeferredCheck>(want, source.scan, dir.path() / "index",
                                                            std::string());
  source.deferred = check;
  std::atomic<int> wrong{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 8; ++t)
    readers.emplace_back([&, t] {
      std::mt19937_64 random(t);
      for (int i = 0; i < 200; ++i) {
        const uint64_t upto = random() % (kSize + 1);
        std::string why;
        const auto got = check->verify(source.file.fd.get(), path.native(), source.scan, upto, why);
        if (upto > 40 * kMiB && got != index::DeferredCheck::Result::kDiffers) ++wrong;
      }
    });
  {
    CheckAhead stopped(8);
    stopped.add(source);
    CheckAhead other(8);
    other.add(source);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_TRUE(check->differs());
}

// Address space of this process, in bytes (/proc/self/statm's first field).
uint64_t address_space() {
  std::ifstream statm("/proc/self/statm");
  uint64_t pages = 0;
  statm >> pages;
  return pages * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

// Files opened one after another, each reading a source of its own: each check's helper ends
// once its queue is empty, and the next open starts another. An ended helper not joined keeps
// its stack (8 MiB of address space, the pages it touched resident) until the tree goes: a tree
// of thousands of sources held that many. At most the 8 helpers' worth may stay.
TEST(CheckAheadTest, EndedHelpersDoNotAccumulate) {
  TempDir dir("ckptfs-check-ahead");
  constexpr int kSources = 48;
  std::vector<index::IndexedSource> sources(kSources);
  index::StructureDigest want;
  want.bytes = 4096;
  want.region = index::region_size(4096);
  const std::string zeros(4096, '\0');
  want.regions = {
      ckpt::crc32_update(0, std::span(reinterpret_cast<const uint8_t*>(zeros.data()), 4096))};
  for (int i = 0; i < kSources; ++i) {
    const auto path = testsupport::write_file(dir.path() / fmt::format("{}.safetensors", i), zeros);
    index::IndexedSource& s = sources[i];
    s.file = source::SourceFile::open(path);
    s.scan.format = scan::SourceFormat::Safetensors;
    s.scan.file_size = s.scan.body_size = 4096;
    s.deferred = std::make_shared<const index::DeferredCheck>(want, s.scan, dir.path() / "index",
                                                              std::string());
  }
  CheckAhead ahead(8);
  const uint64_t before = address_space();
  for (index::IndexedSource& s : sources) {
    ahead.add(s);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (s.deferred->pending() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    ASSERT_FALSE(s.deferred->pending());
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // its helper ends
  }
  EXPECT_LT(address_space() - before, uint64_t{128} << 20);
}

TEST(TreeReads, RunPastSourceEndGivesEio) {
  TempDir dir;
  TestData data(dir.path());
  // 2000 bytes mapped from a 10000-byte source starting at 9000: the planner got it wrong.
  Tree tree(data.make_plan_from({{0, {testing::Bytes{"h"}, testing::Range{0, 9000, 2000}}}}));
  std::string buf(3000, '\0');
  size_t got = 99;
  EXPECT_EQ(tree_read(tree, 3, 0, std::span<char>(buf.data(), 500), got), 0);
  EXPECT_EQ(got, 500u);
  EXPECT_EQ(buf.substr(1, 499), data.source_bytes(0).substr(9000, 499));
  EXPECT_EQ(tree_read(tree, 3, 0, std::span<char>(buf.data(), buf.size()), got), EIO);
  EXPECT_EQ(got, 0u);
}

TEST(TreeReads, OutOfRangeSourceIndexGivesEio) {
  TempDir dir;
  TestData data(dir.path());
  Tree tree(data.make_plan());
  const std::vector<plan::Run> runs = {plan::Run{nullptr, 17, 0, 10}};
  EXPECT_EQ(tree.check_sources(runs), EIO);
  char out[10];
  EXPECT_EQ(tree.gather(runs, out).error(), EIO);
}

TEST(TreeReads, SeveralFilesPerRankDirectory) {
  TempDir dir;
  TestData data(dir.path());
  plan::Plan plan = data.make_plan_from({{0, {testing::Bytes{"ckpt"}}},
                                         {0, {testing::Bytes{"safetensors"}}},
                                         {1, {testing::Bytes{"one"}}}});
  plan.targets[1].name = "checkpoint_0.safetensors";
  plan.targets[1].page_cache = true;
  const Tree tree(std::move(plan));
  // In order: rank_0 (2), its two files (3, 4), rank_1 (5), its file (6).
  EXPECT_EQ(tree.inode_count(), 6u);
  EXPECT_EQ(tree.lookup(Tree::kRootIno, "rank_0"), 2u);
  EXPECT_EQ(tree.lookup(2, "checkpoint_0.ckpt"), 3u);
  EXPECT_EQ(tree.lookup(2, "checkpoint_0.safetensors"), 4u);
  EXPECT_EQ(tree.lookup(Tree::kRootIno, "rank_1"), 5u);
  EXPECT_EQ(tree.lookup(5, "checkpoint_1.ckpt"), 6u);
  EXPECT_EQ(tree.lookup(5, "checkpoint_0.safetensors"), 0u);
  const std::vector<Tree::DirEntry> entries = tree.list(2);
  ASSERT_EQ(entries.size(), 4u);
  EXPECT_EQ(entries[3].name, "checkpoint_0.safetensors");
  EXPECT_FALSE(tree.target(3)->page_cache);
  EXPECT_TRUE(tree.target(4)->page_cache);
  EXPECT_EQ(tree.target(2), nullptr);
  struct stat st;
  ASSERT_TRUE(tree.stat(4, st));
  EXPECT_EQ(st.st_size, 11);
  std::string buf(11, '\0');
  size_t got = 0;
  ASSERT_EQ(tree_read(tree, 4, 0, std::span<char>(buf.data(), buf.size()), got), 0);
  EXPECT_EQ(buf, "safetensors");
}

TEST(TreeReads, DuplicateRanksAreRejected) {
  TempDir dir;
  TestData data(dir.path());
  EXPECT_THROW(Tree(data.make_plan_from({{3, {}}, {3, {}}})), Error);
}

TEST(TreeReads, SourceShrunkUnderTheMappingGivesEioNotACrash) {
  TempDir dir;
  TestData data(dir.path());
  Tree tree(data.make_plan());
  const std::string& want = data.expected(2);  // rank 5: MiBs of source 2
  std::string buf(want.size(), '\0');
  size_t got = 0;
  ASSERT_EQ(tree_read(tree, 7, 0, std::span<char>(buf.data(), buf.size()), got), 0);
  ASSERT_EQ(buf, want);
  // Cut source 2 to one page behind the fingerprint check's back: the mapped pages past the
  // new end fault with SIGBUS when touched.
  ASSERT_EQ(::truncate(data.source_path(2).c_str(), 4096), 0);
  const std::vector<plan::Run> past_end = {plan::Run{nullptr, 2, 1u << 20, 8192}};
  std::vector<char> out(8192);
  EXPECT_EQ(tree.gather(past_end, out.data()).error(), EIO);
  // The fingerprint check sees it too, and the bytes still there are still served.
  EXPECT_EQ(tree_read(tree, 7, 0, std::span<char>(buf.data(), buf.size()), got), EIO);
  const std::vector<plan::Run> inside = {plan::Run{nullptr, 2, 0, 4096}};
  EXPECT_EQ(tree.gather(inside, out.data()).error(), 0);
  EXPECT_EQ(std::string(out.data(), 4096), data.source_bytes(2).substr(0, 4096));
}

}  // namespace
}  // namespace ckptfs::fs
