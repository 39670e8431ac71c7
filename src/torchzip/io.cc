#include "io.h"

#include <unistd.h>

#include <cerrno>

#include "ckptfs/error.h"
#include "ckptfs/remote/objects.h"
#include "ckptfs/util/eintr.h"

namespace ckptfs::torchzip {

void read_exact(int fd, const std::string& name, uint64_t offset, char* out, uint64_t length) {
  while (length > 0) {
    const ssize_t n =
        retry_eintr([&] { return remote::pread(fd, out, length, static_cast<off_t>(offset)); });
    if (n < 0)
      fail("{}: byte offset {}: read failed: {}", name, offset, remote::read_failure(errno));
    if (n == 0) fail("{}: byte offset {}: unexpected end of file", name, offset);
    out += n;
    offset += static_cast<uint64_t>(n);
    length -= static_cast<uint64_t>(n);
  }
}

}  // namespace ckptfs::torchzip
