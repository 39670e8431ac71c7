// check_strategy_covered with the name lists index build's summaries keep across plans: a list
// found to cover a stage spares the next plan's identical files the hashing, and never hides a
// name that a file listing other names (or another strategy) lacks.
#include "ckptfs/plan/source_fit.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "ckptfs/error.h"

namespace ckptfs::plan {
namespace {

strategy::Strategy strategy_of(const std::vector<std::string>& names, int64_t devices) {
  strategy::Strategy s;
  s.origin = "strategy.json";
  s.devices_per_stage = devices;
  for (const std::string& name : names)
    s.params.emplace(name, strategy::StrategyParam{name, {{0, {}}}});
  return s;
}

scan::Param param(const std::string& name) {
  scan::Param p;
  p.name = name;
  return p;
}

// Source files of ranks 0 .. files-1, each listing `names`.
std::map<int64_t, index::IndexedSource> sources_of(const std::vector<std::string>& names,
                                                   int64_t files) {
  std::map<int64_t, index::IndexedSource> out;
  for (int64_t r = 0; r < files; ++r)
    for (const std::string& name : names) out[r].scan.params.push_back(param(name));
  return out;
}

bool refused(const std::map<int64_t, index::IndexedSource>& sources, const strategy::Strategy& src,
             CoveredNames* covered) {
  try {
    check_strategy_covered(sources, src, covered);
    return false;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("that no source file of that stage"), std::string::npos)
        << e.what();
    return true;
  }
}

TEST(CoveredNames, AListThatCoveredAStageIsKeptAndPassesTheSameFilesAgain) {
  const strategy::Strategy src = strategy_of({"a", "b", "c"}, 2);
  CoveredNames covered;
  EXPECT_FALSE(refused(sources_of({"c", "a", "b"}, 2), src, &covered));
  ASSERT_EQ(covered.src, &src);
  EXPECT_EQ(covered.by_stage.at(0), (std::vector<std::string>{"c", "a", "b"}));
  EXPECT_FALSE(refused(sources_of({"c", "a", "b"}, 1), src, &covered));
}

TEST(CoveredNames, FilesListingOtherNamesAreStillCheckedWithAKeptList) {
  const strategy::Strategy src = strategy_of({"a", "b", "c"}, 2);
  CoveredNames covered;
  EXPECT_FALSE(refused(sources_of({"a", "b", "c"}, 2), src, &covered));
  EXPECT_TRUE(refused(sources_of({"a", "b"}, 2), src, &covered));
  EXPECT_TRUE(refused(sources_of({"a", "b", "x"}, 1), src, &covered));
  // A refused check keeps nothing new.
  EXPECT_EQ(covered.by_stage.at(0), (std::vector<std::string>{"a", "b", "c"}));
}

TEST(CoveredNames, AListKeptForOneStrategyDoesNotPassAnother) {
  const strategy::Strategy first = strategy_of({"a", "b"}, 1);
  const strategy::Strategy second = strategy_of({"a", "b", "c"}, 1);
  CoveredNames covered;
  EXPECT_FALSE(refused(sources_of({"a", "b"}, 1), first, &covered));
  EXPECT_TRUE(refused(sources_of({"a", "b"}, 1), second, &covered));
}

TEST(CoveredNames, AStageWhoseFilesDifferKeepsNoList) {
  const strategy::Strategy src = strategy_of({"a", "b"}, 2);
  std::map<int64_t, index::IndexedSource> sources = sources_of({"a"}, 1);
  sources[1].scan.params.push_back(param("b"));
  CoveredNames covered;
  EXPECT_FALSE(refused(sources, src, &covered));
  EXPECT_TRUE(covered.by_stage.empty());
  // So a later plan of rank 0's file alone is checked in full.
  EXPECT_TRUE(refused(sources_of({"a"}, 1), src, &covered));
}

}  // namespace
}  // namespace ckptfs::plan
