#include <unistd.h>

#include "ckptfs/ckpt/scanner.h"
#include "ckptfs/remote/objects.h"

namespace ckptfs::ckpt {

const scan::FileReader kReader{
    scan::SourceFormat::Ckpt,
    [](std::string_view, std::string_view) { return true; },
    [](int fd, const std::string& name, const scan::ReadOptions& options) {
      return scan_checkpoint_fd(fd, name, ScanOptions{.verify_crc = options.verify_crc});
    },
};

bool opens_like_checkpoint(int fd) noexcept {
  unsigned char first = 0;
  const ssize_t got = remote::pread(fd, &first, 1, 0);
  return got == 0 || (got == 1 && first == 0x0A);
}

}  // namespace ckptfs::ckpt
