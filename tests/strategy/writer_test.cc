// Strategy files written by `strategy new` (writer.h): the rules (first match, whole names,
// negative dimensions, the default), every refusal, the protobuf bytes against the spec's wire
// form, and read_strategy reading back exactly the layouts meant.
#include "ckptfs/strategy/writer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckptfs/error.h"
#include "ckptfs/strategy/strategy.h"
#include "strategy/strategy_test_util.h"
#include "support/test_support.h"

namespace ckptfs::strategy {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using testsupport::classic;

LayoutRule split(std::string pattern, int64_t dim) {
  return {"--split '" + pattern + "=" + std::to_string(dim) + "'", std::move(pattern), dim};
}

LayoutRule replicate(std::string pattern) {
  return {"--replicate '" + pattern + "'", std::move(pattern), std::nullopt};
}

NewStrategy rules(int64_t devices, std::vector<LayoutRule> list, bool replicate_rest = true) {
  NewStrategy out;
  out.devices = devices;
  out.rules = std::move(list);
  out.unmatched_replicate = replicate_rest;
  return out;
}

std::string error_of(const std::vector<TensorShape>& tensors, const NewStrategy& options) {
  try {
    decide_layouts(tensors, options);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// The layout expected, written out by hand: dev_matrix [n], map values as MindSpore writes them.
ParamLayout expected(int64_t n, std::vector<int32_t> map, std::vector<int64_t> shape = {}) {
  ParamLayout out = classic({n}, std::move(map));
  out.tensor_shape = std::move(shape);
  return out;
}

const std::vector<TensorShape> kModel = {
    {"layers.0.attention.wq.weight", {8, 4}},
    {"layers.0.attention.wo.weight", {4, 8}},
    {"layers.0.attention_norm.weight", {4}},
    {"tok_embeddings.weight", {10, 4}},
};

TEST(DecideLayouts, FirstMatchingRuleDecides) {
  // wq is matched by both the split and the later replicate: the split, first, wins; the norm
  // by the replicate before the split that would refuse it; the embedding by no rule.
  const auto out = decide_layouts(
      kModel, rules(2, {split(".*\\.wq\\.weight", 0), replicate(".*norm.*|.*\\.wq\\..*"),
                        split(".*\\.wo\\.weight", 1), split(".*norm.*", 0)}));
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].name, "layers.0.attention.wq.weight");
  EXPECT_EQ(out[0].rule, 0);
  EXPECT_EQ(out[0].layout, expected(2, {0, -1}, {8, 4}));
  EXPECT_EQ(out[1].rule, 2);
  EXPECT_EQ(out[1].layout, expected(2, {-1, 0}, {4, 8}));
  EXPECT_EQ(out[2].rule, 1);
  EXPECT_EQ(out[2].layout, expected(2, {-1}, {4}));
  EXPECT_EQ(out[3].rule, -1);
  EXPECT_EQ(out[3].layout, expected(2, {-1, -1}, {10, 4}));
}

TEST(DecideLayouts, PatternsMatchWholeNames) {
  // "wq" is inside the name but is not the name: no match, so the default replicates.
  const auto out = decide_layouts(kModel, rules(2, {split("wq", 0), split("layers", 0)}));
  EXPECT_EQ(out[0].rule, -1);
  EXPECT_EQ(out[0].layout, expected(2, {-1, -1}, {8, 4}));
}

TEST(DecideLayouts, PatternsAreExtendedRegularExpressions) {
  const auto out = decide_layouts(
      kModel, rules(2, {split("layers\\.[[:digit:]]+\\.attention\\.w(q|o)\\.weight", 0)}));
  EXPECT_EQ(out[0].rule, 0);
  EXPECT_EQ(out[1].rule, 0);
  EXPECT_EQ(out[2].rule, -1);
}

TEST(DecideLayouts, LongNamesAndNulBytesAreMatchedWhole) {
  // A name is what a checkpoint file says; std::regex overflowed the stack on this one.
  const std::string long_name(200'000, 'x');
  const auto out = decide_layouts({{long_name, {4}}, {std::string("a\0b", 3), {4}}},
                                  rules(2, {split("(x|y)*", 0), split("a", 0)}));
  EXPECT_EQ(out[0].rule, 0);
  EXPECT_EQ(out[1].rule, -1);  // "a" is not the whole of "a\0b"
}

TEST(DecideLayouts, NegativeDimensionCountsFromTheEnd) {
  const auto out = decide_layouts({{"w", {2, 3, 8}}}, rules(4, {split("w", -1)}));
  EXPECT_EQ(out[0].layout, expected(4, {-1, -1, 0}, {2, 3, 8}));
}

TEST(DecideLayouts, OneDeviceAndEmptyDimensionsAreAccepted) {
  EXPECT_EQ(decide_layouts({{"w", {3, 5}}}, rules(1, {split("w", 1)}))[0].layout,
            expected(1, {-1, 0}, {3, 5}));
  // Zero rows divide into any number of equal blocks.
  EXPECT_EQ(decide_layouts({{"w", {0, 4}}}, rules(4, {split("w", 0)}))[0].layout,
            expected(4, {0, -1}, {0, 4}));
}

TEST(DecideLayouts, RefusesASplitThatDoesNotDivide) {
  EXPECT_EQ(error_of(kModel, rules(4, {split("tok_.*", 0)})),
            "tensor \"tok_embeddings.weight\" (shape [10,4]): --split 'tok_.*=0' splits "
            "dimension 0 of size 10, which does not divide by 4 devices; put a rule for it first "
            "(--replicate or another --split)");
}

TEST(DecideLayouts, RefusesADimensionOutOfRange) {
  EXPECT_THAT(error_of(kModel, rules(2, {split(".*norm.*", 1)})),
              AllOf(HasSubstr("tensor \"layers.0.attention_norm.weight\" (shape [4])"),
                    HasSubstr("--split '.*norm.*=1' names dimension 1, but the tensor has 1 "
                              "dimension;")));
  EXPECT_THAT(error_of(kModel, rules(2, {split(".*norm.*", -2)})),
              HasSubstr("--split '.*norm.*=-2' names dimension -2, but the tensor has 1"));
}

TEST(DecideLayouts, RefusesUnmatchedTensorsWhenAskedTo) {
  EXPECT_EQ(error_of(kModel, rules(2, {split(".*\\.w[qo]\\.weight", 0)}, false)),
            "tensor \"layers.0.attention_norm.weight\" (shape [4]) matches no rule; add a --split "
            "or --replicate rule for it, or --default replicate");
}

TEST(DecideLayouts, RefusesBadOptions) {
  EXPECT_THAT(error_of(kModel, rules(2, {split("(", 0)})),
              HasSubstr("--split '(=0': not a regular expression"));
  EXPECT_EQ(error_of(kModel, rules(0, {})), "--devices 0: expected 1 to 65536");
  EXPECT_EQ(error_of(kModel, rules(kMaxRanks + 1, {})), "--devices 65537: expected 1 to 65536");
  EXPECT_EQ(error_of({}, rules(2, {})), "no tensor to write a layout for");
  EXPECT_EQ(error_of({{"w", {2}}, {"w", {2}}}, rules(2, {})), "tensor \"w\" is listed twice");
  EXPECT_EQ(error_of({{"0-w", {2}}}, rules(2, {})),
            "tensor \"0-w\": a strategy file reads a name \"<digits>-<name>\" as <name> of that "
            "pipeline stage, so no strategy can lay this tensor out");
  EXPECT_NO_THROW(decide_layouts({{"w-0", {2}}, {"0x-w", {2}}, {"-w", {2}}}, rules(2, {})));
  EXPECT_THROW(check_new_strategy(rules(2, {replicate("[")})), Error);
  EXPECT_NO_THROW(check_new_strategy(rules(2, {replicate(".*")})));
}

// Patterns whose matching or compiling takes exponential time in glibc's matcher are refused at
// once, in one line: back-references (a name of 200 characters took minutes) and repetition
// counts that multiply out past 256 copies (three nested {0,30} never finished compiling).
TEST(DecideLayouts, RefusesCatastrophicPatterns) {
  const std::vector<TensorShape> model = {{std::string(200, 'x'), {4}}};
  EXPECT_THAT(error_of(model, rules(2, {split("(.*)(.*)(.*)(.*)(.*)\\5y", 0)})),
              HasSubstr("--split '(.*)(.*)(.*)(.*)(.*)\\5y=0': a back-reference (\\5)"));
  EXPECT_THAT(error_of(model, rules(2, {split("((x{0,30}){0,30}){0,30}", 0)})),
              HasSubstr("repeats its parts more than 256 times"));
  EXPECT_THAT(error_of(model, rules(2, {split("x{1,300}", 0)})),
              HasSubstr("repeats its parts more than 256 times"));
  // Ordinary rules, counts and bracket expressions that hold `\1` or braces are fine.
  EXPECT_NO_THROW(decide_layouts(model, rules(2, {split("x{1,200}", 0)})));
  EXPECT_NO_THROW(decide_layouts({{"layers.12.wq", {4}}},
                                 rules(2, {split("layers\\.[0-9]{1,3}\\.w[q\\1{]", 0)})));
}

// The spec's wire form (§2.1, §2.6), written out byte by byte: current_stage 1; a strategy item
// (node, stage 0, split counts [2,1]); a layout item with dev_matrix [2], tensor_map [0,-1]
// unpacked (-1 as the 10-byte varint), empty ParamSplitShape and IndicesOffset, field, step and
// size 0.
TEST(EncodeProtobuf, IsMindSporesWireForm) {
  const auto layouts = decide_layouts({{"w", {8, 4}}}, rules(2, {split("w", 0)}));
  const std::string node = "StrategyNew_w";
  std::string want = "\x08\x01";                                        // current_stage 1
  want += "\x12\x19";                                                   // strategy item, 25
  want += "\x0a\x0d" + node;                                            // node_name
  want += std::string("\x12\x08\x08\x00\x12\x04\x08\x02\x08\x01", 10);  // stage 0, [2,1]
  want += "\x1a\x22";                                                   // layout item, 34
  want += "\x0a\x01w";                                                  // param_name
  want += "\x12\x1d";                                                   // layouts, 29
  want += "\x0a\x02\x08\x02";                                           // dev_matrix [2]
  want += std::string("\x12\x0d\x08\x00\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 15);
  want += std::string("\x1a\x00\x22\x00\x28\x00\x30\x00\x38\x00", 10);
  EXPECT_EQ(encode_protobuf(layouts), want);
}

class WriteFile : public ::testing::Test {
 protected:
  testsupport::TempDir tmp_{"ckptfs_writer"};
  std::vector<NewLayout> layouts_ =
      decide_layouts(kModel, rules(2, {split(".*\\.wq\\.weight", 0), split(".*\\.wo\\.weight", -1),
                                       replicate(".*norm.*")}));
};

TEST_F(WriteFile, ProtobufReadsBackAsMeant) {
  const fs::path path = tmp_.path() / "tp2.ckpt";
  write_strategy_file(path, layouts_);
  const Strategy s = read_strategy(path);
  EXPECT_EQ(s.devices_per_stage, 2);
  EXPECT_EQ(s.num_stages, 1u);
  ASSERT_EQ(s.params.size(), 4u);
  // Protobuf carries no shape (§2.1).
  EXPECT_EQ(s.params.at("layers.0.attention.wq.weight").stages.at(0), expected(2, {0, -1}));
  EXPECT_EQ(s.params.at("layers.0.attention.wo.weight").stages.at(0), expected(2, {-1, 0}));
  EXPECT_EQ(s.params.at("layers.0.attention_norm.weight").stages.at(0), expected(2, {-1}));
  EXPECT_EQ(s.params.at("tok_embeddings.weight").stages.at(0), expected(2, {-1, -1}));
  for (const auto& [name, param] : s.params) EXPECT_EQ(param.stages.size(), 1u) << name;
  ASSERT_EQ(s.operators.size(), 4u);
  const OperatorStrategy& wo = s.operators.at("StrategyNew_layers.0.attention.wo.weight");
  EXPECT_EQ(wo.stage, 0u);
  EXPECT_EQ(wo.inputs, (std::vector<std::vector<uint32_t>>{{1, 2}}));
}

TEST_F(WriteFile, JsonReadsBackWithGlobalShapes) {
  const fs::path path = tmp_.path() / "tp2.json";
  write_strategy_file(path, layouts_);
  const Strategy s = read_strategy(path);
  EXPECT_EQ(s.devices_per_stage, 2);
  EXPECT_EQ(s.params.at("layers.0.attention.wq.weight").stages.at(0), expected(2, {0, -1}, {8, 4}));
  EXPECT_EQ(s.params.at("layers.0.attention.wo.weight").stages.at(0), expected(2, {-1, 0}, {4, 8}));
  EXPECT_EQ(s.params.at("layers.0.attention_norm.weight").stages.at(0), expected(2, {-1}, {4}));
  EXPECT_EQ(s.params.at("tok_embeddings.weight").stages.at(0), expected(2, {-1, -1}, {10, 4}));
  // Every key MindSpore's Python reader requires (§2.3), in one JSON document.
  const nlohmann::json doc = nlohmann::json::parse(testsupport::read_file(path));
  EXPECT_EQ(doc["current_stage"], 1);
  const nlohmann::json& wq = doc["parallel_layout_item"]["layers.0.attention.wq.weight"];
  for (const char* key : {"dev_matrix", "tensor_map", "field", "opt_weight_shard_step",
                          "opt_weight_shard_size", "tensor_shape"})
    EXPECT_TRUE(wq.contains(key)) << key;
  EXPECT_EQ(wq["tensor_map"], nlohmann::json::parse("[0,-1]"));
  EXPECT_EQ(doc["parallel_strategy_item"]["StrategyNew_layers.0.attention.wq.weight"],
            nlohmann::json::parse(R"({"stage":0,"parallel_strategy":[[2,1]]})"));
}

TEST_F(WriteFile, ReplacesAnOldFileAndLeavesNoTemporary) {
  const fs::path path = tmp_.path() / "s.ckpt";
  testsupport::write_file(path, "old bytes");
  write_strategy_file(path, layouts_);
  EXPECT_EQ(testsupport::read_file(path), encode_protobuf(layouts_));
  EXPECT_EQ(std::distance(fs::directory_iterator(tmp_.path()), fs::directory_iterator()), 1);
}

TEST_F(WriteFile, RefusesAPathItCannotWrite) {
  const fs::path path = tmp_.path() / "missing" / "s.ckpt";
  try {
    write_strategy_file(path, layouts_);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr(path.string() + ": cannot create"),
                                HasSubstr("No such file or directory")));
  }
}

}  // namespace
}  // namespace ckptfs::strategy
