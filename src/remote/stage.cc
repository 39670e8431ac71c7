#include "ckptfs/remote/stage.h"

#include <spdlog/spdlog.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>

#include "ckptfs/error.h"
#include "ckptfs/remote/objects.h"

namespace ckptfs::remote {

namespace fs = std::filesystem;

namespace {

// Objects read through ranged GETs; everything else is small and read whole by path.
bool is_data_object(const std::string& key) {
  const std::string name = fs::path(key).filename().string();
  if (name.find("strategy") != std::string::npos) return false;
  for (const char* ext : {".ckpt", ".safetensors", ".distcp", ".pt", ".pth", ".bin"})
    if (name.size() > std::strlen(ext) && name.ends_with(ext)) return true;
  return false;
}

// A key's path below the prefix, refused when it could leave the staged folder.
std::optional<fs::path> relative_path(const std::string& key, const std::string& prefix) {
  std::string rest = key.substr(prefix.size());
  while (!rest.empty() && rest.front() == '/') rest.erase(rest.begin());
  if (rest.empty() || rest.back() == '/') return std::nullopt;  // a "folder" marker
  fs::path out;
  for (const auto& part : fs::path(rest)) {
    if (part == ".." || part == "." || part.empty()) return std::nullopt;
    out /= part;
  }
  return out;
}

}  // namespace

bool is_s3_url(std::string_view path) { return path.starts_with("s3://"); }

Staged::~Staged() {
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

StageResult stage(const std::string& url, const S3Options& options, int stall_seconds) {
  const std::string rest = url.substr(5);
  const auto slash = rest.find('/');
  const std::string bucket = rest.substr(0, slash);
  std::string prefix = slash == std::string::npos ? "" : rest.substr(slash + 1);
  if (bucket.empty()) fail("{}: no bucket; write s3://BUCKET/PREFIX", url);
  // Without an endpoint the bucket is part of a host name: ':', '@', '#' or '?' in it would
  // send the signed request to another host.
  if (bucket.find_first_not_of(
          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_") != std::string::npos)
    fail(
        "{}: \"{}\" is not a bucket name (letters, digits, '.', '-' and '_'); write "
        "s3://BUCKET/PREFIX",
        url, bucket);
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  auto client = std::make_shared<const S3Client>(find_config(options), stall_seconds);
  // One listing answers both questions: is the URL one object (inspect FILE), or a prefix?
  std::vector<ObjectInfo> objects = client->list(bucket, prefix);
  const auto exact = std::find_if(objects.begin(), objects.end(),
                                  [&](const ObjectInfo& o) { return o.key == prefix; });
  const bool one_object = !prefix.empty() && exact != objects.end();
  if (one_object) {
    objects = {*exact};
    const auto cut = prefix.rfind('/');
    prefix = cut == std::string::npos ? "" : prefix.substr(0, cut + 1);
  } else {
    if (!prefix.empty()) prefix += '/';
    std::erase_if(objects, [&](const ObjectInfo& o) { return !o.key.starts_with(prefix); });
  }
  if (objects.empty()) fail("{}: no objects under this prefix (check the bucket and prefix)", url);

  const char* tmp = std::getenv("TMPDIR");
  std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/ckptfs-s3.XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr)
    fail("cannot make a folder for {} under {}: {}", url, templ, errno_text(errno));
  StageResult result;
  result.staged = std::make_unique<Staged>(templ);
  // The folder is named like the prefix, so listings and messages show its last part.
  std::string leaf =
      prefix.empty() ? bucket : fs::path(prefix.substr(0, prefix.size() - 1)).filename().string();
  result.dir = result.staged->dir() / leaf;
  fs::create_directories(result.dir);
  // The key each file was made for: "P/x" and "P//x" are one path, and whichever came last
  // would be served under it.
  std::map<fs::path, std::string> made;
  for (const ObjectInfo& o : objects) {
    const auto rel = relative_path(o.key, prefix);
    if (!rel) continue;
    if (const auto [it, fresh] = made.emplace(*rel, o.key); !fresh) {
      if (it->second == o.key) continue;  // listed twice
      fail(
          "s3://{}/{} and s3://{}/{} would be the same file {}; rename or remove one of them, "
          "or mount a prefix that holds only one",
          bucket, it->second, bucket, o.key, rel->string());
    }
    const fs::path local = result.dir / *rel;
    fs::create_directories(local.parent_path());
    ObjectRef ref{bucket, o};
    ++result.objects;
    if (is_data_object(o.key)) {
      std::ofstream(local).close();
      fs::resize_file(local, o.size);  // sparse: its bytes are never read
      register_object(local, std::move(ref), client);
      ++result.placeholders;
      continue;
    }
    if (o.size > (64u << 20))
      fail("{}: {} bytes; a non-checkpoint object over 64 MiB is not read whole", ref.url(),
           o.size);
    std::vector<uint8_t> bytes(o.size);
    const Get get{&ref, 0, std::span(bytes)};
    client->fetch(std::span(&get, 1));
    std::ofstream out(local, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    if (!out) fail("{}: cannot write {}", ref.url(), local.string());
  }
  if (one_object) result.dir /= fs::path(objects.front().key).filename();
  spdlog::debug("{}: {} objects, {} read by range", url, result.objects, result.placeholders);
  return result;
}

}  // namespace ckptfs::remote
