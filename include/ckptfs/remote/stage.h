// `s3://BUCKET/PREFIX` as a source directory: the objects under PREFIX are listed once, and a
// private temporary folder gets the same tree, where each checkpoint data object (.ckpt,
// .safetensors, .distcp, .pt, .pth, .bin, but strategy files) is a placeholder registered with
// remote/objects.h and every other object (strategies, metadata, name maps: small files read
// whole) is downloaded, its ETag checked. Discovery, families and the planner then work on that
// folder as on any other; the data objects' bytes come only from ranged GETs.
// Thread-safety: stage() runs before any reader (single-threaded).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "ckptfs/remote/credentials.h"

namespace ckptfs::remote {

bool is_s3_url(std::string_view path);

// The staged folder, removed with its tree on destruction (the placeholders' open descriptors
// stay valid: their objects are read by identity, not by path).
class Staged {
 public:
  explicit Staged(std::filesystem::path dir) : dir_(std::move(dir)) {}
  Staged(const Staged&) = delete;
  Staged& operator=(const Staged&) = delete;
  ~Staged();
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
};

struct StageResult {
  std::unique_ptr<Staged> staged;
  // The folder that stands for the URL (below staged->dir()), or the file when the URL names
  // one object (`inspect s3://BUCKET/KEY`).
  std::filesystem::path dir;
  uint64_t objects = 0, placeholders = 0;
};

// Lists `url` and stages it. Throws Error with one line naming the URL and what to do: a bad
// URL, no keys, an S3 error answer (wrong keys, no such bucket), no objects under the prefix.
StageResult stage(const std::string& url, const S3Options& options, int stall_seconds);

}  // namespace ckptfs::remote
