#include "ckptfs/safetensors/scanner.h"

namespace ckptfs::safetensors {

const scan::FileReader kReader{
    scan::SourceFormat::Safetensors,
    [](std::string_view name, std::string_view) { return is_safetensors_name(name); },
    [](int fd, const std::string& name, const scan::ReadOptions&) {
      return scan_safetensors_fd(fd, name);
    },
};

}  // namespace ckptfs::safetensors
