// Strategy files (spec §2): the real llama2-13b file, protobuf and JSON written here, merged
// directories, and every refusal.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "ckptfs/error.h"
#include "ckptfs/strategy/strategy.h"
#include "strategy.pb.h"
#include "strategy/strategy_test_util.h"
#include "support/test_support.h"

namespace ckptfs::strategy {
namespace {

namespace fs = std::filesystem;
namespace pb = mindspore::straspb;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace testsupport;

const fs::path kRealStrategy = fs::path(CKPTFS_TEST_DATA) /
                               "fixtures/real/strategy/"
                               "golden-stick_llama2-13b-2p_ckpt_strategy_rank_0.ckpt";

// A layout item as MindSpore writes it (§2.6): one DevMatrix, classic TensorMap, one empty
// ParamSplitShape and IndicesOffset, field/step/size set.
struct Item {
  std::string name;
  std::vector<uint32_t> dev;
  std::vector<std::vector<int32_t>> maps;  // one entry = classic; several = per dimension
  int32_t step = 0, size = 0;
};

pb::ParallelStrategyMap message(uint32_t stage, const std::vector<Item>& items) {
  pb::ParallelStrategyMap map;
  map.set_current_stage(1);
  for (const Item& item : items) {
    pb::ParallelStrategyItem* op = map.add_parallel_strategy_item();
    op->set_node_name("MatMul_" + item.name);
    op->mutable_parallel_strategys()->set_stage(stage);
    op->mutable_parallel_strategys()->add_parallel_strategy()->add_dim(1);

    pb::ParallelLayoutItem* layout = map.add_parallel_layout_item();
    layout->set_param_name(item.name);
    pb::ParallelLayouts* l = layout->mutable_parallel_layouts();
    pb::DevMatrix* dev = l->add_dev_matrix();
    for (uint32_t d : item.dev) dev->add_dim(d);
    for (const auto& m : item.maps) {
      pb::TensorMap* tm = l->add_tensor_map();
      for (int32_t a : m) tm->add_dim(a);
    }
    l->add_param_split_shape();
    l->add_indices_offset();
    l->set_field(0);
    l->set_opt_weight_shard_step(item.step);
    l->set_opt_weight_shard_size(item.size);
  }
  return map;
}

class StrategyFiles : public ::testing::Test {
 protected:
  fs::path write(const std::string& name, const std::string& bytes) {
    return testsupport::write_file(dir_ / name, bytes);
  }
  fs::path write(const std::string& name, const pb::ParallelStrategyMap& map) {
    return write(name, map.SerializeAsString());
  }

