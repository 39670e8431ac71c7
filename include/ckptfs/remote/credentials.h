// Where an S3 request goes and who signs it, found the way the AWS tools find them:
//   keys:    --s3-profile's section of the shared credentials file, else AWS_ACCESS_KEY_ID /
//            AWS_SECRET_ACCESS_KEY (/ AWS_SESSION_TOKEN), else the section of AWS_PROFILE (or
//            "default") in AWS_SHARED_CREDENTIALS_FILE (or ~/.aws/credentials);
//   region:  --s3-region, AWS_REGION, AWS_DEFAULT_REGION, the profile's `region` in
//            AWS_CONFIG_FILE (or ~/.aws/config), else us-east-1;
//   endpoint: --s3-endpoint, AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL (path-style addressing:
//            ENDPOINT/BUCKET/KEY), else https://BUCKET.s3.REGION.amazonaws.com/KEY.
// Stateless; safe from any thread.
#pragma once

#include <string>

namespace ckptfs::remote {

// What the command line says (empty: not given).
struct S3Options {
  std::string endpoint;
  std::string profile;
  std::string region;
};

inline constexpr int kDefaultAttempts = 6;

struct S3Config {
  std::string access_key;
  std::string secret_key;
  std::string session_token;  // empty: none
  std::string region;
  std::string endpoint;   // without a trailing slash; empty: AWS's virtual-hosted endpoint
  std::string keys_from;  // "the environment" or "profile X in FILE", for messages
  // Requests sent for one GET or listing page, retries included: AWS_MAX_ATTEMPTS, as the AWS
  // tools read it (1 to 20), else 6.
  int attempts = kDefaultAttempts;
};

// Throws Error naming the profile, file or variable when no keys are found or a file is bad.
S3Config find_config(const S3Options& options);

}  // namespace ckptfs::remote
