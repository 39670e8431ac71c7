// The wire codec of the index's entries: a scan (indexpb::ScannedFile) or a target summary
// (indexpb::TargetSummary) as protobuf wire bytes followed by their CRC-32, big-endian. The
// public half (decode_entry, encode_target, decode_target) is declared in
// ckptfs/index/store.h; this is what the LMDB store itself needs. Nothing here touches LMDB.
// Thread-safe: pure functions of their arguments.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "ckptfs/index/store.h"

namespace ckptfs::index {

// The kScansDb entry for the scan of the file at `path`: what decode_entry reads back.
std::string encode_entry(const std::string& path, const scan::FileScan& scan,
                         const StructureDigest& structure);

// The message bytes of a stored entry whose checksum holds; nullopt otherwise.
std::optional<std::string_view> checked_message(std::string_view entry);

}  // namespace ckptfs::index
