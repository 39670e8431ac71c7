// The source backend: a source file the rest of the program opens by path and descriptor may
// stand for an S3 object. Such a file is a placeholder (remote/stage.h): a sparse file of the
// object's size whose bytes are never read; the object it stands for is registered here by the
// placeholder's device and inode, so whoever reads a source asks object_of(fd) first and, for an
// object, reads through it: the header scanners through read_exact/pread below, the fs layer's
// gathers through client().fetch with the runs of a request coalesced.
//
// An object's identity is its bucket, key, size and ETag (identity()): the index keys its scan by
// that, and every GET is checked against it (remote/s3_client.h).
//
// Thread-safety: objects are registered before any reader runs (single-threaded, at stage
// time); afterwards every function may be called from any thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>

#include "ckptfs/remote/s3_client.h"

namespace ckptfs::remote {

// The five words of source::Fingerprint for an object: no device or inode, but a fixed device
// tag, a hash of the endpoint, bucket and key, the size, and two hashes of the ETag.
inline constexpr uint64_t kIdentityDev = 0x5333'0000'0000'0000ULL;  // "S3": no real device
struct Identity {
  uint64_t dev = 0, ino = 0, size = 0;
  int64_t mtime_ns = 0, ctime_ns = 0;
};

// Registers `placeholder` (an existing file) as standing for `object`, read with `client`.
void register_object(const std::filesystem::path& placeholder, ObjectRef object,
                     std::shared_ptr<const S3Client> client);

// Forgets `placeholder`'s registration (a no-op for a file not registered); once none is left,
// any_registered() is false and client() fails again. For a caller that stages objects for a
// while only (a test): call it before removing the placeholder, whose inode a later file may get,
// and, like register_object, while no reader runs.
void unregister_object(const std::filesystem::path& placeholder);

// Whether any placeholder is registered (a mount of s3:// sources).
bool any_registered();

// The object the open descriptor `fd` stands for, or null for an ordinary file (and whenever
// nothing is registered, at the cost of one relaxed load).
const ObjectRef* object_of(int fd);
// The object the file at `path` stands for (a registered placeholder), or null.
const ObjectRef* object_at(const std::filesystem::path& path);
// The name the index keeps a source under and messages give it: an object's s3:// URL (the
// same at every mount, while its placeholder's temp folder is new each time), else the absolute,
// normalized path.
std::string source_name(const std::filesystem::path& path);
Identity identity(const ObjectRef& object);
// The client of the registered objects; only valid once one is registered.
const S3Client& client();

// Exactly out.size() bytes at `offset` of `fd`'s object, through a per-thread window of
// kScanWindow bytes (a header scan's many small reads become few GETs). Throws Error naming
// the object and offset (past its end: "ended early").
void read_exact(const ObjectRef& object, uint64_t offset, std::span<uint8_t> out);
inline constexpr uint64_t kScanWindow = 256 << 10;

// pread(2) that reads `fd`'s object when it stands for one: at most `count` bytes, fewer only at
// the object's end; -1 with errno EIO when the object cannot be read, the reason kept for
// read_failure (and logged at debug level: the caller's one line gives it).
ssize_t pread(int fd, void* buf, size_t count, off_t offset);

// Why this thread's last failed pread failed: the object's reason (naming its URL and offset)
// when it was an object's, else strerror(err). Taken once: a later call gives strerror(err).
std::string read_failure(int err);

}  // namespace ckptfs::remote
