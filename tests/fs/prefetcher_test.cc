// Prefetcher over a hand-built tree: sequential reads come from blocks gathered ahead and match
// the plain concatenation; random reads are not read ahead; a source that changes between the
// gather ahead and the read fails the read; all streams together hold no more blocks than the
// budget, and a new stream past it takes the blocks of those read least recently.
#include "../../src/fs/prefetcher.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "test_data.h"

namespace ckptfs::fs {
namespace {

using testing::prefetch_read;

using testing::ino_of;
using testing::TempDir;
using testing::TestData;

// Waits until the prefetcher has gathered `n` blocks ahead (helpers run on their own time).
bool wait_gathered(const Prefetcher& p, uint64_t n) {
  for (int i = 0; i < 2000 && p.gathered_ahead() < n; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return p.gathered_ahead() >= n;
}

class PrefetcherTest : public ::testing::Test {
 protected:
  PrefetcherTest() : data_(dir_.path()), tree_(data_.make_plan()) {}

  TempDir dir_;
  TestData data_;
  Tree tree_;
};

// Waits until the helpers have been idle for a while: every block queued so far is gathered.
void settle(const Prefetcher& p) {
  uint64_t seen = p.gathered_ahead();
  for (int quiet = 0, i = 0; quiet < 10 && i < 2000; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const uint64_t now = p.gathered_ahead();
    quiet = now == seen ? quiet + 1 : 0;
    seen = now;
  }
}

// Reads the whole of target `t` sequentially with request sizes taken in turn from `sizes`,
// letting the helpers catch up before each read; returns the bytes and counts the reads.
std::string read_sequentially(Prefetcher& prefetcher, const TestData& data, size_t t,
                              const std::vector<size_t>& sizes, uint64_t& reads) {
  const auto stream = prefetcher.open(ino_of(t));
  ReplyBuffer buf;
  std::string all;
  reads = 0;
  for (uint64_t off = 0; off < data.expected(t).size(); ++reads) {
    settle(prefetcher);
    size_t got = 0;
    EXPECT_EQ(prefetch_read(prefetcher, *stream, off, sizes[reads % sizes.size()], buf, got), 0);
    prefetcher.start(*stream);
    if (got == 0) break;
    all.append(buf.data(), got);
    off += got;
  }
  return all;
}

TEST_F(PrefetcherTest, SequentialReadsAreServedFromBlocksReadAhead) {
  Prefetcher prefetcher(tree_, 2);
  const std::string& want = data_.expected(2);  // ~3 MiB
  uint64_t reads = 0;
  const std::string got = read_sequentially(prefetcher, data_, 2, {100000}, reads);
  EXPECT_TRUE(got == want) << got.size() << " bytes, want " << want.size();
  // The first read is gathered on the spot; every later one comes from a block read ahead.
  EXPECT_EQ(prefetcher.hits(), reads - 1);
  // Blocks of 1 MiB from the end of the first read to the end of the file, none past it.
  const uint64_t blocks =
      (want.size() - 100000 + Prefetcher::kBlockBytes - 1) / Prefetcher::kBlockBytes;
  EXPECT_EQ(prefetcher.gathered_ahead(), blocks);
}

TEST_F(PrefetcherTest, UnalignedReaderSplitsAreServedFromBlocks) {
  // A reader whose 1 MiB buffer starts 16 bytes into a page gets READs of 1 MiB - 16 bytes
  // and 16 bytes in turn; whole-block matching alone would never hit.
  Prefetcher prefetcher(tree_, 2);
  const std::string& want = data_.expected(2);
  uint64_t reads = 0;
  const std::string got =
      read_sequentially(prefetcher, data_, 2, {Prefetcher::kBlockBytes - 16, 16}, reads);
  EXPECT_TRUE(got == want) << got.size() << " bytes, want " << want.size();
  EXPECT_EQ(prefetcher.hits(), reads - 1);
}

TEST_F(PrefetcherTest, RandomReadsAreNotReadAhead) {
  Prefetcher prefetcher(tree_, 1);
  const std::string& want = data_.expected(2);
  const auto stream = prefetcher.open(ino_of(2));
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<uint64_t> off_of(1, want.size() - 1);
  ReplyBuffer buf;
  for (int i = 0; i < 50; ++i) {
    const uint64_t off = off_of(rng);
    size_t got = 0;
    ASSERT_EQ(prefetch_read(prefetcher, *stream, off, 4096, buf, got), 0);
    prefetcher.start(*stream);
    ASSERT_EQ(std::string(buf.data(), got), want.substr(off, 4096)) << off;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(prefetcher.gathered_ahead(), 0u);
  EXPECT_EQ(prefetcher.hits(), 0u);
}

TEST_F(PrefetcherTest, SourceChangedAfterReadAheadFailsTheRead) {
  Prefetcher prefetcher(tree_, 1);
  const std::string& want = data_.expected(0);  // header, source 0, source 1 from byte 5010
  const auto stream = prefetcher.open(ino_of(0));
  ReplyBuffer buf;
  size_t got = 0;
  ASSERT_EQ(prefetch_read(prefetcher, *stream, 0, 5000, buf, got), 0);
  prefetcher.start(*stream);
  ASSERT_EQ(std::string(buf.data(), got), want.substr(0, 5000));
  // The block from 5000 to the end of the file, gathered from the old source 1.
  ASSERT_TRUE(wait_gathered(prefetcher, 1));
  data_.change_source(1);
  EXPECT_EQ(prefetch_read(prefetcher, *stream, 5000, 5000, buf, got), EIO);
  EXPECT_EQ(prefetcher.hits(), 0u);
}

TEST_F(PrefetcherTest, BlocksAreCheckedAgainstTheSourcesTheyWereReadFrom) {
  Prefetcher prefetcher(tree_, 1);
  // Rank 5: 3 MiB of source 2 (less 100 bytes) after a header, then 10,000 bytes of source 0.
  const std::string& want = data_.expected(2);
  const uint64_t block = Prefetcher::kBlockBytes;
  ASSERT_GT(want.size(), 3 * block);
  const auto stream = prefetcher.open(ino_of(2));
  ReplyBuffer buf;
  size_t got = 0;
  ASSERT_EQ(prefetch_read(prefetcher, *stream, 0, block, buf, got), 0);
  prefetcher.start(*stream);
  ASSERT_TRUE(wait_gathered(prefetcher, 3));  // the blocks at 1, 2 and 3 MiB, from the old bytes
  data_.change_source(0);
  // The block at 1 MiB holds bytes of source 2 alone: still what was mounted.
  ASSERT_EQ(prefetch_read(prefetcher, *stream, block, block, buf, got), 0);
  prefetcher.start(*stream);
  EXPECT_TRUE(std::string(buf.data(), got) == want.substr(block, block));
  EXPECT_EQ(prefetcher.hits(), 1u);
  // The block at 2 MiB ends with source 0's first 100 bytes, gathered before it changed.
  EXPECT_EQ(prefetch_read(prefetcher, *stream, 2 * block, block, buf, got), EIO);
  EXPECT_EQ(prefetcher.hits(), 1u);
}

TEST_F(PrefetcherTest, ConcurrentStreamsAllMatch) {
  Prefetcher prefetcher(tree_, 2);
  std::vector<std::thread> readers;
  std::atomic<int> mismatches{0};
  for (int r = 0; r < 4; ++r) {
    readers.emplace_back([&, r] {
      const size_t chunk = 4096 + 30000 * r;
      for (size_t t = 0; t < data_.targets(); ++t) {
        const auto stream = prefetcher.open(ino_of(t));
        const std::string& want = data_.expected(t);
        std::string all;
        ReplyBuffer buf;
        for (uint64_t off = 0; off < want.size(); off += chunk) {
          size_t got = 0;
          if (prefetch_read(prefetcher, *stream, off, chunk, buf, got) != 0) ++mismatches;
          prefetcher.start(*stream);
          all.append(buf.data(), got);
        }
        if (all != want) ++mismatches;
      }
    });
  }
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST_F(PrefetcherTest, StopsWithBlocksQueuedAndStreamsStillOpen) {
  std::shared_ptr<Prefetcher::Stream> stream;
  {
    Prefetcher prefetcher(tree_, 1);
    stream = prefetcher.open(ino_of(2));
    ReplyBuffer buf;
    size_t got = 0;
    for (uint64_t off = 0; off < (1u << 20); off += 65536) {
      ASSERT_EQ(prefetch_read(prefetcher, *stream, off, 65536, buf, got), 0);
      prefetcher.start(*stream);
    }
  }  // joins its helpers; must not hang or touch the stream afterwards
  EXPECT_EQ(stream.use_count(), 1);  // no job outlived the prefetcher
}

TEST_F(PrefetcherTest, FilesReadToTheEndAndKeptOpenHoldNoBlocks) {
  // Each stream reading ahead holds up to three 1 MiB blocks, halves of huge pages; a loader
  // that keeps its files open after reading them must not keep those.
  Prefetcher prefetcher(tree_, 2);
  const size_t before = detail::huge_pages_mapped();
  std::vector<std::shared_ptr<Prefetcher::Stream>> open;
  for (int i = 0; i < 4; ++i) {
    open.push_back(prefetcher.open(ino_of(2)));  // ~3 MiB: three blocks read ahead
    ReplyBuffer buf;
    size_t got = 0;
    for (uint64_t off = 0; off < data_.expected(2).size(); off += got) {
      settle(prefetcher);
      ASSERT_EQ(prefetch_read(prefetcher, *open.back(), off, 300000, buf, got), 0);
      prefetcher.start(*open.back());
      ASSERT_GT(got, 0u);
    }
  }
  settle(prefetcher);
  EXPECT_GT(prefetcher.hits(), 0u);
  EXPECT_EQ(prefetcher.blocks_held(), 0u);
  // No more empty pages than the pool keeps stay mapped for the next buffers.
  EXPECT_LE(detail::huge_pages_mapped(), std::max(before, detail::kKeptEmptyPages));
}

// Reads `reads` blocks of `block` bytes from the start of `stream`, letting the helpers catch up
// before each (a read right after another stream's waits: the CPUs are busy), and checks them.
void read_blocks(Prefetcher& prefetcher, Prefetcher::Stream& stream, const std::string& want,
                 size_t block, size_t reads) {
  ReplyBuffer buf;
  for (size_t i = 0; i < reads; ++i) {
    settle(prefetcher);
    size_t got = 0;
    ASSERT_EQ(prefetch_read(prefetcher, stream, i * block, block, buf, got), 0);
    prefetcher.start(stream);
    ASSERT_EQ(got, block);
    ASSERT_TRUE(std::string(buf.data(), got) == want.substr(i * block, block)) << i;
  }
}

TEST_F(PrefetcherTest, HalfReadStreamsHoldNoMoreThanTheBudget) {
  // 64 KiB blocks, 8 of them for all streams: each stream reading ahead wants 3.
  constexpr size_t kBlock = 64 << 10;
  constexpr size_t kMaxBlocks = 8;
  Prefetcher prefetcher(tree_, 2, kBlock, nullptr, kMaxBlocks * kBlock);
  ASSERT_EQ(prefetcher.max_blocks(), kMaxBlocks);
  const std::string& want = data_.expected(2);  // ~3 MiB: 48 blocks
  std::vector<std::shared_ptr<Prefetcher::Stream>> open;
  for (int i = 0; i < 12; ++i) {  // each read part-way and kept open
    open.push_back(prefetcher.open(ino_of(2)));
    read_blocks(prefetcher, *open.back(), want, kBlock, 6);
    settle(prefetcher);
    EXPECT_LE(prefetcher.blocks_held(), kMaxBlocks) << "after stream " << i;
  }
  EXPECT_GE(prefetcher.blocks_held(), 3u);  // at least the last stream's
  // Past the budget from the fourth stream on, and each one still read ahead: it took the
  // blocks of the streams read before it.
  EXPECT_GT(prefetcher.blocks_taken_back(), 0u);
  const uint64_t hits = prefetcher.hits();
  auto late = prefetcher.open(ino_of(2));
  read_blocks(prefetcher, *late, want, kBlock, 10);
  EXPECT_EQ(prefetcher.hits() - hits, 9u) << "every read but the first from a block read ahead";
  EXPECT_LE(prefetcher.blocks_held(), kMaxBlocks);
  // A stream whose blocks were taken back reads on, gathering for itself, then ahead again.
  {
    ReplyBuffer buf;
    std::string rest;
    const auto& first = open.front();
    for (uint64_t off = 6 * kBlock; off < want.size();) {
      settle(prefetcher);
      size_t got = 0;
      ASSERT_EQ(prefetch_read(prefetcher, *first, off, kBlock, buf, got), 0);
      prefetcher.start(*first);
      ASSERT_GT(got, 0u);
      rest.append(buf.data(), got);
      off += got;
    }
    EXPECT_TRUE(rest == want.substr(6 * kBlock));
  }
  // Streams that go give their blocks back.
  open.clear();
  late.reset();
  settle(prefetcher);
  EXPECT_EQ(prefetcher.blocks_held(), 0u);
}

TEST_F(PrefetcherTest, BudgetBelowOneBlockReadsNothingAhead) {
  Prefetcher prefetcher(tree_, 1, 64 << 10, nullptr, (64 << 10) - 1);
  EXPECT_EQ(prefetcher.max_blocks(), 0u);
  uint64_t reads = 0;
  const std::string got = read_sequentially(prefetcher, data_, 2, {64 << 10}, reads);
  EXPECT_TRUE(got == data_.expected(2));
  EXPECT_EQ(prefetcher.gathered_ahead(), 0u);
  EXPECT_EQ(prefetcher.blocks_held(), 0u);
}

TEST_F(PrefetcherTest, ConcurrentStreamsPastTheBudgetAllMatch) {
  // Four readers, each opening one stream after another and reading it part-way, with room
  // for fewer blocks than they want: streams take blocks back from each other while helpers
  // fill them (the TSan stage runs this).
  constexpr size_t kBlock = 16 << 10;
  Prefetcher prefetcher(tree_, 2, kBlock, nullptr, 5 * kBlock);
  std::vector<std::thread> readers;
  std::atomic<int> mismatches{0};
  const std::string& want = data_.expected(2);
  for (int r = 0; r < 4; ++r) {
    readers.emplace_back([&, r] {
      const size_t chunk = kBlock - 100 * r;
      std::vector<std::shared_ptr<Prefetcher::Stream>> kept;
      for (int n = 0; n < 6; ++n) {
        kept.push_back(prefetcher.open(ino_of(2)));
        Prefetcher::Stream& stream = *kept.back();
        ReplyBuffer buf;
        for (uint64_t off = 0; off < want.size() / 4; off += chunk) {
          size_t got = 0;
          if (prefetch_read(prefetcher, stream, off, chunk, buf, got) != 0 ||
              std::string_view(buf.data(), got) != std::string_view(want).substr(off, chunk))
            ++mismatches;
          prefetcher.start(stream);
          if (off % (8 * chunk) == 0) std::this_thread::sleep_for(std::chrono::milliseconds(3));
        }
      }
    });
  }
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(mismatches.load(), 0);
  settle(prefetcher);
  EXPECT_LE(prefetcher.blocks_held(), prefetcher.max_blocks());
}

TEST_F(PrefetcherTest, OpenRefusesNonFiles) {
  Prefetcher prefetcher(tree_, 1);
  EXPECT_EQ(prefetcher.open(Tree::kRootIno), nullptr);
  EXPECT_EQ(prefetcher.open(2), nullptr);
  EXPECT_EQ(prefetcher.open(99), nullptr);
}

}  // namespace
}  // namespace ckptfs::fs
