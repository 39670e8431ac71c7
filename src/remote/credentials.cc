#include "ckptfs/remote/credentials.h"

#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <system_error>

#include "ckptfs/error.h"

namespace ckptfs::remote {

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return {};
  const auto e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

std::filesystem::path aws_file(const char* variable, const char* name) {
  if (std::string v = env(variable); !v.empty()) return v;
  return std::filesystem::path(env("HOME")) / ".aws" / name;
}

// The `key = value` lines of section `section` of an INI file; nullopt when the file or the
// section is missing.
std::optional<std::map<std::string, std::string>> ini_section(const std::filesystem::path& file,
                                                              const std::string& section) {
  std::ifstream in(file);
  if (!in) return std::nullopt;
  std::optional<std::map<std::string, std::string>> found;
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    line = trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      inside = trim(line.substr(1, line.size() - 2)) == section;
      if (inside && !found) found.emplace();
      continue;
    }
    const auto eq = line.find('=');
    if (inside && eq != std::string::npos)
      (*found)[trim(line.substr(0, eq))] = trim(line.substr(eq + 1));
  }
  return found;
}

}  // namespace

S3Config find_config(const S3Options& options) {
  S3Config config;
  const std::string profile = !options.profile.empty()
                                  ? options.profile
                                  : (env("AWS_PROFILE").empty() ? "default" : env("AWS_PROFILE"));
  const bool from_env = options.profile.empty() && !env("AWS_ACCESS_KEY_ID").empty();
  if (from_env) {
    config.access_key = env("AWS_ACCESS_KEY_ID");
    config.secret_key = env("AWS_SECRET_ACCESS_KEY");
    config.session_token = env("AWS_SESSION_TOKEN");
    config.keys_from = "the environment (AWS_ACCESS_KEY_ID)";
    if (config.secret_key.empty())
      fail(
          "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not: set both, or neither "
          "to use a profile");
  } else {
    const std::filesystem::path file = aws_file("AWS_SHARED_CREDENTIALS_FILE", "credentials");
    const auto section = ini_section(file, profile);
    if (!section)
      fail(
          "no S3 keys: neither AWS_ACCESS_KEY_ID nor profile [{}] in {} (set the variables, "
          "or --s3-profile / AWS_PROFILE to a profile of that file)",
          profile, file.string());
    auto get = [&](const char* k) {
      const auto it = section->find(k);
      return it == section->end() ? std::string() : it->second;
    };
    config.access_key = get("aws_access_key_id");
    config.secret_key = get("aws_secret_access_key");
    config.session_token = get("aws_session_token");
    config.keys_from = "profile [" + profile + "] of " + file.string();
    if (config.access_key.empty() || config.secret_key.empty())
      fail("{}: profile [{}] lacks aws_access_key_id or aws_secret_access_key", file.string(),
           profile);
  }
  config.region = options.region;
  if (config.region.empty()) config.region = env("AWS_REGION");
  if (config.region.empty()) config.region = env("AWS_DEFAULT_REGION");
  if (config.region.empty()) {
    const std::string section = profile == "default" ? profile : "profile " + profile;
    if (auto s = ini_section(aws_file("AWS_CONFIG_FILE", "config"), section))
      if (auto it = s->find("region"); it != s->end()) config.region = it->second;
  }
  if (config.region.empty()) config.region = "us-east-1";
  config.endpoint = options.endpoint;
  if (config.endpoint.empty()) config.endpoint = env("AWS_ENDPOINT_URL_S3");
  if (config.endpoint.empty()) config.endpoint = env("AWS_ENDPOINT_URL");
  while (!config.endpoint.empty() && config.endpoint.back() == '/') config.endpoint.pop_back();
  if (!config.endpoint.empty() && config.endpoint.rfind("http://", 0) != 0 &&
      config.endpoint.rfind("https://", 0) != 0)
    fail("--s3-endpoint {}: not an http:// or https:// URL", config.endpoint);
  if (const std::string attempts = env("AWS_MAX_ATTEMPTS"); !attempts.empty()) {
    const auto [end, ec] =
        std::from_chars(attempts.data(), attempts.data() + attempts.size(), config.attempts);
    if (ec != std::errc() || end != attempts.data() + attempts.size() || config.attempts < 1 ||
        config.attempts > 20)
      fail("AWS_MAX_ATTEMPTS=\"{}\": expected a count of requests from 1 to 20 (retries included)",
           attempts);
  }
  return config;
}

}  // namespace ckptfs::remote
