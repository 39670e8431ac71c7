#include "ckptfs/ckpt/scanner.h"

namespace ckptfs::ckpt {

const scan::FileReader kReader{
    scan::SourceFormat::Ckpt,
    [](std::string_view, std::string_view) { return true; },
    [](int fd, const std::string& name, const scan::ReadOptions& options) {
      return scan_checkpoint_fd(fd, name, ScanOptions{.verify_crc = options.verify_crc});
    },
};

}  // namespace ckptfs::ckpt
