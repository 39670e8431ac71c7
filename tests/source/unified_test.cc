// param_name_map.json of a unified_safetensors directory: refusals in one line naming the map.
#include "ckptfs/source/unified.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "ckptfs/error.h"

namespace ckptfs::source {
namespace {

std::string refusal_for(const std::string& map_text) {
  // One directory per test process: ctest runs this file's tests in parallel.
  const auto dir = std::filesystem::path(::testing::TempDir()) /
                   ("unified_map_test." + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / kParamNameMap) << map_text;
  std::ofstream(dir / "part0.safetensors") << "x";
  try {
    read_unified(dir);
  } catch (const Error& e) {
    std::filesystem::remove_all(dir);
    return e.what();
  }
  std::filesystem::remove_all(dir);
  return "";
}

// Found by fuzz_unified_map: a number beyond a double's range is nlohmann's out_of_range, not a
// parse_error, and escaped the reader as an unexpected exception.
TEST(UnifiedMap, NumberBeyondADoubleIsRefusedInOneLine) {
  const std::string why = refusal_for("234222222e2222");
  EXPECT_NE(why.find("param_name_map.json: not valid JSON"), std::string::npos) << why;
  EXPECT_NE(refusal_for("{\"w\": 1e999}").find("not valid JSON"), std::string::npos);
}

TEST(UnifiedMap, Accepted) { EXPECT_EQ(refusal_for("{\"w\": \"part0.safetensors\"}"), ""); }

}  // namespace
}  // namespace ckptfs::source
