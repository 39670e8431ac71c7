#include "../../src/fs/remote_runs.h"

#include <gtest/gtest.h>

namespace ckptfs::fs {
namespace {

plan::Run run(uint32_t source, uint64_t offset, uint64_t length) {
  plan::Run r{};
  r.source = source;
  r.offset = offset;
  r.length = length;
  return r;
}

TEST(MergeRuns, NeighboursMergeAndFarRunsDoNot) {
  // Target order is not file order: runs of two objects, interleaved and out of order.
  const std::vector<plan::Run> runs = {run(1, 10000, 500), run(0, 0, 4096),      run(0, 4096, 4096),
                                       run(1, 0, 500),     run(0, 1 << 20, 100), run(1, 600, 500)};
  std::vector<uint32_t> order = {0, 1, 2, 3, 4, 5};
  const std::vector<MergedRange> m = merge_runs(runs, order);
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0].source, 0u);
  EXPECT_EQ(m[0].begin, 0u);
  EXPECT_EQ(m[0].end, 8192u);
  EXPECT_EQ(m[0].count, 2u);
  EXPECT_EQ(m[1].begin, 1u << 20);  // 1 MiB away from 8 KiB of runs: its own GET
  EXPECT_EQ(m[2].source, 1u);
  EXPECT_EQ(m[2].begin, 0u);
  EXPECT_EQ(m[2].end, 1100u);  // a 100-byte gap: within the slack
  EXPECT_EQ(m[3].begin, 10000u);
}

TEST(MergeRuns, FetchedBytesStayWithinAnEighthOverNeeded) {
  // 500-byte runs 1,000 bytes apart (a column split): merging would fetch 3x what is needed.
  std::vector<plan::Run> runs;
  for (uint64_t i = 0; i < 1000; ++i) runs.push_back(run(0, i * 1500, 500));
  std::vector<uint32_t> order(runs.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  uint64_t fetched = 0;
  for (const MergedRange& m : merge_runs(runs, order)) fetched += m.end - m.begin;
  EXPECT_LE(fetched, 500u * 1000 * 9 / 8);
  // Tiny runs with gaps of the slack: the slack is paid once per range, not per gap.
  runs.clear();
  for (uint64_t i = 0; i < 1000; ++i) runs.push_back(run(0, i * 612, 100));
  fetched = 0;
  for (const MergedRange& m : merge_runs(runs, order)) fetched += m.end - m.begin;
  EXPECT_LE(fetched, 100u * 1000 * 9 / 8 + 612u * 1000 / 2);
}

}  // namespace
}  // namespace ckptfs::fs