  std::string error_of(const fs::path& path) {
    try {
      read_strategy(path);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  }

  testsupport::TempDir tmp_{"ckptfs_strategy"};
  fs::path dir_ = tmp_.path();
};

TEST(RealStrategy, Llama2_13bTwoDevices) {
  const Strategy s = read_strategy(kRealStrategy);
  EXPECT_EQ(s.devices_per_stage, 2);
  EXPECT_EQ(s.num_stages, 1u);
  EXPECT_EQ(s.params.size(), 363u);
  EXPECT_EQ(s.operators.size(), 363u);

  std::map<std::vector<DimAxes>, int> maps;
  for (const auto& [name, param] : s.params) {
    ASSERT_EQ(param.stages.size(), 1u) << name;
    ASSERT_TRUE(param.stages.contains(0)) << name;
    const ParamLayout& l = param.stages.at(0);
    EXPECT_EQ(l.dev_matrix, (std::vector<int64_t>{2})) << name;
    EXPECT_TRUE(l.param_split_shape.empty()) << name;
    EXPECT_TRUE(l.indices_offset.empty()) << name;
    EXPECT_TRUE(l.tensor_shape.empty()) << name;
    EXPECT_EQ(l.field, 0);
    EXPECT_EQ(l.opt_shard_step, 0);
    EXPECT_EQ(l.opt_shard_size, 0);
    ++maps[l.tensor_map];
  }
  const std::vector<DimAxes> row{{0}, {}}, col{{}, {0}}, vec{{}}, full{{}, {}};
  EXPECT_EQ(maps.size(), 4u);
  EXPECT_EQ(maps[row], 200);
  EXPECT_EQ(maps[col], 80);
  EXPECT_EQ(maps[vec], 81);
  EXPECT_EQ(maps[full], 2);

  EXPECT_EQ(s.find("lm_head.weight")->stages.at(0).tensor_map, full);
  EXPECT_EQ(s.find("model.tok_embeddings.embedding_weight")->stages.at(0).tensor_map, full);
  EXPECT_EQ(s.find("model.layers.28.attention.wo.weight")->stages.at(0).tensor_map, col);
  EXPECT_EQ(s.find("model.layers.0.attention.wq.weight")->stages.at(0).tensor_map, row);
  EXPECT_EQ(s.find("model.layers.19.ffn_norm.weight")->stages.at(0).tensor_map, vec);
  EXPECT_EQ(s.find("no.such.param"), nullptr);

  const OperatorStrategy& wo = s.operators.at("MatMul_model.layers.28.attention.wo.weight");
  EXPECT_EQ(wo.stage, 0u);
  EXPECT_EQ(wo.inputs, (std::vector<std::vector<uint32_t>>{{1, 2}, {1, 2}}));
  EXPECT_EQ(s.operators.at("RmsNorm_model.layers.19.ffn_norm.weight").inputs,
            (std::vector<std::vector<uint32_t>>{{1, 1, 1}, {1}}));
  EXPECT_EQ(s.operators.at("Gather_model.tok_embeddings.embedding_weight").inputs,
            (std::vector<std::vector<uint32_t>>{{1, 1}, {1, 1}}));
}

const char* kJsonCompact =
    R"({"current_stage":1,"parallel_layout_item":{"fc.bias":{"dev_matrix":[2,4],"field":0,)"
    R"("opt_weight_shard_size":0,"opt_weight_shard_step":0,"tensor_map":[0]},"fc.weight":)"
    R"({"dev_matrix":[2,4],"field":0,"opt_weight_shard_size":2,"opt_weight_shard_step":4,)"
    R"("tensor_map":[-1,0]}},"parallel_strategy_item":{"MatMul_fc.weight":{"parallel_strategy":)"
    R"([[2,1],[1,4]],"stage":0}}})";

const char* kJsonIndented = R"({
    "current_stage": 1,
    "parallel_strategy_item": {
        "MatMul_fc.weight": {
            "stage": 0,
            "parallel_strategy": [[2, 1], [1, 4]]
        }
    },
    "parallel_layout_item": {
        "fc.weight": {
            "dev_matrix": [2, 4],
            "tensor_map": [-1, 0],
            "field": 0,
            "opt_weight_shard_step": 4,
            "opt_weight_shard_size": 2
        },
        "fc.bias": {
            "dev_matrix": [2, 4],
            "tensor_map": [0],
            "field": 0,
            "opt_weight_shard_step": 0,
            "opt_weight_shard_size": 0
        }
    }
})";

TEST_F(StrategyFiles, ProtobufAndJsonGiveEqualStrategies) {
  pb::ParallelStrategyMap map =
      message(0, {{"fc.weight", {2, 4}, {{-1, 0}}, 4, 2}, {"fc.bias", {2, 4}, {{0}}}});
  map.mutable_parallel_strategy_item()->RemoveLast();  // one operator, as in the JSON
  map.mutable_parallel_strategy_item(0)->mutable_parallel_strategys()->clear_parallel_strategy();
  for (std::vector<uint32_t> dims : {std::vector<uint32_t>{2, 1}, {1, 4}}) {
    auto* input = map.mutable_parallel_strategy_item(0)
                      ->mutable_parallel_strategys()
                      ->add_parallel_strategy();
    for (uint32_t d : dims) input->add_dim(d);
  }
  const Strategy proto = read_strategy(write("s.ckpt", map));
  const Strategy compact = read_strategy(write("s.json", kJsonCompact));
  const Strategy indented = read_strategy(write("t.json", kJsonIndented));
  for (const Strategy* s : {&proto, &compact, &indented}) {
    EXPECT_EQ(s->devices_per_stage, 8);
    EXPECT_EQ(s->num_stages, 1u);
    EXPECT_EQ(s->params.at("fc.weight").stages.at(0), classic({2, 4}, {-1, 0}, 4, 2));
    EXPECT_EQ(s->params.at("fc.bias").stages.at(0), classic({2, 4}, {0}));
  }
  EXPECT_EQ(proto.params, compact.params);
  EXPECT_EQ(proto.params, indented.params);
  EXPECT_EQ(proto.operators, compact.operators);
  EXPECT_EQ(proto.operators, indented.operators);
  EXPECT_EQ(proto.operators.at("MatMul_fc.weight").inputs,
            (std::vector<std::vector<uint32_t>>{{2, 1}, {1, 4}}));
}

TEST_F(StrategyFiles, JsonOptionalKeys) {
  const char* text = R"({"parallel_layout_item":{"emb":{"dev_matrix":[2],"tensor_map":[0,-1],
      "tensor_shape":[10,4],"field":0,"opt_weight_shard_step":0,"opt_weight_shard_size":0,
      "param_split_shape":[6,4],"indices_offset":[0,6]}}})";
  const Strategy s = read_strategy(write("opt.json", text));
  const ParamLayout& l = s.params.at("emb").stages.at(0);
  EXPECT_EQ(l.tensor_shape, (std::vector<int64_t>{10, 4}));
  EXPECT_EQ(l.param_split_shape, (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(l.indices_offset, (std::vector<int64_t>{0, 6}));
}

TEST_F(StrategyFiles, JsonRefusals) {
  const std::vector<std::pair<std::string, std::string>> keys{{"dev_matrix", "[2]"},
                                                              {"tensor_map", "[0]"},
                                                              {"field", "0"},
                                                              {"opt_weight_shard_step", "0"},
                                                              {"opt_weight_shard_size", "0"}};
  auto layout_without = [&](const std::string& skip) {
    std::string body;
    for (const auto& [key, value] : keys)
      if (key != skip) body += (body.empty() ? "\"" : ",\"") + key + "\":" + value;
    return body;
  };
  for (const auto& [key, value] : keys) {
    const fs::path path = write(
        "missing.json", R"({"parallel_layout_item":{"my.param":{)" + layout_without(key) + "}}}");
    EXPECT_THAT(error_of(path), AllOf(HasSubstr("missing.json"), HasSubstr("my.param"),
                                      HasSubstr(key), HasSubstr("missing")))
        << key;
  }
  const std::string base = layout_without("");
  const fs::path half = write(
      "half.json", R"({"parallel_layout_item":{"emb":{)" + base + R"(,"param_split_shape":[1]}}})");
  EXPECT_THAT(error_of(half),
              AllOf(HasSubstr("half.json"), HasSubstr("emb"), HasSubstr("indices_offset")));
  const fs::path wrong =
      write("wrong.json", R"({"parallel_layout_item":{"emb":{"dev_matrix":"2",)" +
                              layout_without("dev_matrix") + "}}}");
  EXPECT_THAT(error_of(wrong),
              AllOf(HasSubstr("wrong.json"), HasSubstr("emb"), HasSubstr("dev_matrix")));
  EXPECT_THAT(error_of(write("broken.json", "{\"parallel_layout_item\": {")),
              AllOf(HasSubstr("broken.json"), HasSubstr("not a JSON strategy file")));
}

TEST_F(StrategyFiles, PerDimensionTensorMaps) {
  // ≥2.6 Layout-API form: one TensorMap per dimension; a 1-D tensor gets an extra empty one.
  pb::ParallelStrategyMap map =
      message(0, {{"e", {2, 2, 2}, {{1, 0}, {-1}}}, {"v", {2, 2, 2}, {{2, 0}, {}}}});
  const Strategy s = read_strategy(write("multi.ckpt", map));
  EXPECT_EQ(s.params.at("e").stages.at(0).tensor_map, (std::vector<DimAxes>{{1, 0}, {}}));
  EXPECT_EQ(s.params.at("v").stages.at(0).tensor_map, (std::vector<DimAxes>{{2, 0}}));
}

// Hand-written wire bytes: packed repeated scalars and a file from MindSpore ≤1.2 (no fields
// 6 and 7).
TEST_F(StrategyFiles, PackedScalarsAndMissingOptimizerFields) {
  const std::string dev = len_field(1, varint(4) + varint(2));  // DevMatrix.dim packed [4,2]
  const std::string map = len_field(1, varint(0) + varint(static_cast<uint64_t>(-1)));
  const std::string layouts = len_field(1, dev) + len_field(2, map) + len_field(3, "") +
                              len_field(4, "") + varint_field(5, 0);
  const std::string item = len_field(1, "w") + len_field(2, layouts);
  const std::string file = varint_field(1, 1) + len_field(3, item);
  const Strategy s = read_strategy(write("old.ckpt", file));
  EXPECT_EQ(s.devices_per_stage, 8);
  EXPECT_EQ(s.params.at("w").stages.at(0), classic({4, 2}, {0, -1}));
}

TEST_F(StrategyFiles, StagePrefixesSplitAtFirstDashOnlyWhenNumeric) {
  const pb::ParallelStrategyMap map = message(0, {{"0-w0", {2, 2}, {{1, -1}}},
                                                  {"1-w1", {2, 2}, {{-1, 0}}},
                                                  {"1-a-b", {2, 2}, {{-1}}},
                                                  {"layer-norm.gamma", {2, 2}, {{-1}}},
                                                  {"12x-y", {2, 2}, {{-1}}}});
  const Strategy s = read_strategy(write("merged.ckpt", map));
  EXPECT_EQ(s.num_stages, 2u);
  EXPECT_EQ(s.devices_per_stage, 4);
  EXPECT_THAT(s.params.at("w0").stages, ElementsAre(::testing::Key(0u)));
  EXPECT_THAT(s.params.at("w1").stages, ElementsAre(::testing::Key(1u)));
  EXPECT_THAT(s.params.at("a-b").stages, ElementsAre(::testing::Key(1u)));
  EXPECT_THAT(s.params.at("layer-norm.gamma").stages, ElementsAre(::testing::Key(0u)));
  EXPECT_THAT(s.params.at("12x-y").stages, ElementsAre(::testing::Key(0u)));
  EXPECT_EQ(s.params.at("w0").name, "w0");
}

// Example F as per-stage files: rank_0 and rank_1 belong to stage 0, rank_2 to stage 1.
TEST_F(StrategyFiles, DirectoryOfProtobufFilesMergesLikeMergedFile) {
  write("dir/ckpt_strategy_rank_0.ckpt",
        message(0, {{"w0", {2, 2}, {{1, -1}}}, {"shared", {2, 2}, {{-1}}}}));
  // Same stage again, even with other content: skipped, as merge_pipeline_strategys does.
  write("dir/ckpt_strategy_rank_1.ckpt", message(0, {{"w0", {2, 2}, {{0, -1}}}}));
  write("dir/ckpt_strategy_rank_2.ckpt",
        message(1, {{"w1", {2, 2}, {{-1, 0}}}, {"shared", {2, 2}, {{-1}}}}));
  write("dir/ckpt_strategy_rank_3.ckpt", message(1, {{"w1", {2, 2}, {{-1, 0}}}}));
  write("dir/notes.txt", "not a strategy");
  write("dir/.hidden.json", "{}");

  const Strategy dir = read_strategy(dir_ / "dir");
  const Strategy merged =
      read_strategy(write("merged.ckpt", message(0, {{"0-w0", {2, 2}, {{1, -1}}},
                                                     {"0-shared", {2, 2}, {{-1}}},
                                                     {"1-w1", {2, 2}, {{-1, 0}}},
                                                     {"1-shared", {2, 2}, {{-1}}}})));
  EXPECT_EQ(dir.num_stages, 2u);
  EXPECT_EQ(dir.devices_per_stage, 4);
  EXPECT_EQ(dir.params, merged.params);
  EXPECT_EQ(dir.params.at("w0").stages.at(0), classic({2, 2}, {1, -1}));
  EXPECT_THAT(dir.params.at("shared").stages, ElementsAre(::testing::Key(0u), ::testing::Key(1u)));
  EXPECT_EQ(dir.origin, (dir_ / "dir").string());
}

TEST_F(StrategyFiles, DirectoryOfJsonFiles) {
  write("j/rank_0.json",
        R"({"parallel_strategy_item":{"MatMul_w0":{"stage":0,"parallel_strategy":[[2,1]]}},
            "parallel_layout_item":{"w0":{"dev_matrix":[2,2],"tensor_map":[1,-1],"field":0,
            "opt_weight_shard_step":0,"opt_weight_shard_size":0}}})");
  write("j/rank_4.json",
        R"({"parallel_strategy_item":{"MatMul_w1":{"stage":1,"parallel_strategy":[[1,2]]}},
            "parallel_layout_item":{"w1":{"dev_matrix":[2,2],"tensor_map":[-1,0],"field":0,
            "opt_weight_shard_step":0,"opt_weight_shard_size":0}}})");
  const Strategy dir = read_strategy(dir_ / "j");
  const Strategy merged = read_strategy(
      write("merged.ckpt", message(0, {{"0-w0", {2, 2}, {{1, -1}}}, {"1-w1", {2, 2}, {{-1, 0}}}})));
  EXPECT_EQ(dir.num_stages, 2u);
  EXPECT_EQ(dir.params, merged.params);
  EXPECT_EQ(dir.operators.at("MatMul_w1").stage, 1u);
}

