// The scan of one source file, whatever its format: the common types every reader (ckpt/,
// safetensors/, torchzip/) fills and the index stores. Parameters are located, never loaded:
// extents of the file, with the dtype and shape to interpret them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/scan/dtype.h"
#include "ckptfs/util/small_vector.h"

namespace ckptfs::scan {

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

// Which reader made a scan. .ckpt and .safetensors files follow different loaders' rules: the
// order MindSpore sees them in and what its transform does with them differ
// (mindspore-safetensors.md §2.2). A torch.save scan holds views and a tree.
enum class SourceFormat : uint8_t {
  Ckpt = 0,
  Safetensors = 1,
  TorchZip = 2,  // a torch.save zip: params are views, `tree` holds the rest of the object
  Dcp = 3,       // a DCP .distcp data file: params are views (TorchZip's rules), one per tensor
                 // chunk; `tree` locates the chunks and the non-tensor items (dcp/dcp.h)
};
// The last value: the index refuses a stored format past it (an entry of a newer ckptfs).
inline constexpr SourceFormat kLastFormat = SourceFormat::Dcp;

struct FileScan {
  SourceFormat format = SourceFormat::Ckpt;
  uint64_t file_size = 0;
  uint64_t body_size = 0;  // bytes before the CRC trailer (== file_size without one)
  bool has_crc_trailer = false;
  // An encrypted checkpoint scanned through its decrypted stream: every extent (and file_size)
  // is a plaintext offset, not one of the file. Never stored in an index (index/store.h).
  bool encrypted = false;
  std::vector<Param> params;  // in file order, exactly as recorded
  // TorchZip: the unpickled object as JSON, each tensor occurrence {"$tensor": i} for params[i]
  // (torchzip/pickle.h gives the encoding). Empty for .ckpt files.
  std::string tree;
};

// The format's name as messages and inspect print it: "ckpt", "safetensors", "torch", "dcp".
std::string_view format_name(SourceFormat format);

// Why `scan` could not have come from a scanner of a file of `file_size` bytes, or "" if it
// could: every extent inside the body, the body inside the file, each tensor's element size that
// of its dtype and its content as many bytes as its dims need (no dim negative, no product past
// 64 bits). For scans read back from elsewhere (the index), which must never be served unchecked.
std::string check_scan(const FileScan& scan, uint64_t file_size);

}  // namespace ckptfs::scan
