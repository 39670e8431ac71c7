#include "ckptfs/torchzip/torch_file.h"

namespace ckptfs::torchzip {

const scan::FileReader kReader{
    scan::SourceFormat::TorchZip,
    [](std::string_view, std::string_view head) {
      return head.size() == scan::kHeadBytes && looks_like_torch(head);
    },
    [](int fd, const std::string& name, const scan::ReadOptions&) {
      return scan_torch_fd(fd, name);
    },
};

}  // namespace ckptfs::torchzip
