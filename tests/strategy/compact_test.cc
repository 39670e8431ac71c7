// The compact form a shipped index keeps of a parsed strategy: it decodes to the same layouts,
// and bytes it did not write are refused, not half read.
#include "ckptfs/strategy/compact.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "ckptfs/strategy/strategy.h"
#include "strategy/strategy_test_util.h"

namespace ckptfs::strategy {
namespace {

const std::filesystem::path kRealStrategy =
    std::filesystem::path(CKPTFS_TEST_DATA) /
    "fixtures/real/strategy/golden-stick_llama2-13b-2p_ckpt_strategy_rank_0.ckpt";

Strategy two_stages() {
  Strategy s;
  s.origin = "made here";
  s.devices_per_stage = 8;
  s.num_stages = 2;
  ParamLayout multi = testsupport::classic({2, 4}, {1, -1});
  multi.tensor_map[1] = {0, 1};  // a dimension split over two axes
  multi.param_split_shape = {3, -5};
  multi.indices_offset = {0, 7};
  multi.field = -1;
  multi.tensor_shape = {16, 1LL << 40};
  s.params["a.weight"] = {"a.weight", {{0, testsupport::classic({8}, {0, -1}, 2, 4)}, {1, multi}}};
  s.params["b"] = {"b", {{1, testsupport::classic({8}, {})}}};
  return s;
}

TEST(CompactStrategy, RoundTrips) {
  for (const Strategy& s : {two_stages(), read_strategy(kRealStrategy)}) {
    const std::optional<Strategy> back = decode_compact(encode_compact(s), "elsewhere");
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(back->origin, "elsewhere");
    EXPECT_EQ(back->devices_per_stage, s.devices_per_stage);
    EXPECT_EQ(back->num_stages, s.num_stages);
    EXPECT_EQ(back->params, s.params);
    EXPECT_TRUE(back->operators.empty());
    for (const auto& [name, param] : s.params) EXPECT_EQ(back->find(name)->name, name);
  }
}

TEST(CompactStrategy, RefusesWhatItDidNotWrite) {
  const std::string bytes = encode_compact(two_stages());
  EXPECT_FALSE(decode_compact("", "x"));
  EXPECT_FALSE(decode_compact("CKSTRAT0" + bytes.substr(8), "x"));
  EXPECT_FALSE(decode_compact(bytes + '\0', "x"));  // trailing bytes
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_FALSE(decode_compact(bytes.substr(0, n), "x")) << n;  // every truncation
  for (size_t i = 8; i < bytes.size(); ++i) {
    std::string damaged = bytes;
    damaged[i] = static_cast<char>(0xff);
    // Decodes to nothing or to some strategy, never out of bounds (ASan runs this too).
    (void)decode_compact(damaged, "x");
  }
}

}  // namespace
}  // namespace ckptfs::strategy
