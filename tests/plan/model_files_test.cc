// save_pretrained's shard split, its index file and --shard-size, against expectations worked out
// by hand from Hugging Face's documented rule (huggingface_hub's split_state_dict_into_shards:
// "[6GB, 6GB, 2GB, 6GB, 2GB, 2GB] with 10GB -> [6], [6+2], [6+2+2]"; a tensor over the size in a
// shard of its own), and the rename map's rules and refusals.
#include "ckptfs/plan/model_files.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ckptfs/error.h"
#include "ckptfs/plan/rename_map.h"

namespace ckptfs::plan {
namespace {

using Shards = std::vector<std::vector<size_t>>;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(SplitShards, InOrderANewShardWhenTheNextWouldNotFit) {
  const std::vector<uint64_t> sizes{6, 6, 2, 6, 2, 2};
  EXPECT_EQ(split_shards(sizes, 10), (Shards{{0}, {1, 2}, {3, 4, 5}}));
}

TEST(SplitShards, ExactlyFullIsNotOver) {
  const std::vector<uint64_t> sizes{4, 6, 10, 1};
  EXPECT_EQ(split_shards(sizes, 10), (Shards{{0, 1}, {2}, {3}}));
}

// A tensor over the size is placed in a shard of its own when it is met; the shard being filled
// stays open, so the tensors after it may join the ones before it.
TEST(SplitShards, ATensorOverTheSizeGetsItsOwnShardWhenMet) {
  const std::vector<uint64_t> sizes{6, 10, 30, 2, 2};
  EXPECT_EQ(split_shards(sizes, 10), (Shards{{0}, {2}, {1}, {3, 4}}));
  const std::vector<uint64_t> around{1, 50, 1};
  EXPECT_EQ(split_shards(around, 5), (Shards{{1}, {0, 2}}));
}

TEST(SplitShards, ZeroSizeMeansOneShardAndSoDoesAModelThatFits) {
  const std::vector<uint64_t> sizes{6, 6, 6};
  EXPECT_EQ(split_shards(sizes, 0), (Shards{{0, 1, 2}}));
  EXPECT_EQ(split_shards(sizes, 18), (Shards{{0, 1, 2}}));
  EXPECT_EQ(split_shards({}, 10), (Shards{{}}));
  const std::vector<uint64_t> empty_tensors{0, 0, 10, 0};
  EXPECT_EQ(split_shards(empty_tensors, 10), (Shards{{0, 1, 2, 3}}));
}

TEST(ShardFileName, FiveDigitsAsSavePretrainedNamesThem) {
  EXPECT_EQ(shard_file_name(2, 5), "model-00002-of-00005.safetensors");
  EXPECT_EQ(shard_file_name(12, 123456), "model-00012-of-123456.safetensors");
}

TEST(ShardIndexJson, AsJsonDumpsWithIndent2AndSortedKeysWrites) {
  std::vector<ModelEntry> model(3);
  model[0] = {"z.weight", "F32", {2}, 8, {}};
  model[1] = {"a.b\xc3\xa9", "F16", {3}, 6, {}};  // "a.bé": \u00e9 as ensure_ascii writes it
  model[2] = {"m", "I64", {}, 8, {}};
  // json.dumps({"metadata": {"total_size": 22}, "weight_map": {...}}, indent=2,
  // sort_keys=True) + "\n", typed out by hand.
  EXPECT_EQ(shard_index_json(model, {{0}, {1, 2}}),
            "{\n"
            "  \"metadata\": {\n"
            "    \"total_size\": 22\n"
            "  },\n"
            "  \"weight_map\": {\n"
            "    \"a.b\\u00e9\": \"model-00002-of-00002.safetensors\",\n"
            "    \"m\": \"model-00002-of-00002.safetensors\",\n"
            "    \"z.weight\": \"model-00001-of-00002.safetensors\"\n"
            "  }\n"
            "}\n");
}

TEST(ParseShardSize, DecimalAndBinaryUnitsBytesAndNever) {
  EXPECT_EQ(parse_shard_size("5GB"), 5'000'000'000u);
  EXPECT_EQ(parse_shard_size("5gb"), 5'000'000'000u);
  EXPECT_EQ(parse_shard_size("2GiB"), uint64_t{2} << 30);
  EXPECT_EQ(parse_shard_size("2.5MB"), 2'500'000u);
  EXPECT_EQ(parse_shard_size("100KiB"), 102'400u);
  EXPECT_EQ(parse_shard_size("1000"), 1000u);
  EXPECT_EQ(parse_shard_size("1000B"), 1000u);
  EXPECT_EQ(parse_shard_size("0"), 0u);
  EXPECT_EQ(parse_shard_size("none"), 0u);
  for (const char* bad : {"", "GB", "-1GB", "5 GB", "5XB", "1e30", "nan", "99999999TB"}) {
    try {
      parse_shard_size(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), AllOf(HasSubstr("--shard-size"), HasSubstr("5GB"))) << bad;
    }
  }
}

std::string refusal(const std::string& rules, const std::vector<std::string>& keys = {}) {
  try {
    RenameMap::parse(rules, "rename.txt")->apply_all(keys);
  } catch (const Error& e) {
    return e.what();
  }
  return "accepted";
}

TEST(RenameMap, FirstMatchingRuleWinsOnTheWholeKey) {
  const auto map = RenameMap::parse(
      "# loader names\n"
      "\n"
      "model\\.layers\\.([0-9]+)\\.attn\\.(.*)\tlayers.\\1.attention.\\2\n"
      "  model\\.(.*)   \\1  \n"
      "model\\.norm never-reached\n"
      "w x\\0y\\\\\n",
      "rename.txt");
  EXPECT_EQ(map->apply("model.layers.12.attn.q.weight"), "layers.12.attention.q.weight");
  EXPECT_EQ(map->apply("model.norm"), "norm");  // the second rule, not the third
  EXPECT_EQ(map->apply("w"), "xwy\\");
  EXPECT_EQ(map->apply("ww"), "ww");  // no rule matches the whole key: kept
  EXPECT_EQ(map->apply("lm_head"), "lm_head");
  EXPECT_EQ(map->apply_all({"model.a", "b", "model.b.c"}),
            (std::vector<std::string>{"a", "b", "b.c"}));
}

TEST(RenameMap, AnOptionalGroupThatTookNoPartIsEmpty) {
  const auto map = RenameMap::parse("(a)?b(c) \\1-\\2\n", "rename.txt");
  EXPECT_EQ(map->apply("bc"), "-c");
  EXPECT_EQ(map->apply("abc"), "a-c");
}

TEST(RenameMap, AVeryLongKeyIsMatchedInBoundedStack) {
  const auto map = RenameMap::parse("(x+)y \\1\n", "rename.txt");
  const std::string key = std::string(1 << 20, 'x') + "y";
  EXPECT_EQ(map->apply(key).size(), size_t{1} << 20);
}

TEST(RenameMap, EachBadRuleIsRefusedNamingFileAndLine) {
  EXPECT_THAT(refusal("# c\na(b x\n"),
              AllOf(HasSubstr("rename.txt:2"), HasSubstr("not a regular expression")));
  EXPECT_THAT(refusal("a b c\n"), AllOf(HasSubstr("rename.txt:1"), HasSubstr("3 fields")));
  EXPECT_THAT(refusal("\n\nonly\n"), AllOf(HasSubstr("rename.txt:3"), HasSubstr("1 fields")));
  EXPECT_THAT(refusal("(a)(b) \\3\n"),
              AllOf(HasSubstr("rename.txt:1"), HasSubstr("\\3 names no group"), HasSubstr("2")));
  EXPECT_THAT(refusal("a x\\n\n"), AllOf(HasSubstr("rename.txt:1"), HasSubstr("backslash")));
  EXPECT_THAT(refusal("a x\\\n"), AllOf(HasSubstr("rename.txt:1"), HasSubstr("backslash")));
}

TEST(RenameMap, AnEmptyNameIsRefusedNamingTheRule) {
  EXPECT_THAT(refusal("x y\nmodel\\.(.*)x? \\1\n", {"model.", "z"}),
              AllOf(HasSubstr("rename.txt:2"), HasSubstr("model."), HasSubstr("empty name")));
}

TEST(RenameMap, TwoTensorsServedUnderOneNameAreRefused) {
  EXPECT_THAT(refusal("(a|b)\\.w w\n", {"a.w", "c", "b.w"}),
              AllOf(HasSubstr("rename.txt"), HasSubstr("a.w"), HasSubstr("b.w"),
                    HasSubstr("both be served as \"w\"")));
  // A renamed key meeting a key no rule renames.
  EXPECT_THAT(refusal("model\\.(.*) \\1\n", {"norm", "model.norm"}),
              AllOf(HasSubstr("norm"), HasSubstr("model.norm"), HasSubstr("both be served")));
}

TEST(RenameMap, AnUnreadableFileIsRefusedNamingIt) {
  try {
    RenameMap::read("/nonexistent/rename.txt");
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("/nonexistent/rename.txt"), HasSubstr("--rename")));
  }
}

}  // namespace
}  // namespace ckptfs::plan
