#include "ckptfs/remote/objects.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "ckptfs/error.h"

namespace ckptfs::remote {

namespace {

struct Registered {
  ObjectRef object;
  std::shared_ptr<const S3Client> client;
};

// Keyed by the placeholder's (device, inode). Written only at stage time, before readers run.
std::map<std::pair<uint64_t, uint64_t>, Registered>& registry() {
  static std::map<std::pair<uint64_t, uint64_t>, Registered> r;
  return r;
}
std::atomic<bool> g_any{false};
std::shared_ptr<const S3Client> g_client;

uint64_t fnv1a(std::string_view s, uint64_t seed) {
  uint64_t h = seed;
  for (const char c : s) {
    h ^= static_cast<uint8_t>(c);
    h *= 1099511628211ULL;
  }
  return h;
}

thread_local std::string t_failure;  // remote::pread's last reason, for read_failure

// The last window a scan on this thread read.
struct Window {
  const ObjectRef* object = nullptr;
  uint64_t offset = 0;
  std::vector<uint8_t> bytes;
};

}  // namespace

void register_object(const std::filesystem::path& placeholder, ObjectRef object,
                     std::shared_ptr<const S3Client> client) {
  struct stat st;
  if (::stat(placeholder.c_str(), &st) != 0)
    fail("{}: cannot stat the placeholder of {}: {}", placeholder.string(), object.url(),
         errno_text(errno));
  g_client = client;
  registry()[{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)}] =
      Registered{std::move(object), std::move(client)};
  g_any.store(true, std::memory_order_release);
}

void unregister_object(const std::filesystem::path& placeholder) {
  struct stat st;
  if (::stat(placeholder.c_str(), &st) != 0) return;  // never registered: it must exist
  registry().erase({static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)});
  if (!registry().empty()) return;
  g_any.store(false, std::memory_order_release);
  g_client.reset();
}

namespace {

const ObjectRef* registered(const struct stat& st) {
  const auto it =
      registry().find({static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)});
  return it == registry().end() ? nullptr : &it->second.object;
}

}  // namespace

bool any_registered() { return g_any.load(std::memory_order_acquire); }

const ObjectRef* object_of(int fd) {
  if (!g_any.load(std::memory_order_acquire)) return nullptr;
  struct stat st;
  if (::fstat(fd, &st) != 0) return nullptr;
  return registered(st);
}

const ObjectRef* object_at(const std::filesystem::path& path) {
  if (!g_any.load(std::memory_order_acquire)) return nullptr;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return nullptr;
  return registered(st);
}

std::string source_name(const std::filesystem::path& path) {
  if (const ObjectRef* object = object_at(path)) return object->url();
  std::error_code ec;
  const std::filesystem::path absolute = std::filesystem::absolute(path, ec);
  return (ec ? path : absolute.lexically_normal()).string();
}

Identity identity(const ObjectRef& object) {
  const std::string where =
      client().config().endpoint + "/" + object.bucket + "/" + object.info.key;
  Identity id;
  id.dev = kIdentityDev;
  id.ino = fnv1a(where, 14695981039346656037ULL);
  id.size = object.info.size;
  id.mtime_ns = static_cast<int64_t>(fnv1a(object.info.etag, 14695981039346656037ULL) >> 1);
  id.ctime_ns = static_cast<int64_t>(fnv1a(object.info.etag, 0x9e3779b97f4a7c15ULL) >> 1);
  return id;
}

const S3Client& client() {
  if (!g_client) fail("no S3 object is registered");
  return *g_client;
}

void read_exact(const ObjectRef& object, uint64_t offset, std::span<uint8_t> out) {
  if (out.empty()) return;
  if (offset > object.info.size || out.size() > object.info.size - offset)
    fail("{}: byte offset {}: object ended early (it has {} bytes)", object.url(), offset,
         object.info.size);
  thread_local Window w;
  const bool inside =
      w.object == &object && offset >= w.offset && offset + out.size() <= w.offset + w.bytes.size();
  if (!inside) {
    // Large reads go straight through; small ones fetch a window from their offset on.
    if (out.size() >= kScanWindow) {
      const Get get{&object, offset, out};
      client().fetch(std::span(&get, 1));
      return;
    }
    w.object = nullptr;
    w.offset = offset;
    w.bytes.resize(std::min<uint64_t>(kScanWindow, object.info.size - offset));
    const Get get{&object, offset, std::span(w.bytes)};
    client().fetch(std::span(&get, 1));
    w.object = &object;
  }
  std::memcpy(out.data(), w.bytes.data() + (offset - w.offset), out.size());
}

ssize_t pread(int fd, void* buf, size_t count, off_t offset) {
  t_failure.clear();
  const ObjectRef* object = object_of(fd);
  if (object == nullptr) return ::pread(fd, buf, count, offset);
  const auto at = static_cast<uint64_t>(offset);
  if (at >= object->info.size) return 0;
  const size_t n = static_cast<size_t>(std::min<uint64_t>(count, object->info.size - at));
  try {
    read_exact(*object, at, std::span(static_cast<uint8_t*>(buf), n));
  } catch (const std::exception& e) {
    spdlog::debug("{}", e.what());
    t_failure = e.what();
    errno = EIO;
    return -1;
  }
  return static_cast<ssize_t>(n);
}

std::string read_failure(int err) {
  if (t_failure.empty()) return std::strerror(err);
  return std::exchange(t_failure, {});
}

}  // namespace ckptfs::remote
