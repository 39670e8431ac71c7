// The session's traffic with /dev/fuse: plain read, writev and splice, except that the INIT
// reply also asks for FUSE_DIRECT_IO_ALLOW_MMAP when the kernel offers it (shared mmap of files
// opened with direct_io), a flag libfuse 3.14 cannot ask for, and a read the kernel fails with
// ECONNABORTED (a request caught by the connection's shutdown) fails with ENODEV, the end of
// the session libfuse knows. Private to the fs module.
#pragma once

#include <sys/uio.h>

#include "fuse_ops.h"

namespace ckptfs::fs::detail {

// Installs it on a session made by mount.cc (its userdata is the Server, whose
// direct_io_mmap records what INIT settled), after fuse_session_mount and before serving.
// Returns 0 or -errno (then the session talks to the device as libfuse does by itself).
int install_device_io(fuse_session* se);

// Its read and writev, `userdata` being the Server (for tests).
ssize_t device_read(int fd, void* buf, size_t len, void* userdata);
ssize_t device_writev(int fd, struct iovec* iov, int count, void* userdata);

}  // namespace ckptfs::fs::detail