TEST_F(StrategyFiles, JsonStageComesFromFirstItemInFileOrder) {
  // Keys not in alphabetical order: the first item in the file decides (stage 0; the
  // alphabetically first would give 1).
  const Strategy s =
      read_strategy(write("order.json",
                          R"({"parallel_strategy_item":{"Z_op":{"stage":0},"A_op":{"stage":1}},
          "parallel_layout_item":{"0-w":{"dev_matrix":[2],"tensor_map":[0],"field":0,
          "opt_weight_shard_step":0,"opt_weight_shard_size":0},"x":{"dev_matrix":[2],
          "tensor_map":[0],"field":0,"opt_weight_shard_step":0,"opt_weight_shard_size":0}}})"));
  EXPECT_THAT(s.params.at("x").stages, ElementsAre(::testing::Key(0u)));
  EXPECT_EQ(s.num_stages, 1u);
}

TEST_F(StrategyFiles, DirectoryRefusals) {
  write("mixed/a.ckpt", message(0, {{"w", {2}, {{0}}}}));
  write("mixed/b.json", "{}");
  EXPECT_THAT(error_of(dir_ / "mixed"), AllOf(HasSubstr("mixed"), HasSubstr("mixes")));

  fs::create_directories(dir_ / "empty");
  EXPECT_THAT(error_of(dir_ / "empty"), HasSubstr("no *.ckpt or *.json"));

  pb::ParallelStrategyMap no_ops = message(0, {{"w", {2}, {{0}}}});
  no_ops.clear_parallel_strategy_item();
  write("noops/a.ckpt", no_ops);
  EXPECT_THAT(error_of(dir_ / "noops"),
              AllOf(HasSubstr("a.ckpt"), HasSubstr("no parallel_strategy_item")));

  pb::ParallelStrategyMap no_layouts = message(0, {{"w", {2}, {{0}}}});
  no_layouts.clear_parallel_layout_item();
  write("nolayouts/a.ckpt", message(0, {{"w", {2}, {{0}}}}));
  write("nolayouts/b.ckpt", no_layouts);
  EXPECT_THAT(error_of(dir_ / "nolayouts"),
              AllOf(HasSubstr("b.ckpt"), HasSubstr("no parallel_layout_item")));

  write("gap/a.ckpt", message(0, {{"w", {2}, {{0}}}}));
  write("gap/b.ckpt", message(2, {{"v", {2}, {{0}}}}));
  EXPECT_THAT(error_of(dir_ / "gap"), HasSubstr("does not contain all stages"));

  write("garbage/a.ckpt", message(0, {{"w", {2}, {{0}}}}));
  write("garbage/b.ckpt", "\x01\x02garbage bytes");
  EXPECT_THAT(error_of(dir_ / "garbage"), HasSubstr("b.ckpt"));
}

