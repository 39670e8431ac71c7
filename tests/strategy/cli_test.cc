// `ckptfs strategy show` and `ckptfs ranks`, run as a user would.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strategy.pb.h"
#include "support/test_support.h"

namespace {

namespace fs = std::filesystem;
namespace pb = mindspore::straspb;
using ::testing::HasSubstr;

const fs::path kRealStrategy = fs::path(CKPTFS_TEST_DATA) /
                               "fixtures/real/strategy/"
                               "golden-stick_llama2-13b-2p_ckpt_strategy_rank_0.ckpt";

using Result = ckptfs::testsupport::CommandResult;

// stdout of the command; stderr is folded in with "2>&1" where a test wants it.
Result run(const std::string& args) {
  return ckptfs::testsupport::run_command(std::string(CKPTFS_BINARY) + " " + args);
}

struct Layout {
  std::string name;
  std::vector<uint32_t> dev;
  std::vector<std::vector<int32_t>> maps;
  int32_t step = 0, size = 0;
};

void write_strategy(const fs::path& path, uint32_t stage, const std::vector<Layout>& layouts) {
  pb::ParallelStrategyMap map;
  map.set_current_stage(1);
  auto* op = map.add_parallel_strategy_item();
  op->set_node_name("MatMul_x");
  op->mutable_parallel_strategys()->set_stage(stage);
  for (const Layout& layout : layouts) {
    auto* item = map.add_parallel_layout_item();
    item->set_param_name(layout.name);
    auto* l = item->mutable_parallel_layouts();
    auto* dev = l->add_dev_matrix();
    for (uint32_t d : layout.dev) dev->add_dim(d);
    for (const auto& m : layout.maps) {
      auto* tm = l->add_tensor_map();
      for (int32_t a : m) tm->add_dim(a);
    }
    l->add_param_split_shape();
    l->add_indices_offset();
    l->set_field(0);
    l->set_opt_weight_shard_step(layout.step);
    l->set_opt_weight_shard_size(layout.size);
  }
  std::ofstream(path, std::ios::binary) << map.SerializeAsString();
}

class Cli : public ::testing::Test {
 protected:
  ckptfs::testsupport::TempDir tmp_{"ckptfs_cli"};
  fs::path dir_ = tmp_.path();
};

TEST_F(Cli, StrategyShowJsonOnRealFile) {
  const Result r = run("strategy show --json " + kRealStrategy.string());
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json doc = nlohmann::json::parse(r.out);
  EXPECT_EQ(doc["devices_per_stage"], 2);
  EXPECT_EQ(doc["num_stages"], 1);
  ASSERT_EQ(doc["params"].size(), 363u);
  int row = 0, col = 0;
  for (const auto& p : doc["params"]) {
    EXPECT_EQ(p["stages"], nlohmann::json::array({0}));
    EXPECT_EQ(p["dev_matrix"], nlohmann::json::array({2}));
    EXPECT_EQ(p["opt_weight_shard_step"], 0);
    EXPECT_EQ(p["opt_weight_shard_size"], 0);
    if (p["tensor_map"] == nlohmann::json::array({0, -1})) ++row;
    if (p["tensor_map"] == nlohmann::json::array({-1, 0})) ++col;
    if (p["name"] == "lm_head.weight") {
      EXPECT_EQ(p["tensor_map"], nlohmann::json::array({-1, -1}));
    }
  }
  EXPECT_EQ(row, 200);
  EXPECT_EQ(col, 80);
}

TEST_F(Cli, StrategyShowTableAndMultiAxisMaps) {
  write_strategy(dir_ / "e.ckpt", 0,
                 {{"e", {2, 2, 2}, {{1, 0}, {-1}}}, {"d", {4, 2}, {{0, -1}}, 2, 4}});
  const Result table = run("strategy show " + (dir_ / "e.ckpt").string());
  ASSERT_EQ(table.status, 0) << table.out;
  EXPECT_THAT(table.out, HasSubstr("devices per stage: 8, stages: 1"));
  EXPECT_THAT(table.out, HasSubstr("[[1,0],-1]"));
  const Result json = run("strategy show --json " + (dir_ / "e.ckpt").string());
  ASSERT_EQ(json.status, 0) << json.out;
  const nlohmann::json doc = nlohmann::json::parse(json.out);
  ASSERT_EQ(doc["params"].size(), 2u);
  EXPECT_EQ(doc["params"][0]["name"], "d");
  EXPECT_EQ(doc["params"][0]["opt_weight_shard_step"], 2);
  EXPECT_EQ(doc["params"][0]["opt_weight_shard_size"], 4);
  EXPECT_EQ(doc["params"][1]["tensor_map"], nlohmann::json::parse("[[1,0],-1]"));
}

// Example G5: merged two-stage source (Example F) to four unpipelined ranks.
TEST_F(Cli, RanksOfPipelineExampleG5) {
  write_strategy(dir_ / "src.ckpt", 0, {{"0-w0", {2, 2}, {{1, -1}}}, {"1-w1", {2, 2}, {{-1, 0}}}});
  write_strategy(dir_ / "dst.ckpt", 0, {{"w0", {4}, {{0, -1}}}, {"w1", {4}, {{0, -1}}}});
  const std::string strategies = " --src-strategy " + (dir_ / "src.ckpt").string() +
                                 " --dst-strategy " + (dir_ / "dst.ckpt").string();
  EXPECT_EQ(run("ranks 1" + strategies).out, "5 4 1 0\n");
  EXPECT_EQ(run("ranks 1 --minimal" + strategies).out, "5 4 1\n");
  // G3: Example A to one unsharded checkpoint.
  write_strategy(dir_ / "a.ckpt", 0, {{"w", {2, 4}, {{1, -1}}}});
  EXPECT_EQ(run("ranks 0 --src-strategy " + (dir_ / "a.ckpt").string()).out, "4 0\n");
  EXPECT_EQ(run("ranks 0").out, "0\n");
}

TEST_F(Cli, ErrorsAreOneLineWithNonZeroStatus) {
  const Result missing = run("strategy show " + (dir_ / "absent.ckpt").string() + " 2>&1");
  EXPECT_EQ(missing.status, 1);
  EXPECT_THAT(missing.out, HasSubstr("absent.ckpt"));
  std::ofstream(dir_ / "junk.ckpt") << "not a strategy";
  const Result junk = run("ranks 0 --src-strategy " + (dir_ / "junk.ckpt").string() + " 2>&1");
  EXPECT_EQ(junk.status, 1);
  EXPECT_THAT(junk.out, HasSubstr("junk.ckpt"));
  const Result range = run("ranks 9 --src-strategy " + kRealStrategy.string() + " --dst-strategy " +
                           kRealStrategy.string() + " 2>&1");
  EXPECT_EQ(range.status, 1);
  EXPECT_THAT(range.out, HasSubstr("the view has no rank 9"));
}

TEST_F(Cli, HelpOnEachCommand) {
  for (const char* args : {"ranks --help", "strategy --help", "strategy show --help"}) {
    const Result r = run(args);
    EXPECT_EQ(r.status, 0) << args;
    EXPECT_THAT(r.out, HasSubstr("Usage")) << args;
  }
}

}  // namespace
