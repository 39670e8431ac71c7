// Needed-rank rules against MindSpore's redistribution vectors (spec §4.5) and the worked
// transform examples G1–G5, plus the §4.2/§4.4 target maps.
#include "ckptfs/strategy/rank_list.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ckptfs/error.h"
#include "strategy/strategy_test_util.h"

namespace ckptfs::strategy {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Ranks = std::vector<int64_t>;
using namespace testsupport;

// A strategy as read_strategy would return it: name -> {stage -> layout}.
Strategy strategy_of(std::vector<std::tuple<std::string, uint32_t, ParamLayout>> items) {
  Strategy s;
  s.origin = "test";
  uint32_t stages = 0;
  for (auto& [name, stage, layout] : items) {
    int64_t devices = 1;
    for (int64_t d : layout.dev_matrix) devices *= d;
    s.devices_per_stage = devices;
    stages = std::max(stages, stage + 1);
    s.params[name].name = name;
    s.params[name].stages[stage] = layout;
  }
  s.num_stages = stages;
  return s;
}

struct Vector {
  ParamLayout from, to;
  int64_t target;
  Ranks needed;
};

TEST(MindSporeNeeded, RedistributionUnitTestVectors) {
  Ranks all128(128), all8(8);
  for (int64_t i = 0; i < 128; ++i) all128[i] = i;
  for (int64_t i = 0; i < 8; ++i) all8[i] = i;
  const Vector vectors[] = {
      {classic({2, 2, 2}, {2, 1, 0}), classic({8, 1, 1}, {2, 1, 0}), 1, {0, 1, 2, 3}},
      {classic({32, 1, 8}, {2, -1, 0}), classic({2, 64, 2}, {2, 1, 0}), 1, all128},
      {classic({4, 2}, {1, 0}), classic({1, 8}, {-1, -1}), 0, all8},
      {classic({8, 1}, {1, -1}), classic({1, 8}, {-1, 0}), 0, all8},
      {classic({8, 1, 8}, {2, 1, -1}), classic({8, 8, 1}, {2, 1, 0}), 0, {0}},
      {classic({1, 8}, {1, 0}), classic({1, 4, 2}, {2, 1}), 0, {0, 1}},
      {classic({8, 1}, {1, 0}), classic({2, 1, 4}, {2, 1}), 0, {0, 1, 2, 3}},
      {classic({8}, {0, -1}), classic({4, 2}, {1, -1}), 0, {0, 1}},
  };
  for (size_t i = 0; i < std::size(vectors); ++i) {
    const Vector& v = vectors[i];
    EXPECT_EQ(mindspore_needed(make(v.from), make(v.to), v.target), v.needed) << "vector " << i;
  }
}

TEST(MindSporeNeeded, SecondVectorMinimalSetIsHalf) {
  // "0..127 (minimal would be 64 ranks)".
  const Layout from = make(classic({32, 1, 8}, {2, -1, 0}));
  const Layout to = make(classic({2, 64, 2}, {2, 1, 0}));
  EXPECT_EQ(minimal_needed(from, to, 1).size(), 64u);
}

TEST(MindSporeNeeded, RefusesIncompatibleDeviceCounts) {
  EXPECT_THROW(mindspore_needed(make(classic({3}, {0})), make(classic({2}, {0})), 0), Error);
  // Suffix products {1,3,6} and {1,2,6} do not form a divisibility chain.
  EXPECT_THROW(mindspore_needed(make(classic({2, 3}, {1, -1})), make(classic({3, 2}, {1, -1})), 0),
               Error);
}

// Example A as a strategy, and the destinations of G1–G5.
const ParamLayout kExampleA = classic({2, 4}, {1, -1});

TEST(RankList, G1_ColumnSplitTarget) {
  const Strategy src = strategy_of({{"w", 0, kExampleA}});
  const Strategy dst = strategy_of({{"w", 0, classic({4}, {-1, 0})}});
  for (int64_t t = 0; t < 4; ++t) {
    EXPECT_EQ(rank_list_for_transform(&src, &dst, t), (Ranks{t + 4, t})) << t;
    // Every rank holds part of rows [0,8) x cols [2t,2t+2); the replicas read are t and t+4.
    EXPECT_EQ(minimal_needed(make(kExampleA), make(classic({4}, {-1, 0})), t).size(), 8u);
    EXPECT_EQ(rank_list_for_transform(&src, &dst, t, true), (Ranks{t + 4, t})) << t;
  }
}

TEST(RankList, G2_SupersetOfMinimal) {
  const ParamLayout from = classic({4}, {0, -1});
  const ParamLayout to = classic({2, 4}, {1, 0});
  EXPECT_THAT(minimal_needed(make(from), make(to), 5), ElementsAre(2, 3));
  EXPECT_THAT(mindspore_needed(make(from), make(to), 5), ElementsAre(0, 1, 2, 3));
  const Strategy src = strategy_of({{"w", 0, from}});
  const Strategy dst = strategy_of({{"w", 0, to}});
  EXPECT_EQ(rank_list_for_transform(&src, &dst, 5), (Ranks{3, 2, 1, 0}));
  EXPECT_EQ(rank_list_for_transform(&src, &dst, 5, true), (Ranks{3, 2}));
}

TEST(RankList, G3_UnshardedDestination) {
  const Strategy src = strategy_of({{"w", 0, kExampleA}});
  EXPECT_EQ(rank_list_for_transform(&src, nullptr, 0), (Ranks{4, 0}));
  EXPECT_EQ(rank_list_for_transform(&src, nullptr, 0, true), (Ranks{4, 0}));
  EXPECT_THROW(rank_list_for_transform(&src, nullptr, 1), Error);
}

TEST(RankList, G4_OptimizerShardedSource) {
  const Strategy src = strategy_of({{"w", 0, classic({4, 2}, {0, -1}, 2, 4)}});
  const Strategy dst = strategy_of({{"w", 0, classic({2}, {0, -1})}});
  EXPECT_EQ(rank_list_for_transform(&src, &dst, 0), (Ranks{6, 4, 2, 0}));
  EXPECT_EQ(rank_list_for_transform(&src, &dst, 1), (Ranks{7, 5, 3, 1}));
  EXPECT_EQ(rank_list_for_transform(&src, &dst, 0, true), (Ranks{6, 4, 2, 0}));
}

TEST(RankList, G5_PipelineSourceCrossProduct) {
  const Strategy src =
      strategy_of({{"w0", 0, classic({2, 2}, {1, -1})}, {"w1", 1, classic({2, 2}, {-1, 0})}});
  const Strategy dst =
      strategy_of({{"w0", 0, classic({4}, {0, -1})}, {"w1", 0, classic({4}, {0, -1})}});
  ASSERT_EQ(src.num_stages, 2u);
  const TargetMaps maps(&src, &dst, 1);
  EXPECT_THAT(mindspore_needed(maps.src_layout("w0", 2), maps.dst_layout("w0", 2), 1),
              ElementsAre(1));
  EXPECT_THAT(mindspore_needed(maps.src_layout("w1", 2), maps.dst_layout("w1", 2), 1),
              ElementsAre(0, 1));
  EXPECT_EQ(rank_list_for_transform(&src, &dst, 1), (Ranks{5, 4, 1, 0}));
  // Data: w0 row 1 from global rank 1, w1 row 1 from global ranks 4 and 5.
  EXPECT_EQ(rank_list_for_transform(&src, &dst, 1, true), (Ranks{5, 4, 1}));
}

// One memo kept across targets (and across strategy pairs, which reset it) gives every target
// the list a fresh call gives.
TEST(RankList, AMemoKeptAcrossTargetsAndStrategiesChangesNoList) {
  const Strategy pipeline =
      strategy_of({{"w0", 0, classic({2, 2}, {1, -1})}, {"w1", 1, classic({2, 2}, {-1, 0})}});
  const Strategy four =
      strategy_of({{"w0", 0, classic({4}, {0, -1})}, {"w1", 0, classic({4}, {0, -1})}});
  const Strategy two =
      strategy_of({{"w0", 0, classic({2}, {-1, 0})}, {"w1", 0, classic({2}, {0, -1})}});
  TransformMemo memo;
  for (const auto& [src, dst] : {std::pair{&pipeline, &four}, std::pair{&four, &two},
                                 std::pair{&two, &pipeline}, std::pair{&pipeline, &four}}) {
    for (int64_t t = 0; t < dst->devices_per_stage * dst->num_stages; ++t)
      for (bool minimal : {false, true})
        EXPECT_EQ(rank_list_for_transform(src, dst, t, minimal, &memo),
                  rank_list_for_transform(src, dst, t, minimal))
            << src->devices_per_stage << " -> " << dst->devices_per_stage << ", target " << t
            << (minimal ? ", minimal" : "");
  }
}

TEST(RankList, UnshardedSourceAndEmptySource) {
  const Strategy dst = strategy_of({{"w", 0, kExampleA}});
  EXPECT_EQ(rank_list_for_transform(nullptr, &dst, 6), (Ranks{0}));
  EXPECT_EQ(rank_list_for_transform(nullptr, nullptr, 0), (Ranks{0}));

  // "a" lives only in dst stage 1, so a stage-0 target removes it from the src map too.
  const Strategy src = strategy_of({{"a", 0, classic({2}, {0})}});
  const Strategy piped = strategy_of({{"b", 0, classic({2}, {0})}, {"a", 1, classic({2}, {0})}});
  try {
    rank_list_for_transform(&src, &piped, 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("The src_strategy_file is empty"));
  }
  EXPECT_EQ(rank_list_for_transform(&src, &piped, 2), (Ranks{0}));
}

TEST(RankList, ParameterErrorsNameTheParameter) {
  const Strategy src = strategy_of({{"enc.w", 0, classic({2}, {0, -1})}});
  const Strategy dst = strategy_of({{"enc.w", 0, classic({2}, {0})}});  // rank 1 vs 2
  try {
    rank_list_for_transform(&src, &dst, 0);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("enc.w"));
  }
  const Strategy three = strategy_of({{"enc.w", 0, classic({3}, {0, -1})}});
  try {
    rank_list_for_transform(&src, &three, 0);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("enc.w"));
  }
}

