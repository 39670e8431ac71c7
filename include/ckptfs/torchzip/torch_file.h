// A torch.save file (spec §2, §3) read into the same FileScan the .ckpt scanner produces: one
// Param per tensor occurrence, a strided view into its storage record (dtype as a safetensors
// code, shape, strides, storage offset, and the record's absolute byte range), and the rest of
// the object as JSON in FileScan::tree. Only the zip directory, data.pkl and the small
// version/byteorder records are read; tensor bytes never are. Stateless; thread-safe.
#pragma once

#include <string>
#include <string_view>

#include "ckptfs/scan/file_scan.h"
#include "ckptfs/scan/reader.h"

namespace ckptfs::torchzip {

// Limit of spec §2.7.
inline constexpr uint64_t kMaxPickleBytes = uint64_t{1} << 30;

// True if `head` (the first bytes of a file, 4 or more) starts like a torch.save file of any
// era (zip, or the legacy pickle stream, which scan_torch_fd then refuses clearly).
bool looks_like_torch(std::string_view head);

// Throws Error naming `display_name` (and the record, byte offset or global) for: another
// container, a TorchScript archive, a missing or unsupported version record, big-endian
// storages, a missing data.pkl, anything the pickle machine refuses, and tensors outside
// their storage records.
scan::FileScan scan_torch_fd(int fd, const std::string& display_name);
// The same for a torch.save archive of `size` bytes at file offset `base` of a larger file (a DCP
// .distcp item), checked the same way; extents are absolute file offsets. The scan's file_size
// and body_size are `size`.
scan::FileScan scan_torch_at(int fd, const std::string& display_name, uint64_t base, uint64_t size);
scan::FileScan scan_torch(const std::string& path);

// This module as a scan::FileReader: takes a file by its first bytes (looks_like_torch).
extern const scan::FileReader kReader;

}  // namespace ckptfs::torchzip
