// A PyTorch Distributed Checkpoint (DCP) directory as FileSystemWriter writes it (spec
// torch-dcp-megatron.md §1, docs/FORMATS-dcp.md): `.metadata`, a pickle of DCP's metadata
// dataclasses, read through the allow-listed pickle machine (torchzip/pickle.h, Allow::
// DcpMetadata), never executed; and `__<rank>_<k>.distcp` files, each a concatenation of complete
// torch.save archives ("items"), one per tensor chunk or non-tensor object.
//
// The reader locates every chunk's tensor bytes once (the data/0 record of the item's archive,
// with size, stride and storage offset from its data.pkl) into one scan::FileScan per .distcp
// file, and validates as it goes: every failure is one Error line naming the tensor and the file.
// Non-tensor (BYTE_IO) items are never unpickled: they are listed by name, offset and length.
// Stateless functions; thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/scan/file_scan.h"

namespace ckptfs::dcp {

inline constexpr std::string_view kMetadataName = ".metadata";
inline constexpr std::string_view kDataSuffix = ".distcp";
// Limit on .metadata's size (the same as a torch.save data.pkl's).
inline constexpr uint64_t kMaxMetadataBytes = uint64_t{1} << 30;

// Where one item lies: bytes [offset, offset + length) of the data file `file` (an index into
// Metadata::files).
struct Storage {
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// One saved chunk: the box [offsets, offsets + sizes) of its tensor.
struct Chunk {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  Storage storage;
  uint64_t elements() const;
};

struct Tensor {
  std::string fqn;
  std::string code;  // safetensors dtype code ("F32", "BF16", ...)
  uint32_t element_size = 0;
  std::vector<int64_t> shape;  // global
  std::vector<Chunk> chunks;   // as .metadata lists them
};

// A non-tensor value, stored as one opaque torch.save archive (never unpickled).
struct Object {
  std::string fqn;
  Storage storage;
};

struct Metadata {
  std::vector<Tensor> tensors;  // .metadata's order
  std::vector<Object> objects;
  std::vector<std::string> files;  // data files named by storage entries, sorted
  uint64_t bytes = 0;              // size of .metadata
  uint64_t digest = 0;             // FNV-1a of .metadata's bytes: scans record which they used
};

// Decodes and validates .metadata's bytes (`name` for messages). Throws Error, one line naming
// the tensor and `name`, for: a pickle the machine refuses (a global outside the allow-list is
// named), a tree that is not DCP's Metadata, an unknown dtype or a layout other than strided, a
// chunk outside its tensor (a zero-size chunk may sit at offset == dim), two chunks that overlap,
// chunks that do not cover the tensor, a chunk or object without a storage entry, two storage
// entries for one item, an entry for a name the checkpoint does not list, a compressed item
// (transform_descriptors), and a relative_path that is not a plain file name.
Metadata parse_metadata(std::string_view bytes, const std::string& name);
// parse_metadata of `dir`/.metadata.
Metadata read_metadata(const std::filesystem::path& dir);

// True if `dir` holds a .metadata file (DCP's global metadata).
bool is_dcp_dir(const std::filesystem::path& dir);

// The scan of the open data file `fd` (named `name` in messages; its file name must be
// `metadata.files[file]`): one Param per tensor chunk stored in it, in file order, named by the
// tensor's fqn (format SourceFormat::Dcp): a view (TorchZip's rules: content is the chunk's whole
// data/0 record, element i of the chunk at storage_offset + sum(i_k * strides_k)), shape the
// chunk's sizes. `tree` is JSON: {"metadata": {"bytes", "digest"}, "chunks": [{"fqn", "offsets",
// "shape"}...] (one per param, same order; shape is the tensor's), "objects": [{"fqn",
// "offset", "length"}...]}. Throws Error naming the file and the tensor for: an item outside the
// file, two items that overlap, an item that is not a torch.save archive of exactly one tensor,
// a tensor whose dtype or shape is not its chunk's, and a data/0 record whose size is not the
// chunk's elements x dtype size.
scan::FileScan scan_data_file(int fd, const std::string& name, const Metadata& metadata,
                              uint32_t file);

// The shapes of a source-family registry entry (family::Family's detect and index_files,
// scan::FileReader's claims and scan):
// True for a file named *.distcp (a data file holds whole archives, so it starts with a zip
// local header, or is empty when a rank saved nothing).
bool claims_data_file(std::string_view name, std::string_view head);
// scan_data_file of the data file `name` (a path) with the .metadata beside it. The scan's tree
// records that .metadata's size and digest: a scan kept in a cache must be taken again when
// they differ from the current .metadata's. The parsed .metadata of the last directory is kept
// (one, while its file is unchanged) for the next data file of the same directory; thread-safe.
scan::FileScan scan_data_file_beside(int fd, const std::string& name);
// `dir` if it is a DCP checkpoint (it holds .metadata), else nullopt. A directory holding only
// rank-local __<rank>.metadata files (dcp.save(use_collectives=False)) is refused with one line:
// reading those is not implemented. `step` is not used: a DCP directory is one checkpoint.
std::optional<std::filesystem::path> detect(const std::filesystem::path& dir,
                                            const std::string& step);
// The data files of the checkpoint at `dir`, as its .metadata names them (sorted): the files to
// scan. Other files of the directory are not part of it.
std::vector<std::filesystem::path> index_files(const std::filesystem::path& dir);

// A whole directory: its metadata and the scans of metadata.files, in that order.
struct Checkpoint {
  Metadata metadata;
  std::vector<scan::FileScan> scans;
};
Checkpoint read_checkpoint(const std::filesystem::path& dir);

}  // namespace ckptfs::dcp
