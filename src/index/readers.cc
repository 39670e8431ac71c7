#include "ckptfs/index/readers.h"

#include <array>

#include "ckptfs/ckpt/scanner.h"
#include "ckptfs/safetensors/scanner.h"
#include "ckptfs/torchzip/torch_file.h"

namespace ckptfs::index {

scan::Readers mindspore_readers() {
  // A torch.save file is told by its first bytes whatever its name (.pt, .pth, .bin); the
  // .ckpt reader takes what is left; an encrypted .ckpt is told by its magic.
  static const std::array<const scan::FileReader*, 4> readers{
      &ckpt::kEncryptedReader, &torchzip::kReader, &safetensors::kReader, &ckpt::kReader};
  return readers;
}

}  // namespace ckptfs::index
