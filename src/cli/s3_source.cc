#include "s3_source.h"

#include <CLI/CLI.hpp>
#include <memory>

#include "ckptfs/remote/stage.h"

namespace ckptfs::cli {

namespace {

struct S3Args {
  remote::S3Options options;
  int timeout = 10;
};

std::unique_ptr<remote::Staged>& staged() {
  static std::unique_ptr<remote::Staged> s;
  return s;
}

std::string& url() {
  static std::string u;
  return u;
}

}  // namespace

void add_s3_source(CLI::App* command, std::string& src_dir) {
  auto args = std::make_shared<S3Args>();
  command->add_option("--s3-endpoint", args->options.endpoint,
                      "With an s3://BUCKET/PREFIX source: the URL of an S3-compatible store "
                      "(path-style addressing; default AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, "
                      "else AWS's own endpoint)");
  command->add_option("--s3-profile", args->options.profile,
                      "With an s3:// source: the profile of ~/.aws/credentials whose keys sign "
                      "the requests (default: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, else "
                      "AWS_PROFILE, else [default])");
  command->add_option("--s3-region", args->options.region,
                      "With an s3:// source: the region requests are signed for (default "
                      "AWS_REGION, AWS_DEFAULT_REGION, the profile's, else us-east-1)");
  command
      ->add_option("--s3-timeout", args->timeout,
                   "With an s3:// source: seconds a request may stall before it is retried")
      ->check(CLI::Range(1, 3600));
  command->parse_complete_callback([args, &src_dir] {
    if (!remote::is_s3_url(src_dir)) return;
    url() = src_dir;
    remote::StageResult r = remote::stage(src_dir, args->options, args->timeout);
    staged() = std::move(r.staged);
    src_dir = r.dir.string();
  });
}

const std::string& s3_source_url() { return url(); }

}  // namespace ckptfs::cli
