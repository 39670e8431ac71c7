// The placeholder registry is the process's: a caller that registered objects for a while can
// leave it as it found it (tests in one binary must not see each other's objects).
#include "ckptfs/remote/objects.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "ckptfs/error.h"

namespace ckptfs::remote {
namespace {

TEST(Objects, UnregisteringTheLastPlaceholderLeavesNoneRegistered) {
  const auto dir =
      std::filesystem::temp_directory_path() / fmt::format("objects_test.{}", ::getpid());
  std::filesystem::create_directories(dir);
  const auto a = dir / "a.safetensors", b = dir / "b.safetensors";
  std::ofstream(a).put('x');
  std::ofstream(b).put('x');
  const S3Config config{std::string("k"),         std::string("s"),     std::string(),
                        std::string("us-east-1"), "http://127.0.0.1:9", std::string("the test")};
  const auto client = std::make_shared<const S3Client>(config, 2);
  ASSERT_FALSE(any_registered());

  register_object(a, ObjectRef{"bucket", {"a", 1, "\"e\""}}, client);
  register_object(b, ObjectRef{"bucket", {"b", 1, "\"e\""}}, client);
  unregister_object(a);
  EXPECT_TRUE(any_registered());
  EXPECT_EQ(object_at(a), nullptr);
  ASSERT_NE(object_at(b), nullptr);
  EXPECT_EQ(object_at(b)->url(), "s3://bucket/b");

  unregister_object(b);
  EXPECT_FALSE(any_registered());
  EXPECT_EQ(object_at(b), nullptr);
  EXPECT_THROW(remote::client(), Error);
  unregister_object(dir / "never.safetensors");  // not there: nothing to forget
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ckptfs::remote