TEST_F(StrategyFiles, FileRefusals) {
  EXPECT_THAT(error_of(write("garbage.ckpt", "this is not a strategy file\n")),
              AllOf(HasSubstr("garbage.ckpt"), HasSubstr("not a protobuf strategy file")));
  EXPECT_THAT(error_of(write("empty.ckpt", "")),
              AllOf(HasSubstr("empty.ckpt"), HasSubstr("empty")));
  EXPECT_THAT(error_of(write("empty.json", "")), HasSubstr("empty.json"));
  EXPECT_THAT(error_of(dir_ / "absent.ckpt"),
              AllOf(HasSubstr("absent.ckpt"), HasSubstr("does not exist")));

  pb::ParallelStrategyMap no_layouts = message(0, {{"w", {2}, {{0}}}});
  no_layouts.clear_parallel_layout_item();
  EXPECT_THAT(error_of(write("nolayout.ckpt", no_layouts)),
              AllOf(HasSubstr("nolayout.ckpt"), HasSubstr("no parallel_layout_item")));
  EXPECT_THAT(error_of(write("nolayout.json", R"({"parallel_layout_item":{}})")),
              AllOf(HasSubstr("nolayout.json"), HasSubstr("no parallel_layout_item")));

  // A required field missing (current_stage) is named.
  pb::ParallelStrategyMap partial = message(0, {{"w", {2}, {{0}}}});
  partial.clear_current_stage();
  EXPECT_THAT(error_of(write("partial.ckpt", partial.SerializePartialAsString())),
              AllOf(HasSubstr("partial.ckpt"), HasSubstr("current_stage")));

  // §7: one device count per strategy.
  const fs::path mixed =
      write("mixed.ckpt", message(0, {{"a.weight", {2, 4}, {{1, -1}}}, {"b.weight", {4}, {{0}}}}));
  EXPECT_THAT(error_of(mixed), AllOf(HasSubstr("mixed.ckpt"), HasSubstr("b.weight"),
                                     HasSubstr("a.weight"), HasSubstr("4 devices")));

  EXPECT_THAT(error_of(write("gap.ckpt", message(0, {{"0-a", {2}, {{0}}}, {"2-b", {2}, {{0}}}}))),
              AllOf(HasSubstr("gap.ckpt"), HasSubstr("does not contain all stages")));
  // A single per-stage file of stage 1 is not a whole pipeline.
  EXPECT_THAT(error_of(write("stage1.ckpt", message(1, {{"a", {2}, {{0}}}}))),
              HasSubstr("does not contain all stages"));

  pb::ParallelStrategyMap no_dev = message(0, {{"w", {2}, {{0}}}});
  no_dev.mutable_parallel_layout_item(0)->mutable_parallel_layouts()->clear_dev_matrix();
  EXPECT_THAT(error_of(write("nodev.ckpt", no_dev)),
              AllOf(HasSubstr("nodev.ckpt"), HasSubstr("w"), HasSubstr("dev_matrix")));

  // An absurd device count is refused at once, naming the limit, before anything is planned.
  const fs::path huge = write("huge.ckpt", message(0, {{"w", {1 << 20, 1 << 20}, {{0, -1}}}}));
  EXPECT_THAT(error_of(huge),
              AllOf(HasSubstr("huge.ckpt"), HasSubstr("w"), HasSubstr("more than 65536 devices")));
  const fs::path just = write("just.ckpt", message(0, {{"w", {1 << 8, 1 << 8}, {{0, -1}}}}));
  EXPECT_NO_THROW(read_strategy(just));
  const fs::path over = write("over.ckpt", message(0, {{"w", {1 << 8, 1 << 8, 2}, {{0, -1}}}}));
  EXPECT_THAT(error_of(over), HasSubstr("more than 65536 devices"));

  const fs::path twice =
      write("twice.ckpt", message(0, {{"0-w", {2}, {{0}}}, {"0-w", {2}, {{-1}}}}));
  EXPECT_THAT(error_of(twice), AllOf(HasSubstr("twice.ckpt"), HasSubstr("twice")));
}

TEST_F(StrategyFiles, SingleFileWithoutStrategyItemsIsStageZero) {
  pb::ParallelStrategyMap map = message(0, {{"w", {8}, {{0, -1}}, 1, -1}});
  map.clear_parallel_strategy_item();
  const Strategy s = read_strategy(write("bare.ckpt", map));
  EXPECT_EQ(s.num_stages, 1u);
  EXPECT_EQ(s.params.at("w").stages.at(0), classic({8}, {0, -1}, 1, -1));
  EXPECT_TRUE(s.operators.empty());
}

}  // namespace
}  // namespace ckptfs::strategy
