// Header-only walk of a MindSpore .ckpt file (spec §1). Tensor bytes are seeked over, never read
// (unless a CRC check is asked for), so memory does not depend on file size.
// Thread-safe: no shared state; each call holds its own window and parser, so files may be
// scanned from many threads at once (the ReadExact given must itself allow its caller's use).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ckptfs/scan/file_scan.h"
#include "ckptfs/scan/reader.h"
#include "ckptfs/util/pread.h"

namespace ckptfs::ckpt {

// How the header walk reads. `small`: a 64 KiB window, 4 KiB after a jump over tensor bytes
// (a local disk: read only what is headers). `large`: every read an 8 MiB window, tensors
// smaller than that read through, so the file passes in order in few requests (a network or
// S3 filesystem, where a request costs far more than its bytes). `automatic`: `large` when the
// file is on a remote filesystem (util/remote_fs.h), else `small`; bytes read through a
// ReadExact (scan_checkpoint_bytes) count as local.
enum class ReadPattern { automatic, small, large };

struct ScanOptions {
  bool verify_crc = false;  // compare the CRC trailer (if any) with a CRC-32 of the body
  ReadPattern reads = ReadPattern::automatic;
};

// Scans a checkpoint. Throws Error naming `path` and the byte offset for truncated or malformed
// input, encrypted files (spec §1.8), content whose length does not match dims × element size,
// and a CRC mismatch when asked to verify.
scan::FileScan scan_checkpoint(const std::string& path, const ScanOptions& options = {});
scan::FileScan scan_checkpoint_fd(int fd, const std::string& display_name,
                                  const ScanOptions& options = {});
// The same for `size` bytes read through `read` (a mounted view's own bytes).
scan::FileScan scan_checkpoint_bytes(const ReadExact& read, uint64_t size,
                                     const std::string& display_name,
                                     const ScanOptions& options = {});

// This module as a scan::FileReader: takes every file (the last of a list, the fallback) and
// scans it with scan_checkpoint_fd.
extern const scan::FileReader kReader;

// Encrypted MindSpore checkpoints (docs/FORMATS.md, "Encrypted checkpoints"): takes a file whose
// first four bytes are an encryption magic, checks every block with the session key
// (crypt/session_key.h; AES-GCM: every tag, so a wrong key or a tampered block is refused here)
// and scans the decrypted stream; the scan is marked `encrypted`. Without a key it refuses the
// file, naming --dec-key-file. Listed before kReader, which takes every file.
extern const scan::FileReader kEncryptedReader;

// True if the open file `fd` is empty or begins as a checkpoint does (the tag of its first
// record, 0x0A); a file that does not may be another protobuf (a strategy). Never throws.
bool opens_like_checkpoint(int fd) noexcept;

// The parameters as MindSpore's loader sees them (spec §1.5, §7): a later non-adjacent record
// with an existing name replaces that entry in place; a "name.__param_key__<n>" entry is renamed
// to "name" and moved to the end. Takes the scan by value: move it in to avoid copying.
std::vector<scan::Param> loaded_params(scan::FileScan scan);
// True when loaded_params leaves the parameters as saved: each name once, no cache key.
bool loads_as_saved(std::span<const scan::Param> params);
// The same names in the same order: what holds for one file holds for the other. Comparing is
// cheaper than hashing, and the files of a checkpoint nearly always list the same names.
bool same_names(std::span<const scan::Param> a, std::span<const scan::Param> b);
// The same, against a list of names kept from an earlier file.
bool same_names(std::span<const std::string> names, std::span<const scan::Param> params);

}  // namespace ckptfs::ckpt
