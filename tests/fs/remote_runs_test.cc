#include "../../src/fs/remote_runs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <utility>

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

TEST(MergeRuns, SortsASubsetOfRunsBySourceThenOffset) {
  // Source 5 in offset order already, source 2 backwards, source 0 shuffled; run 3 (source 9)
  // is left out of `order`, and sources 1, 3, 4 have no runs.
  std::vector<plan::Run> runs = {run(5, 0, 10),   run(2, 900, 10), run(0, 300, 10), run(9, 0, 10),
                                 run(5, 100, 10), run(2, 500, 10), run(0, 100, 10), run(5, 200, 10),
                                 run(0, 200, 10), run(2, 100, 10)};
  std::vector<uint32_t> order = {0, 1, 2, 4, 5, 6, 7, 8, 9};
  std::vector<uint32_t> want = order;
  std::stable_sort(want.begin(), want.end(), [&](uint32_t a, uint32_t b) {
    return std::pair(runs[a].source, runs[a].offset) < std::pair(runs[b].source, runs[b].offset);
  });
  // Runs far apart: one range each, so every range names one run of `order`.
  const std::vector<MergedRange> m =
      merge_runs(runs, order, {.gap = 0, .slack = 0, .extra = 0, .max_range = 0});
  EXPECT_EQ(order, want);
  ASSERT_EQ(m.size(), order.size());
  for (size_t k = 0; k < m.size(); ++k) {
    EXPECT_EQ(m[k].first, k);
    EXPECT_EQ(m[k].source, runs[order[k]].source);
    EXPECT_EQ(m[k].begin, runs[order[k]].offset);
  }
}

std::vector<uint32_t> all(size_t n) {
  std::vector<uint32_t> order(n);
  for (uint32_t i = 0; i < n; ++i) order[i] = i;
  return order;
}

uint64_t fetched(const std::vector<MergedRange>& ranges) {
  uint64_t n = 0;
  for (const MergedRange& m : ranges) n += m.end - m.begin;
  return n;
}

// The fetch-ahead's policies: the bench layout's column split, 500-byte runs 1,500 bytes apart.
std::vector<plan::Run> column_split(uint64_t count) {
  std::vector<plan::Run> runs;
  for (uint64_t i = 0; i < count; ++i) runs.push_back(run(0, i * 2000, 500));
  return runs;
}

TEST(MergeRuns, AmplificationCapBoundsBytesFetched) {
  const std::vector<plan::Run> runs = column_split(10000);
  for (const double amplify : {1.0, 1.1, 2.0, 4.0, 8.0}) {
    std::vector<uint32_t> order = all(runs.size());
    const MergePolicy policy{
        .gap = 256 << 10, .slack = 0, .extra = amplify - 1, .max_range = 4 << 20};
    const std::vector<MergedRange> m = merge_runs(runs, order, policy);
    EXPECT_LE(fetched(m), static_cast<uint64_t>(500 * 10000 * amplify)) << amplify;
    uint64_t needed = 0;
    for (const MergedRange& r : m) needed += r.needed;
    EXPECT_EQ(needed, 500u * 10000) << amplify;
  }
  // 1x: one GET per run; 4x: every gap is worth less than a request, so one range.
  std::vector<uint32_t> order = all(runs.size());
  EXPECT_EQ(
      merge_runs(runs, order, {.gap = 256 << 10, .slack = 0, .extra = 0, .max_range = 4 << 20})
          .size(),
      10000u);
  order = all(runs.size());
  EXPECT_EQ(
      merge_runs(runs, order, {.gap = 256 << 10, .slack = 0, .extra = 3, .max_range = 4 << 20})
          .size(),
      5u);  // 20,000,000 bytes in ranges of at most 4 MiB
}

TEST(MergeRuns, GapWiderThanARequestSplits) {
  // Two runs 1 MiB apart: fetching the gap costs more than a second GET, whatever the cap.
  const std::vector<plan::Run> runs = {run(0, 0, 1000), run(0, 1 << 20, 1000),
                                       run(0, (1 << 20) + 100000, 1000)};
  std::vector<uint32_t> order = all(runs.size());
  const std::vector<MergedRange> m =
      merge_runs(runs, order, {.gap = 256 << 10, .slack = 0, .extra = 1000, .max_range = 4 << 20});
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].end, 1000u);
  EXPECT_EQ(m[1].begin, 1u << 20);
  EXPECT_EQ(m[1].end, (1u << 20) + 101000);
}

TEST(MergeRuns, LowestIsTheFirstRunTheFileNeeds) {
  // Target order: source 1's runs first, then source 0's; the ranges keep that order's index.
  const std::vector<plan::Run> runs = {run(1, 5000, 100), run(1, 0, 100), run(0, 0, 100),
                                       run(0, 200, 100)};
  std::vector<uint32_t> order = all(runs.size());
  const std::vector<MergedRange> m =
      merge_runs(runs, order, {.gap = 1 << 20, .slack = 0, .extra = 1000, .max_range = 1 << 20});
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].source, 0u);
  EXPECT_EQ(m[0].lowest, 2u);
  EXPECT_EQ(m[1].source, 1u);
  EXPECT_EQ(m[1].lowest, 0u);
  EXPECT_EQ(m[1].needed, 200u);
}

// Random requests of the shapes a plan makes (overlapping runs, empty runs, runs at an object's
// last byte, offsets near 2^62, one source or thousands), under each policy the code uses: every
// run lies inside exactly one range of its own source, each range's runs are `order[first ..
// first + count)`, its `needed` is their bytes, and no run is left out or taken twice.
TEST(MergeRuns, EveryRunLiesInItsOwnRangeWhateverTheShape) {
  uint64_t seed = 12345;
  const auto next = [&seed](uint64_t bound) {
    seed = seed * 6364136223846793005u + 1442695040888963407u;
    return (seed >> 11) % bound;
  };
  const MergePolicy policies[] = {
      {}, {.gap = 0, .slack = 0, .extra = 0, .max_range = 0}, {.gap = 4096, .max_range = 1 << 16}};
  for (int round = 0; round < 300; ++round) {
    const uint32_t sources = round % 3 == 0 ? 1 : static_cast<uint32_t>(1 + next(3000));
    const uint64_t base = round % 5 == 0 ? (uint64_t{1} << 62) : 0;
    std::vector<plan::Run> runs(1 + next(2000));
    for (plan::Run& r : runs)
      r = run(static_cast<uint32_t>(next(sources)), base + next(1 << 20),
              next(4) == 0 ? 0 : 1 + next(1 << 14));
    for (const MergePolicy& policy : policies) {
      std::vector<uint32_t> order(runs.size());
      for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
      const std::vector<MergedRange> merged = merge_runs(runs, order, policy);
      std::vector<int> seen(runs.size(), 0);
      uint32_t at = 0;
      for (size_t m = 0; m < merged.size(); ++m) {
        const MergedRange& range = merged[m];
        ASSERT_EQ(range.first, at);
        ASSERT_GE(range.count, 1u);
        at += range.count;
        uint64_t needed = 0;
        for (uint32_t k = range.first; k < range.first + range.count; ++k) {
          const plan::Run& r = runs[order[k]];
          ++seen[order[k]];
          ASSERT_EQ(r.source, range.source);
          ASSERT_LE(range.begin, r.offset);
          ASSERT_LE(r.offset + r.length, range.end);
          needed += r.length;
        }
        ASSERT_EQ(needed, range.needed);
      }
      ASSERT_EQ(at, runs.size());
      ASSERT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
    }
  }
}

}  // namespace
}  // namespace ckptfs::fs
