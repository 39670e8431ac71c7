// fetch_cost on files built by hand, whose block counts are known from their layout: runs of
// 500 bytes every 300 KiB (one 4 KiB block each, every 1 MiB block of the source), a run at a
// source's end (its last block cut at the size), a run across a block seam, header bytes (never
// counted), and two files reading the same blocks (fetched once).
#include "ckptfs/plan/fetch_cost.h"

#include <gtest/gtest.h>

#include <vector>

namespace ckptfs::plan {
namespace {

constexpr uint64_t kKiB = 1024, kMiB = 1024 * 1024;

TEST(FetchCost, BlocksTouchedByLayoutsOfKnownShape) {
  VirtualFile::Builder b;
  b.add_bytes("a header the sources do not hold");
  for (uint64_t k = 0; k < 34; ++k) b.add_source_range(0, k * 300 * kKiB, 500);
  b.add_source_range(1, 4000, 1000);  // source 1 is 5,000 bytes: up to its end
  b.add_source_range(2, 4000, 200);   // across the 4 KiB seam at 4,096
  const VirtualFile file = b.finish();

  std::vector<std::vector<plan::Run>> runs;
  collect_runs(file, runs);
  const std::vector<uint64_t> sizes = {10 * kMiB, 5000, kMiB};
  const std::vector<SourceCost> cost = fetch_cost(runs, sizes, kCostBlocks);
  ASSERT_EQ(cost.size(), 3u);

  // Source 0: 300 KiB is 75 blocks of 4 KiB, so each run sits at the start of its own block;
  // runs 300 KiB apart touch every 1 MiB block of the 10 MiB, and both 8 MiB blocks (the second
  // cut at 10 MiB).
  EXPECT_EQ(cost[0].source, 0u);
  EXPECT_EQ(cost[0].need, 34u * 500);
  EXPECT_EQ(cost[0].fetched, (std::vector<uint64_t>{34 * 4 * kKiB, 10 * kMiB, 10 * kMiB}));
  // Source 1: blocks [0, 4096) and [4096, 5000).
  EXPECT_EQ(cost[1].need, 1000u);
  EXPECT_EQ(cost[1].fetched, (std::vector<uint64_t>{5000, 5000, 5000}));
  // Source 2: two 4 KiB blocks; one 1 MiB block, the whole source, as is its only 8 MiB block.
  EXPECT_EQ(cost[2].need, 200u);
  EXPECT_EQ(cost[2].fetched, (std::vector<uint64_t>{8 * kKiB, kMiB, kMiB}));
}

TEST(FetchCost, FilesReadingTheSameBlocksFetchThemOnce) {
  VirtualFile::Builder a, b;
  a.add_source_range(0, 0, 100);
  b.add_source_range(0, 200, 100);  // same 4 KiB block as a's
  b.add_source_range(0, 8192, 10);  // a third 4 KiB block
  const VirtualFile fa = a.finish(), fb = b.finish();
  std::vector<std::vector<plan::Run>> runs;
  collect_runs(fa, runs);
  collect_runs(fb, runs);
  const std::vector<uint64_t> sizes = {kMiB};
  const uint64_t blocks[] = {4 * kKiB};
  const std::vector<SourceCost> cost = fetch_cost(runs, sizes, blocks);
  ASSERT_EQ(cost.size(), 1u);
  EXPECT_EQ(cost[0].need, 210u);
  EXPECT_EQ(cost[0].fetched, std::vector<uint64_t>{8 * kKiB});
}

}  // namespace
}  // namespace ckptfs::plan
