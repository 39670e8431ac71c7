#include "ckptfs/remote/credentials.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "ckptfs/error.h"

namespace ckptfs::remote {
namespace {

// Every variable find_config reads, cleared for a test and put back after it.
class Env : public ::testing::Test {
 protected:
  static constexpr const char* kVars[] = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                          "AWS_SESSION_TOKEN", "AWS_PROFILE",
                                          "AWS_REGION",        "AWS_DEFAULT_REGION",
                                          "AWS_CONFIG_FILE",   "AWS_SHARED_CREDENTIALS_FILE",
                                          "AWS_ENDPOINT_URL",  "AWS_ENDPOINT_URL_S3",
                                          "AWS_MAX_ATTEMPTS",  "HOME"};
  void SetUp() override {
    for (const char* v : kVars) {
      if (const char* s = std::getenv(v)) saved_.emplace_back(v, s);
      ::unsetenv(v);
    }
    dir_ = std::filesystem::temp_directory_path() / ("ckptfs-cred-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_ / ".aws");
    ::setenv("HOME", dir_.c_str(), 1);
  }
  void TearDown() override {
    for (const char* v : kVars) ::unsetenv(v);
    for (const auto& [k, v] : saved_) ::setenv(k.c_str(), v.c_str(), 1);
    std::filesystem::remove_all(dir_);
  }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / ".aws" / name) << text;
  }
  std::vector<std::pair<std::string, std::string>> saved_;
  std::filesystem::path dir_;
};

TEST_F(Env, KeysFromTheEnvironment) {
  ::setenv("AWS_ACCESS_KEY_ID", "AK", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "SK", 1);
  ::setenv("AWS_SESSION_TOKEN", "TOK", 1);
  ::setenv("AWS_REGION", "eu-west-3", 1);
  const S3Config c = find_config({});
  EXPECT_EQ(c.access_key, "AK");
  EXPECT_EQ(c.secret_key, "SK");
  EXPECT_EQ(c.session_token, "TOK");
  EXPECT_EQ(c.region, "eu-west-3");
  EXPECT_EQ(c.endpoint, "");
}

TEST_F(Env, ProfileFromTheCredentialsFileAndRegionFromConfig) {
  write("credentials",
        "[default]\naws_access_key_id = D\naws_secret_access_key = DS\n"
        "# a comment\n[team]\naws_access_key_id=T\naws_secret_access_key=TS\n");
  write("config", "[default]\nregion = us-west-2\n[profile team]\nregion = ap-south-1\n");
  S3Config c = find_config({});
  EXPECT_EQ(c.access_key, "D");
  EXPECT_EQ(c.region, "us-west-2");
  ::setenv("AWS_PROFILE", "team", 1);
  c = find_config({});
  EXPECT_EQ(c.access_key, "T");
  EXPECT_EQ(c.secret_key, "TS");
  EXPECT_EQ(c.region, "ap-south-1");
  // --s3-profile wins over the environment's keys, as --profile does for the AWS tools.
  ::setenv("AWS_ACCESS_KEY_ID", "ENV", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "ENVS", 1);
  c = find_config({.endpoint = "", .profile = "default", .region = "r1"});
  EXPECT_EQ(c.access_key, "D");
  EXPECT_EQ(c.region, "r1");
}

TEST_F(Env, EndpointFromOptionOrEnvironment) {
  ::setenv("AWS_ACCESS_KEY_ID", "AK", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "SK", 1);
  ::setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000/", 1);
  EXPECT_EQ(find_config({}).endpoint, "http://127.0.0.1:9000");
  EXPECT_EQ(find_config({.endpoint = "https://obs.example", .profile = "", .region = ""}).endpoint,
            "https://obs.example");
  EXPECT_THROW(find_config({.endpoint = "ftp://x", .profile = "", .region = ""}), Error);
  EXPECT_EQ(find_config({}).region, "us-east-1");
}

// Requests per GET, retries included, as the AWS tools read them; a bad count is one line
// naming the variable.
TEST_F(Env, AttemptsFromAwsMaxAttempts) {
  ::setenv("AWS_ACCESS_KEY_ID", "AK", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "SK", 1);
  EXPECT_EQ(find_config({}).attempts, kDefaultAttempts);
  ::setenv("AWS_MAX_ATTEMPTS", "2", 1);
  EXPECT_EQ(find_config({}).attempts, 2);
  for (const char* bad : {"0", "21", "3x", "-1"}) {
    ::setenv("AWS_MAX_ATTEMPTS", bad, 1);
    try {
      find_config({});
      ADD_FAILURE() << bad << " was taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("AWS_MAX_ATTEMPTS"), std::string::npos) << e.what();
    }
  }
}

TEST_F(Env, NoKeysIsOneLineNamingTheProfileAndFile) {
  try {
    find_config({.endpoint = "", .profile = "missing", .region = ""});
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("[missing]"), std::string::npos) << m;
    EXPECT_NE(m.find("credentials"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  ::setenv("AWS_ACCESS_KEY_ID", "AK", 1);
  EXPECT_THROW(find_config({}), Error);  // no secret
}

}  // namespace
}  // namespace ckptfs::remote
