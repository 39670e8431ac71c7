// Header-only reading of a safetensors file: the 8-byte length and the JSON header, checked
// against every rule of the reference reader (spec torch-hfai-safetensors.md §4.2) plus
// MindSpore's (mindspore-safetensors.md §1.1). Tensor bytes are never read. Stateless and safe
// from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ckptfs/scan/file_scan.h"
#include "ckptfs/scan/reader.h"
#include "ckptfs/util/pread.h"

namespace ckptfs::safetensors {

struct Tensor {
  std::string name;
  std::string code;  // dtype code as written ("F32")
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // data_offsets, relative to the data section
  uint64_t end = 0;
  bool int4 = false;  // named by a MindSpore "<name>": "Int4" metadata marker
};

struct Header {
  uint64_t file_size = 0;
  uint64_t header_bytes = 0;  // N: the JSON header, padding included
  uint64_t data_start() const { return 8 + header_bytes; }
  std::vector<std::pair<std::string, std::string>> metadata;  // file order
  std::vector<Tensor> tensors;                                // data-offset order
};

// Reads and validates the header of an open file. Throws Error naming `display_name` and the
// byte offset or tensor and the rule broken: shorter than 8 bytes, a header longer than 100 MB
// or than the file, not a UTF-8 JSON object, a duplicate name, an unknown dtype code, a shape
// that is not non-negative integers, data_offsets that are not two integers, shape x element
// size != extent, extents with a hole or an overlap or not ending at the end of the file,
// `__metadata__` not a string-to-string map, an Int4 marker naming no tensor.
Header read_header(int fd, const std::string& display_name);
// The same for `size` bytes read through `read` (a mounted view's own bytes).
Header read_header(const ReadExact& read, uint64_t size, const std::string& display_name);

// The same file as the scan records the index stores: one Param per tensor, dtype as its
// MindSpore tensor_type (Int4-marked tensors: the type they are stored as, kind Opaque, so
// they are copied whole and never split), content one absolute extent. Params come in data-offset
// order, the order MindSpore's transform loads them in (safetensors.numpy.load_file iterates
// offset_keys() in the 0.7 release MindSpore is pinned to; 0.4 iterated sorted names); format is
// SourceFormat::Safetensors.
scan::FileScan scan_safetensors_fd(int fd, const std::string& display_name);
scan::FileScan scan_safetensors(const std::string& path);

// True if the name ends in ".safetensors".
bool is_safetensors_name(std::string_view name);

// This module as a scan::FileReader: takes a file by its name (is_safetensors_name).
extern const scan::FileReader kReader;

}  // namespace ckptfs::safetensors