TEST(TargetMaps, StageAndLocalRank) {
  const Strategy dst = strategy_of({{"w", 0, classic({4}, {0})}, {"w", 1, classic({4}, {0})}});
  const TargetMaps maps(nullptr, &dst, 6);
  EXPECT_EQ(maps.dst_devices(), 4);
  EXPECT_EQ(maps.src_devices(), 1);
  EXPECT_EQ(maps.target_stage(), 1);
  EXPECT_EQ(maps.target_local(), 2);
  EXPECT_THROW(TargetMaps(nullptr, &dst, 8), Error);
  EXPECT_THROW(TargetMaps(nullptr, &dst, -1), Error);
}

TEST(TargetMaps, RolesFollowTheStageFilter) {
  // dst: "shared" in both stages, "late" only in stage 1, "dst_only" only in stage 1.
  const ParamLayout l = classic({2}, {0});
  const Strategy src = strategy_of({{"shared", 0, l}, {"late", 0, l}, {"src_only", 0, l}});
  const Strategy dst =
      strategy_of({{"shared", 0, l}, {"shared", 1, l}, {"late", 1, l}, {"dst_only", 1, l}});
  using Role = TargetMaps::Role;
  const TargetMaps stage0(&src, &dst, 0);
  EXPECT_EQ(stage0.role("shared"), Role::Reshard);
  EXPECT_EQ(stage0.role("late"), Role::Drop);
  EXPECT_EQ(stage0.role("src_only"), Role::Passthrough);
  EXPECT_EQ(stage0.role("dst_only"), Role::Passthrough);  // §4.4 7: not in src, so kept
  EXPECT_EQ(stage0.role("global_step"), Role::Passthrough);
  const TargetMaps stage1(&src, &dst, 3);
  EXPECT_EQ(stage1.role("late"), Role::Reshard);
  EXPECT_EQ(stage1.role("dst_only"), Role::Passthrough);

  const TargetMaps no_src(nullptr, &dst, 0);
  EXPECT_EQ(no_src.role("shared"), Role::Reshard);
  EXPECT_EQ(no_src.role("late"), Role::Drop);
  EXPECT_EQ(no_src.role("global_step"), Role::Passthrough);

  const TargetMaps no_dst(&src, nullptr, 0);
  EXPECT_EQ(no_dst.role("late"), Role::Reshard);
  EXPECT_EQ(no_dst.role("global_step"), Role::Passthrough);

  const TargetMaps neither(nullptr, nullptr, 0);
  EXPECT_EQ(neither.role("w"), Role::Drop);
}

TEST(TargetMaps, LayoutChoiceAcrossStages) {
  // Source: lowest stage wins. Destination: the target's own stage.
  const Strategy src =
      strategy_of({{"emb", 1, classic({4}, {-1, 0})}, {"emb", 0, classic({4}, {0, -1})}});
  const Strategy dst =
      strategy_of({{"emb", 0, classic({2}, {0, -1})}, {"emb", 1, classic({2}, {-1, 0})}});
  const TargetMaps maps(&src, &dst, 3);
  EXPECT_EQ(maps.src_layout("emb", 2), make(classic({4}, {0, -1})));
  EXPECT_EQ(maps.dst_layout("emb", 2), make(classic({2}, {-1, 0})));
  EXPECT_THAT(maps.src_stages("emb"), ElementsAre(0u, 1u));
  EXPECT_TRUE(maps.src_stages("nothing").empty());
  EXPECT_THAT(TargetMaps(nullptr, &dst, 0).src_stages("emb"), ElementsAre(0u));
  EXPECT_EQ(TargetMaps(nullptr, nullptr, 0).src_layout("x", 3), Layout::unsharded(3));
  EXPECT_THROW(maps.src_layout("missing", 2), Error);
}

}  // namespace
}  // namespace ckptfs::strategy
