#include "ckptfs/source/source_file.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "ckptfs/error.h"
#include "ckptfs/remote/objects.h"
#include "ckptfs/util/open_path.h"

namespace ckptfs::source {

namespace {

void put_big_endian(std::string& out, uint64_t value) {
  for (int shift = 56; shift >= 0; shift -= 8) out.push_back(static_cast<char>(value >> shift));
}

uint64_t get_big_endian(std::string_view bytes) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value = value << 8 | static_cast<uint8_t>(bytes[i]);
  return value;
}

// An S3 object's identity: its key and ETag, not its placeholder's inode and times.
std::optional<Fingerprint> remote_fingerprint(int fd) {
  const remote::ObjectRef* object = remote::object_of(fd);
  if (object == nullptr) return std::nullopt;
  const remote::Identity id = remote::identity(*object);
  return Fingerprint{id.dev, id.ino, id.size, id.mtime_ns, id.ctime_ns};
}

}  // namespace

Fingerprint Fingerprint::from_stat(const struct stat& st) {
  Fingerprint fp;
  fp.dev = static_cast<uint64_t>(st.st_dev);
  fp.ino = static_cast<uint64_t>(st.st_ino);
  fp.size = static_cast<uint64_t>(st.st_size);
  fp.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  fp.ctime_ns = static_cast<int64_t>(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec;
  return fp;
}

std::string Fingerprint::key() const {
  std::string out;
  out.reserve(kKeySize);
  put_big_endian(out, dev);
  put_big_endian(out, ino);
  put_big_endian(out, size);
  put_big_endian(out, static_cast<uint64_t>(mtime_ns));
  put_big_endian(out, static_cast<uint64_t>(ctime_ns));
  return out;
}

std::optional<Fingerprint> Fingerprint::from_key(std::string_view key) {
  if (key.size() != kKeySize) return std::nullopt;
  Fingerprint fp;
  fp.dev = get_big_endian(key.substr(0, 8));
  fp.ino = get_big_endian(key.substr(8, 8));
  fp.size = get_big_endian(key.substr(16, 8));
  fp.mtime_ns = static_cast<int64_t>(get_big_endian(key.substr(24, 8)));
  fp.ctime_ns = static_cast<int64_t>(get_big_endian(key.substr(32, 8)));
  return fp;
}

Fingerprint fingerprint_of(int fd, const std::string& display_name) {
  if (auto remote = remote_fingerprint(fd)) return *remote;
  struct stat st;
  if (::fstat(fd, &st) != 0) fail("{}: fstat failed: {}", display_name, std::strerror(errno));
  return Fingerprint::from_stat(st);
}

SourceFile SourceFile::open(const std::filesystem::path& path) {
  return adopt(path, util::open_regular(path, "checkpoint file"));
}

SourceFile SourceFile::adopt(const std::filesystem::path& path, UniqueFd fd) {
  SourceFile file;
  file.path = path;
  file.fd = std::move(fd);
  // Watched first, fingerprinted after: a write in between is in the fingerprint.
  if (auto remote = remote_fingerprint(file.fd.get())) {
    // Nothing writes the placeholder; each GET checks the object's ETag instead.
    file.fingerprint = *remote;
    return file;
  }
  file.writes = WriteWatch::of(file.fd.get());
  struct stat st;
  if (::fstat(file.fd.get(), &st) != 0) {
    fail("{}: fstat failed: {}", path.string(), std::strerror(errno));
  }
  file.fingerprint = Fingerprint::from_stat(st);
  return file;
}

bool SourceFile::unchanged() const {
  // An object's every GET is checked against its ETag (If-Match): a changed one fails there.
  if (fingerprint.dev == remote::kIdentityDev) return true;
  struct stat st;
  if (!fd || ::fstat(fd.get(), &st) != 0) return false;
  Fingerprint now = Fingerprint::from_stat(st);
  // The unlink (or a rename over the file) moved the ctime; without a name, only a descriptor
  // held from before can write it, and the watch reports that.
  if (st.st_nlink == 0 && !writes.written()) now.ctime_ns = fingerprint.ctime_ns;
  return now == fingerprint;
}

}  // namespace ckptfs::source
