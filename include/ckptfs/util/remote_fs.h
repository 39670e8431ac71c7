// Whether a file lives on a filesystem where every read is a network round trip (FUSE clients
// such as s3fs or mountpoint-s3, NFS, SMB/CIFS, Ceph, 9P, AFS...). Such filesystems charge per
// request far more than per byte, so the header scanners read them in large sequential requests
// instead of small jumps. Thread-safe; never throws.
#pragma once

#include <sys/vfs.h>

#include <array>
#include <cstdint>

namespace ckptfs {

// The f_type values of statfs(2) for network and user-space filesystems (linux/magic.h and the
// filesystems' own sources; not all are in every kernel's header, so they are listed here).
inline constexpr uint64_t kFuseMagic = 0x65735546;
inline constexpr std::array<uint64_t, 10> kRemoteFsMagics = {
    kFuseMagic,  // FUSE (s3fs, mountpoint-s3, gcsfuse, sshfs, ...)
    0x6969,      // NFS
    0xFF534D42,  // CIFS
    0xFE534D42,  // SMB2
    0x517B,      // SMB
    0x00C36400,  // Ceph
    0x01021997,  // 9P
    0x5346414F,  // AFS
    0x6B414653,  // kAFS
    0x47504653,  // GPFS
};

inline bool is_remote_fs_magic(uint64_t f_type) noexcept {
  for (const uint64_t magic : kRemoteFsMagics)
    if (f_type == magic) return true;
  return false;
}

// True if `fd` is on one of those filesystems; false when fstatfs fails (a local guess costs
// only speed).
inline bool on_remote_filesystem(int fd) noexcept {
  struct statfs st;
  if (::fstatfs(fd, &st) != 0) return false;
  return is_remote_fs_magic(static_cast<uint64_t>(static_cast<uint32_t>(st.f_type)));
}

// True if `fd` is on a FUSE filesystem, whose daemon reports whatever timestamps it likes (s3fs
// lets utimens set the ctime it reports); false when fstatfs fails.
inline bool on_fuse_filesystem(int fd) noexcept {
  struct statfs st;
  return ::fstatfs(fd, &st) == 0 && static_cast<uint32_t>(st.f_type) == kFuseMagic;
}
// The same for the file `path` names (following symlinks); false when statfs fails.
inline bool on_fuse_filesystem(const char* path) noexcept {
  struct statfs st;
  return ::statfs(path, &st) == 0 && static_cast<uint32_t>(st.f_type) == kFuseMagic;
}

}  // namespace ckptfs
