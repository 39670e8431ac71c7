// s3://BUCKET/PREFIX wherever a command takes a source directory: the --s3-* options, and the
// prefix staged (remote/stage.h) once the command line is parsed, before the command runs.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace ckptfs::cli {

// Adds --s3-endpoint, --s3-profile, --s3-region and --s3-timeout to `command`, and stages
// `src_dir` when it is an s3:// URL once `command` is parsed: `src_dir` then names the staged
// folder, which lives until the process exits.
void add_s3_source(CLI::App* command, std::string& src_dir);

// The URL the source directory was staged from, or "" when it is a local one.
const std::string& s3_source_url();

}  // namespace ckptfs::cli
