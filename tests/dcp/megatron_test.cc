// Megatron-Core torch_dist directories (tests/data/megatron/README.md: a real 0.16.1 save of a
// 4-layer GPTModel on TP 2 x PP 2): the .metadata, which holds the planner's SavePlans, parses;
// the iteration is found from the save root as --step says; stacked names unstack.
#include "ckptfs/megatron/megatron.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "ckptfs/dcp/dcp.h"
#include "ckptfs/error.h"

namespace ckptfs::megatron {
namespace {

namespace fs = std::filesystem;

const fs::path kSave = fs::path(CKPTFS_TEST_DATA) / "megatron" / "save";

std::string refusal(const fs::path& dir, const std::string& step) {
  try {
    find_iteration(dir, step);
  } catch (const Error& e) {
    return e.what();
  }
  return "accepted";
}

TEST(Megatron, RealMetadataParses) {
  const dcp::Metadata md = dcp::read_metadata(kSave / "iter_0000007");
  std::set<std::string> names;
  for (const dcp::Tensor& t : md.tensors) names.insert(t.fqn);
  EXPECT_EQ(md.tensors.size(), 14u);  // 13 model tensors and the optimizer's
  EXPECT_TRUE(names.contains("decoder.layers.mlp.linear_fc1.weight"));
  EXPECT_EQ(md.objects.size(), 20u);  // rng_state and 4 _extra_state objects, per rank
  for (const dcp::Tensor& t : md.tensors) {
    if (t.fqn == "decoder.layers.mlp.linear_fc1.weight") {
      EXPECT_EQ(t.shape, (std::vector<int64_t>{4, 48, 16}));  // [layers, W;V of 24 each, hidden]
    }
  }
}

TEST(Megatron, FindsTheIteration) {
  EXPECT_EQ(find_iteration(kSave, "latest"), kSave / "iter_0000007");
  EXPECT_EQ(find_iteration(kSave, "7"), kSave / "iter_0000007");
  EXPECT_EQ(find_iteration(kSave / "iter_0000007", "latest"), kSave / "iter_0000007");
  EXPECT_EQ(find_iteration(fs::path(CKPTFS_TEST_DATA) / "dcp" / "plain", "latest"), std::nullopt);
  EXPECT_NE(refusal(kSave / "iter_0000007", "7").find("give its parent with --step 7"),
            std::string::npos);
  EXPECT_NE(refusal(kSave, "8").find("iter_0000008: no metadata.json"), std::string::npos);
  EXPECT_NE(refusal(kSave, "10_100").find("takes latest or an iteration number"),
            std::string::npos);
}

TEST(Megatron, LayerNames) {
  EXPECT_EQ(layer_name("decoder.layers.mlp.linear_fc1.weight", 2),
            "decoder.layers.2.mlp.linear_fc1.weight");
  EXPECT_EQ(layer_name("layers.self_attention.linear_qkv.weight", 0),
            "layers.0.self_attention.linear_qkv.weight");
  EXPECT_EQ(layer_name("decoder.layers.3.mlp.linear_fc1.weight", 1), std::nullopt);
  EXPECT_EQ(layer_name("decoder.final_layernorm.weight", 1), std::nullopt);
  EXPECT_EQ(layer_name("decoder.sublayers.x", 1), std::nullopt);
  EXPECT_TRUE(is_optimizer("optimizer.distributed.dp_group_idx_0.param_state"));
  EXPECT_FALSE(is_optimizer("decoder.layers.mlp.linear_fc1.weight"));
}

}  // namespace
}  // namespace ckptfs::megatron
