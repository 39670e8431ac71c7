#include "device_io.h"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

namespace ckptfs::fs::detail {

namespace {

// From the kernel's uapi fuse.h (the system header may predate them).
constexpr uint32_t kOpInit = 26;
constexpr uint32_t kInitExt = 1u << 30;                    // flags2 is there
constexpr uint32_t kDirectIoAllowMmap = 1u << (36 - 32);   // a flags2 bit
constexpr size_t kInHeader = 40;                           // fuse_in_header
constexpr size_t kOutHeader = 16;                          // fuse_out_header
constexpr size_t kInitInFlags = 12, kInitInFlags2 = 16;    // in fuse_init_in
constexpr size_t kInitOutFlags = 12, kInitOutFlags2 = 32;  // in fuse_init_out

template <typename T>
T load(const void* base, size_t at) {
  T v;
  std::memcpy(&v, static_cast<const char*>(base) + at, sizeof v);
  return v;
}

DirectIoMmap& state(void* userdata) { return static_cast<Server*>(userdata)->direct_io_mmap; }

// The kernel fails a read with ECONNABORTED instead of ENODEV when the connection is shut down
// (by a plain unmount too) just as it hands the reading thread a request. libfuse ends the
// session cleanly on ENODEV only and reports anything else as a failure, so an unmount racing a
// RELEASE made the daemon exit 1. FUSE_ABORT_ERROR, the only thing that gives ECONNABORTED a
// meaning of its own, is never negotiated: both say the connection is gone.
ssize_t gone_as_enodev(ssize_t n) {
  if (n < 0 && errno == ECONNABORTED) errno = ENODEV;
  return n;
}

ssize_t device_splice(int fdin, off_t* offin, int fdout, off_t* offout, size_t len,
                      unsigned int flags, void*) {
  return gone_as_enodev(::splice(fdin, offin, fdout, offout, len, flags));
}

}  // namespace

ssize_t device_read(int fd, void* buf, size_t len, void* userdata) {
  const ssize_t n = gone_as_enodev(::read(fd, buf, len));
  // INIT comes first and alone: nothing else is in flight while it is answered.
  if (n >= static_cast<ssize_t>(kInHeader + kInitInFlags2 + 4) &&
      load<uint32_t>(buf, 4) == kOpInit) {
    DirectIoMmap& s = state(userdata);
    const uint32_t flags = load<uint32_t>(buf, kInHeader + kInitInFlags);
    const uint32_t flags2 = load<uint32_t>(buf, kInHeader + kInitInFlags2);
    s.offered = (flags & kInitExt) != 0 && (flags2 & kDirectIoAllowMmap) != 0;
    s.init_unique = load<uint64_t>(buf, 8);
  }
  return n;
}

ssize_t device_writev(int fd, struct iovec* iov, int count, void* userdata) {
  DirectIoMmap& s = state(userdata);
  const uint64_t init = s.init_unique.load();
  if (init != 0 && count == 2 && iov[0].iov_len == kOutHeader &&
      load<uint64_t>(iov[0].iov_base, 8) == init) {
    s.init_unique = 0;
    std::array<char, 256> reply;
    const size_t size = iov[1].iov_len;
    if (s.offered && load<int32_t>(iov[0].iov_base, 4) == 0 && size >= kInitOutFlags2 + 4 &&
        size <= reply.size() && (load<uint32_t>(iov[1].iov_base, kInitOutFlags) & kInitExt) != 0) {
      std::memcpy(reply.data(), iov[1].iov_base, size);
      const uint32_t flags2 = load<uint32_t>(reply.data(), kInitOutFlags2) | kDirectIoAllowMmap;
      std::memcpy(reply.data() + kInitOutFlags2, &flags2, sizeof flags2);
      struct iovec out[2] = {iov[0], {reply.data(), size}};
      // Before the write: the kernel may send OPENs to other threads as soon as it has INIT.
      s.granted = true;
      const ssize_t n = ::writev(fd, out, 2);
      if (n < 0) s.granted = false;
      return n;
    }
  }
  return ::writev(fd, iov, count);
}

int install_device_io(fuse_session* se) {
  // All four: libfuse only splices through a custom io that can.
  const fuse_custom_io io{device_writev, device_read, device_splice, device_splice};
  return fuse_session_custom_io(se, &io, fuse_session_fd(se));
}

}  // namespace ckptfs::fs::detail
