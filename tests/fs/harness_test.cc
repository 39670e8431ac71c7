// The test command's self-test (scripts/test-selftest.sh) proves that a failing or skipped unit
// test fails every stage that runs the unit tests: it sets CKPTFS_INJECT_FAILURE=1 or
// CKPTFS_INJECT_SKIP=1 for this one test. Without them it passes. It lives in the fs module
// because the TSan stage runs that module's tests.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string_view>

namespace {

bool injected(const char* variable) {
  const char* value = std::getenv(variable);
  return value != nullptr && std::string_view(value) == "1";
}

TEST(Harness, InjectedFailure) {
  if (injected("CKPTFS_INJECT_SKIP")) GTEST_SKIP() << "skip injected (CKPTFS_INJECT_SKIP=1)";
  EXPECT_FALSE(injected("CKPTFS_INJECT_FAILURE")) << "failure injected (CKPTFS_INJECT_FAILURE=1)";
}

}  // namespace
