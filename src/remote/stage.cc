#include "ckptfs/remote/stage.h"

#include <limits.h>
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

// Where each object goes in the staged folder (its index in `objects` by relative path),
// refusing, with the keys' URLs, what a folder cannot hold: "P/x" and "P//x" are one path
// (whichever came last would be served under it), "P/a" beside "P/a/b" needs `a` to be a file
// and a folder, and a file name holds at most NAME_MAX bytes.
std::map<fs::path, size_t> layout(const std::vector<ObjectInfo>& objects, const std::string& bucket,
                                  const std::string& prefix) {
  std::map<fs::path, size_t> files;
  std::map<fs::path, size_t> folders;  // a folder's path, by the first key that needs it
  for (size_t i = 0; i < objects.size(); ++i) {
    const std::string& key = objects[i].key;
    const auto rel = relative_path(key, prefix);
    if (!rel) continue;
    for (const auto& part : *rel)
      if (part.native().size() > NAME_MAX)
        fail(
            "s3://{}/{}: a part of its key is {} bytes, over the {} a file name holds; rename "
            "it, or mount a prefix that does not hold it",
            bucket, key, part.native().size(), NAME_MAX);
    if (const auto [it, fresh] = files.emplace(*rel, i); !fresh) {
      if (objects[it->second].key == key) continue;  // listed twice
      fail(
          "s3://{}/{} and s3://{}/{} would be the same file {}; rename or remove one of them, "
          "or mount a prefix that holds only one",
          bucket, objects[it->second].key, bucket, key, rel->string());
    }
    for (fs::path up = rel->parent_path(); !up.empty(); up = up.parent_path())
      folders.emplace(up, i);
  }
  for (const auto& [path, at] : files)
    if (const auto it = folders.find(path); it != folders.end())
      fail(
          "s3://{}/{} and s3://{}/{}: {} would be both a file and a folder; rename or remove "
          "one of them, or mount a prefix that holds only one",
          bucket, objects[at].key, bucket, objects[it->second].key, path.string());
  return files;
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
  for (const auto& [rel, at] : layout(objects, bucket, prefix)) {
    const ObjectInfo& o = objects[at];
    const fs::path local = result.dir / rel;
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
