// `ckptfs strategy new`, run as a user would: rule order as written on the command line, a
// shapes file as the source, the summary, and refusals as one line with a non-zero exit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "support/test_support.h"

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Result = ckptfs::testsupport::CommandResult;

Result run(const std::string& args) {
  return ckptfs::testsupport::run_command(std::string(CKPTFS_BINARY) + " " + args + " 2>&1");
}

class StrategyNew : public ::testing::Test {
 protected:
  void SetUp() override {
    ckptfs::testsupport::write_file(shapes_, R"({"a.weight": [8, 6], "b.weight": [6, 8],
                                                 "norm": [6], "step": []})");
  }
  // The tensor map `strategy show --json` gives for `name` in `file`.
  nlohmann::json map_of(const fs::path& file, const std::string& name) {
    const Result r = run("strategy show --json " + file.string());
    EXPECT_EQ(r.status, 0) << r.out;
    const nlohmann::json doc = nlohmann::json::parse(r.out);
    for (const auto& p : doc["params"])
      if (p["name"] == name) return p["tensor_map"];
    return nullptr;
  }

  ckptfs::testsupport::TempDir tmp_{"ckptfs_strategy_new"};
  fs::path shapes_ = tmp_.path() / "shapes.json";
  fs::path out_ = tmp_.path() / "out.ckpt";
};

TEST_F(StrategyNew, RulesApplyInCommandLineOrderAcrossOptions) {
  // --replicate before --split: the replicate decides for a.weight.
  Result r = run("strategy new " + shapes_.string() +
                 " --devices 2 --replicate 'a\\..*' --split '.*weight=0' -o " + out_.string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(map_of(out_, "a.weight"), nlohmann::json::parse("[-1,-1]"));
  EXPECT_EQ(map_of(out_, "b.weight"), nlohmann::json::parse("[0,-1]"));
  // The same rules the other way round: the split decides for both.
  r = run("strategy new " + shapes_.string() +
          " --devices 2 --split '.*weight=0' --replicate 'a\\..*' -o " + out_.string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(map_of(out_, "a.weight"), nlohmann::json::parse("[0,-1]"));
  // Two values after one option are two rules, in that place.
  r = run("strategy new " + shapes_.string() +
          " --devices 2 --replicate 'a\\..*' 'b\\..*' --split '.*=0' -o " + out_.string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(map_of(out_, "a.weight"), nlohmann::json::parse("[-1,-1]"));
  EXPECT_EQ(map_of(out_, "b.weight"), nlohmann::json::parse("[-1,-1]"));
  EXPECT_EQ(map_of(out_, "norm"), nlohmann::json::parse("[0]"));
}

TEST_F(StrategyNew, SummarySaysWhatEachRuleMatched) {
  const Result r = run("strategy new " + shapes_.string() +
                       " --devices 2 --split 'a\\.weight=0' --split 'b\\.weight=-1' "
                       "--split 'typo=0' -o " +
                       out_.string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr(out_.string() + ": 3 tensors on 2 devices (2 split, 1 replicated)"));
  EXPECT_THAT(r.out, HasSubstr("--split 'a\\.weight=0': 1 tensor\n"));
  EXPECT_THAT(r.out, HasSubstr("--split 'typo=0': 0 tensors\n"));
  EXPECT_THAT(r.out, HasSubstr("warning: --split 'typo=0' matches no tensor"));
  EXPECT_THAT(r.out, HasSubstr("no rule (--default replicate): 1 tensor\n"));
  EXPECT_THAT(r.out, HasSubstr("no layout (scalars, strings: whole on every rank): 1 entry"));
  EXPECT_EQ(map_of(out_, "b.weight"), nlohmann::json::parse("[-1,0]"));
  EXPECT_EQ(map_of(out_, "step"), nullptr);  // a scalar gets no layout
}

TEST_F(StrategyNew, RefusalsAreOneLine) {
  const auto refused = [&](const std::string& args, const std::string& line) {
    const Result r = run("strategy new " + args + " -o " + out_.string());
    EXPECT_NE(r.status, 0) << args;
    EXPECT_EQ(r.out, "ckptfs: " + line + "\n") << args;
    EXPECT_FALSE(fs::exists(out_)) << args;
  };
  refused(shapes_.string() + " --devices 4 --split 'b.*=0'",
          "tensor \"b.weight\" (shape [6,8]): --split 'b.*=0' splits dimension 0 of size 6, "
          "which does not divide by 4 devices; put a rule for it first (--replicate or another "
          "--split)");
  refused(shapes_.string() + " --devices 2 --split 'a.*=0' --default error",
          "tensor \"b.weight\" (shape [6,8]) matches no rule; add a --split or --replicate rule "
          "for it, or --default replicate");
  refused(shapes_.string() + " --devices 2 --split 'a.*'",
          "--split 'a.*': expected REGEX=DIM, a pattern and a dimension (negative: from the "
          "end), e.g. --split '.*\\.wq\\.weight=0'");
  refused(shapes_.string() + " --devices 2 --default keep",
          "--default keep: expected replicate or error");
  // Rules are refused before the source is read.
  refused("/nonexistent --devices 0", "--devices 0: expected 1 to 65536");
  refused(shapes_.string() + " --devices 2 --src-strategy " + out_.string(),
          shapes_.string() + ": a shapes file gives global shapes already; omit --src-strategy");
  ckptfs::testsupport::write_file(shapes_, R"({"w": [2, "x"]})");
  refused(shapes_.string() + " --devices 2",
          shapes_.string() +
              ": tensor \"w\": the shape is not an integer (expected a list of "
              "sizes)");
  ckptfs::testsupport::write_file(shapes_, R"([1])");
  refused(shapes_.string() + " --devices 2",
          shapes_.string() +
              ": expected a JSON object of tensor name -> shape, e.g. {\"w\": "
              "[1024, 512]}");
}

}  // namespace
