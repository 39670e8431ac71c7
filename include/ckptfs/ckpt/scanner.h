// Header-only walk of a MindSpore .ckpt file (spec §1). Tensor bytes are seeked over, never read
// (unless a CRC check is asked for), so memory does not depend on file size.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ckptfs/ckpt/dtype.h"
#include "ckptfs/util/pread.h"
#include "ckptfs/util/small_vector.h"

namespace ckptfs::ckpt {

// A byte range of a source file, in absolute file offsets.
struct Extent {
  uint64_t offset = 0;
  uint64_t length = 0;
  bool operator==(const Extent&) const = default;
};

enum class EntryKind : uint8_t {
  Tensor = 0,     // dense array of a known element type
  String = 1,     // tensor_type "str": UTF-32LE code points, dims [0]
  MapTensor = 2,  // Value.maptensor (field 3): copied as raw records, never resharded
  Opaque = 3,     // Int4, random_op, unknown type names: copied, never resharded
};

// Extents of a parameter's records: nearly always one, held without an allocation.
using Extents = SmallVector<Extent, 1>;

// One parameter: consecutive records with the same tag, merged (spec §1.5). Scans hold millions
// of these: the fields are packed, and a one-record parameter allocates only for a name longer
// than 15 bytes, a type name outside Dtype's table and its dims.
struct Param {
  std::string name;
  Dtype dtype;                 // tensor_type of the last record ("" for map tensors)
  std::vector<int64_t> shape;  // empty for scalars (dims absent, or [0] on a non-string)
  uint32_t element_size = 0;   // 0 unless kind == Tensor
  EntryKind kind = EntryKind::Tensor;
  bool dims_zero = false;  // the file wrote dims [0] (≤2.2 scalar, or a string)
  // A strided view (torch.save tensors): content is the one whole storage record, and element
  // (i0, ..., in) of the tensor is element storage_offset + sum(ik * strides[k]) of it. Without
  // a view, content holds the tensor in C order.
  bool view = false;
  Extents content;               // tensor_content of each record, in order
  Extents records;               // each whole top-level record (0x0A, length, Value)
  uint64_t storage_offset = 0;   // elements (views only)
  std::vector<int64_t> strides;  // elements, one per dimension (views only)

  uint64_t nbytes() const;    // the tensor's bytes: content bytes, or elements x size for a view
  uint64_t elements() const;  // product of shape (1 for a scalar)
};

struct ScanOptions {
  bool verify_crc = false;  // compare the CRC trailer (if any) with a CRC-32 of the body
};

// Which reader made a scan. .ckpt and .safetensors files follow different loaders' rules: the
// order MindSpore sees them in and what its transform does with them differ
// (mindspore-safetensors.md §2.2). A torch.save scan holds views and a tree.
enum class SourceFormat : uint8_t {
  Ckpt = 0,
  Safetensors = 1,
  TorchZip = 2,  // a torch.save zip: params are views, `tree` holds the rest of the object
};

struct FileScan {
  SourceFormat format = SourceFormat::Ckpt;
  uint64_t file_size = 0;
  uint64_t body_size = 0;  // bytes before the CRC trailer (== file_size without one)
  bool has_crc_trailer = false;
  std::vector<Param> params;  // in file order, exactly as recorded
  // TorchZip: the unpickled object as JSON, each tensor occurrence {"$tensor": i} for params[i]
  // (torchzip/pickle.h gives the encoding). Empty for .ckpt files.
  std::string tree;
};

// Scans a checkpoint. Throws Error naming `path` and the byte offset for truncated or malformed
// input, encrypted files (spec §1.8), content whose length does not match dims × element size,
// and a CRC mismatch when asked to verify.
FileScan scan_checkpoint(const std::string& path, const ScanOptions& options = {});
FileScan scan_checkpoint_fd(int fd, const std::string& display_name,
                            const ScanOptions& options = {});
// The same for `size` bytes read through `read` (a mounted view's own bytes).
FileScan scan_checkpoint_bytes(const ReadExact& read, uint64_t size,
                               const std::string& display_name, const ScanOptions& options = {});

// Why `scan` could not have come from scan_checkpoint of a file of `file_size` bytes, or "" if it
// could: every extent inside the body, the body inside the file, each tensor's element size that
// of its dtype and its content as many bytes as its dims need (no dim negative, no product past
// 64 bits). For scans read back from elsewhere (the index), which must never be served unchecked.
std::string check_scan(const FileScan& scan, uint64_t file_size);

// The parameters as MindSpore's loader sees them (spec §1.5, §7): a later non-adjacent record
// with an existing name replaces that entry in place; a "name.__param_key__<n>" entry is renamed
// to "name" and moved to the end. Takes the scan by value: move it in to avoid copying.
std::vector<Param> loaded_params(FileScan scan);
// True when loaded_params leaves the parameters as saved: each name once, no cache key.
bool loads_as_saved(std::span<const Param> params);
// The same names in the same order: what holds for one file holds for the other. Comparing is
// cheaper than hashing, and the files of a checkpoint nearly always list the same names.
bool same_names(std::span<const Param> a, std::span<const Param> b);

}  // namespace ckptfs::ckpt
