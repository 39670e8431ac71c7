// Which checkpoint of each rank is served: the --step rules and their refusals.
#include "ckptfs/source/step_choice.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ckptfs/error.h"
#include "support/test_support.h"

namespace ckptfs::source {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::Pair;

class StepChoiceTest : public ::testing::Test {
 protected:
  void files(const std::vector<std::string>& relative) {
    for (const std::string& r : relative) testsupport::write_file(root_ / r, "x");
  }
  // rank_<r>/net-<e>_<s>.ckpt for every rank and every epoch in [first, last].
  void epochs(int ranks, int first, int last, int step = 100) {
    for (int r = 0; r < ranks; ++r)
      for (int e = first; e <= last; ++e)
        files({fmt::format("rank_{}/net-{}_{}.ckpt", r, e, step)});
  }
  Choice pick(const std::string& step = "latest", bool mixed = false) {
    return choose(list_sources(root_), StepRequest::parse(step, mixed));
  }
  std::string refusal(const std::string& step = "latest", bool mixed = false) {
    try {
      pick(step, mixed);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  }
  fs::path at(const std::string& relative) const { return root_ / relative; }

  testsupport::TempDir tmp_{"ckptfs-steps"};
  fs::path root_ = tmp_.path();
};

TEST(StepKeyTest, NamesGiveTheirLastTwoIntegers) {
  // Through the listing, the only way names become candidates.
  testsupport::TempDir tmp("ckptfs-stepkey");
  for (const char* name : {"net-10_100.ckpt", "net_rank_3-2_7.ckpt", "net-4_5_breakpoint.ckpt",
                           "checkpoint_3.ckpt", "llama2_13b_rank0.ckpt", "model.ckpt"})
    testsupport::write_file(tmp.path() / "rank_0" / name, "x");
  const Listing l = list_sources(tmp.path());
  std::map<std::string, Candidate> by_name;
  for (const Candidate& c : l.ranks.at(0).candidates) by_name[c.name] = c;
  EXPECT_EQ(by_name["net-10_100.ckpt"].step, (StepKey{10, 100}));
  EXPECT_EQ(by_name["net_rank_3-2_7.ckpt"].step, (StepKey{2, 7}));
  EXPECT_EQ(by_name["net-4_5_breakpoint.ckpt"].step, (StepKey{4, 5}));
  EXPECT_TRUE(by_name["net-4_5_breakpoint.ckpt"].breakpoint);
  EXPECT_FALSE(by_name["checkpoint_3.ckpt"].step);
  EXPECT_FALSE(by_name["llama2_13b_rank0.ckpt"].step);
  EXPECT_FALSE(by_name["model.ckpt"].step);
}

TEST_F(StepChoiceTest, TwelveSavesServeTheTwelfthNotTheNinth) {
  epochs(2, 1, 12, 2);
  const Choice c = pick();
  EXPECT_THAT(c.files, ElementsAre(Pair(0, at("rank_0/net-12_2.ckpt")),
                                   Pair(1, at("rank_1/net-12_2.ckpt"))));
  EXPECT_EQ(c.step, (StepKey{12, 2}));
  EXPECT_EQ(c.summary, "epoch 12 step 2 on all 2 ranks; 11 older checkpoints ignored");
}

TEST_F(StepChoiceTest, NewestStepMissingOnARankIsNotServed) {
  epochs(8, 1, 9);
  for (int r = 0; r < 8; ++r)
    if (r != 3) files({fmt::format("rank_{}/net-10_100.ckpt", r)});
  const Choice c = pick();
  EXPECT_EQ(c.files.at(3), at("rank_3/net-9_100.ckpt"));
  EXPECT_EQ(c.files.at(5), at("rank_5/net-9_100.ckpt"));
  EXPECT_EQ(c.summary,
            "epoch 9 step 100 on all 8 ranks; 8 older checkpoints ignored; epoch 10 step 100 is "
            "not on every rank (missing on rank_3), not served");
}

TEST_F(StepChoiceTest, BreakpointsOnlyWhenAsked) {
  epochs(4, 1, 9);
  files({"rank_3/net-9_100_breakpoint.ckpt"});
  const Choice c = pick();
  EXPECT_EQ(c.files.at(3), at("rank_3/net-9_100.ckpt"));
  EXPECT_EQ(c.summary,
            "epoch 9 step 100 on all 4 ranks; 8 older checkpoints ignored; 1 breakpoint checkpoint "
            "ignored (on rank_3 only)");
  EXPECT_EQ(refusal("breakpoint"),
            root_.string() +
                ": --step breakpoint: no matching file on rank_0, rank_1, rank_2 (1 of 4 ranks "
                "have one)");
  files({"rank_0/net-9_100_breakpoint.ckpt", "rank_1/net-9_100_breakpoint.ckpt",
         "rank_2/net-9_100_breakpoint.ckpt"});
  // One breakpoint save on every rank is one checkpoint, counted as the older steps are (not
  // as 4 files beside 8 checkpoints).
  EXPECT_EQ(pick().summary,
            "epoch 9 step 100 on all 4 ranks; 8 older checkpoints ignored; 1 breakpoint checkpoint "
            "ignored (--step breakpoint serves it)");
  const Choice b = pick("breakpoint");
  EXPECT_EQ(b.files.at(2), at("rank_2/net-9_100_breakpoint.ckpt"));
  EXPECT_EQ(b.summary.substr(0, 50), "epoch 9 step 100 on all 4 ranks (--step breakpoint");
}

TEST_F(StepChoiceTest, ExactStep) {
  epochs(2, 1, 10);
  const Choice c = pick("9_100");
  EXPECT_EQ(c.files.at(1), at("rank_1/net-9_100.ckpt"));
  EXPECT_EQ(c.summary,
            "epoch 9 step 100 on all 2 ranks (--step 9_100); 8 older checkpoints ignored; 1 "
            "newer checkpoint ignored");
}

TEST_F(StepChoiceTest, ExactStepMissingOnARankIsRefused) {
  epochs(2, 1, 3);
  files({"rank_0/net-4_100.ckpt"});
  EXPECT_EQ(refusal("4_100"), root_.string() +
                                  ": --step 4_100: rank_1 has no epoch 4 step 100 checkpoint; "
                                  "steps saved on every rank: 3_100, 2_100, 1_100");
}

TEST_F(StepChoiceTest, RanksWithoutACommonStepAreRefusedNamingThem) {
  files({"rank_0/net-1_100.ckpt", "rank_0/net-2_100.ckpt", "rank_1/net-3_100.ckpt",
         "rank_1/net-4_100.ckpt"});
  EXPECT_EQ(refusal(),
            root_.string() +
                ": no step is saved on every rank (newest of each: epoch 2 step 100 on rank_0 "
                "(rank_0/net-2_100.ckpt); epoch 4 step 100 on rank_1 (rank_1/net-4_100.ckpt)); "
                "choose one with --step EPOCH_STEP, or name the files with --step FILE-GLOB "
                "--allow-mixed-steps");
}

TEST_F(StepChoiceTest, SingleFilesOfDifferentStepsAreRefused) {
  files({"rank_0/net-2_100.ckpt", "rank_1/net-1_100.ckpt"});
  EXPECT_EQ(refusal(),
            root_.string() +
                ": the one checkpoint of each rank would mix steps across ranks: epoch 2 step "
                "100 on rank_0 (rank_0/net-2_100.ckpt); epoch 1 step 100 on rank_1 "
                "(rank_1/net-1_100.ckpt); choose one step with --step EPOCH_STEP, or name the "
                "files with --step FILE-GLOB --allow-mixed-steps");
}

TEST_F(StepChoiceTest, GlobNamesFilesAndMixingNeedsConsent) {
  files({"rank_0/net-2_100.ckpt", "rank_0/best-0.ckpt", "rank_1/net-1_100.ckpt",
         "rank_1/best-1.ckpt"});
  const Choice best = pick("best-*.ckpt");
  EXPECT_EQ(best.files.at(1), at("rank_1/best-1.ckpt"));
  EXPECT_FALSE(best.mixed_allowed);
  EXPECT_EQ(refusal("net-*"),
            root_.string() +
                ": --step 'net-*' would mix steps across ranks: epoch 2 step 100 on rank_0 "
                "(rank_0/net-2_100.ckpt); epoch 1 step 100 on rank_1 (rank_1/net-1_100.ckpt); "
                "choose one step with --step EPOCH_STEP, or name the files with --step "
                "FILE-GLOB --allow-mixed-steps");
  const Choice mixed = pick("net-*", true);
  EXPECT_TRUE(mixed.mixed_allowed);
  EXPECT_EQ(mixed.files.at(0), at("rank_0/net-2_100.ckpt"));
  EXPECT_EQ(mixed.files.at(1), at("rank_1/net-1_100.ckpt"));
}

TEST_F(StepChoiceTest, AllowMixedOnlyWithAGlob) {
  EXPECT_THROW(StepRequest::parse("latest", true), Error);
  EXPECT_THROW(StepRequest::parse("3_4", true), Error);
  EXPECT_THROW(StepRequest::parse("", false), Error);
  EXPECT_EQ(StepRequest::parse("3_4", false).kind, StepRequest::Kind::Exact);
  EXPECT_EQ(StepRequest::parse("3_4x", false).kind, StepRequest::Kind::Glob);
}

TEST_F(StepChoiceTest, TwoFilesOfTheChosenStepOnOneRankAreRefused) {
  files({"rank_0/net-1_1.ckpt", "rank_0/net_1-1_1.ckpt"});
  EXPECT_EQ(refusal(), (root_ / "rank_0").string() +
                           ": net-1_1.ckpt and net_1-1_1.ckpt are both epoch 1 step 1; name one "
                           "with --step FILE-GLOB");
}

TEST_F(StepChoiceTest, NamesWithoutStepsTakeTheLastByNumericOrder) {
  files({"rank_0/model-9.ckpt", "rank_0/model-12.ckpt", "rank_1/checkpoint_1.ckpt"});
  const Choice c = pick();
  EXPECT_EQ(c.files.at(0), at("rank_0/model-12.ckpt"));
  EXPECT_EQ(c.files.at(1), at("rank_1/checkpoint_1.ckpt"));
  EXPECT_FALSE(c.step);
}

TEST_F(StepChoiceTest, CompleteStepsAreThoseOnEveryRank) {
  epochs(2, 1, 3);
  files({"rank_0/net-4_100.ckpt", "rank_1/net-3_100_breakpoint.ckpt"});
  const auto steps = complete_steps(list_sources(root_));
  std::vector<std::string> keys;
  for (const auto& [key, files] : steps) keys.push_back(key.str());
  EXPECT_THAT(keys, ElementsAre("1_100", "2_100", "3_100"));
  EXPECT_EQ(steps.at(StepKey{3, 100}).at(1), at("rank_1/net-3_100.ckpt"));
}

}  // namespace
}  // namespace ckptfs::source
