// Reading an exact byte range of a file, for the header scanners.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <utility>

#include "ckptfs/error.h"
#include "ckptfs/remote/objects.h"
#include "ckptfs/util/eintr.h"

namespace ckptfs {

// Reads exactly out.size() bytes at `offset`; a short file is an Error naming `name` and the
// offset, not a partial result. A descriptor standing for an S3 object reads the object.
inline void pread_exact(int fd, const std::string& name, uint64_t offset, std::span<uint8_t> out) {
  if (const remote::ObjectRef* object = remote::object_of(fd)) {
    remote::read_exact(*object, offset, out);
    return;
  }
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = retry_eintr([&] {
      return ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    });
    if (n < 0) {
      fail("{}: byte offset {}: read failed: {}", name, offset + done, std::strerror(errno));
    }
    if (n == 0)
      fail("{}: byte offset {}: file ended early (was it truncated?)", name, offset + done);
    done += static_cast<size_t>(n);
  }
}

// What the header scanners read through: exactly out.size() bytes at `offset`, or an Error. A
// file's is pread_exact on its descriptor; a mounted view's reads its virtual bytes.
using ReadExact = std::function<void(uint64_t offset, std::span<uint8_t> out)>;

inline ReadExact read_exact_from(int fd, std::string name) {
  return [fd, name = std::move(name)](uint64_t offset, std::span<uint8_t> out) {
    pread_exact(fd, name, offset, out);
  };
}

}  // namespace ckptfs
