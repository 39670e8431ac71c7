// What a planned file holds, record by record, as planning laid it out: each record's name,
// dtype, shape and byte ranges in the file. Read from the plan alone (the record headers planning
// encoded, which the file keeps in memory, and the names of records it copies whole), never from
// a source: it costs no I/O and works while a source is changed or gone. Nothing is kept per
// record beyond what the file already holds; the list is made on demand, one file at a time.
//
// Thread-safe: reads an immutable TargetFile.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckptfs/plan/planner.h"

namespace ckptfs::plan {

struct PlannedRecord {
  std::string name;
  std::string dtype;           // a .ckpt's tensor_type ("" for a map tensor), a safetensors code
  std::vector<int64_t> shape;  // empty for a scalar
  // (offset, length) in the file: the content of each record of a .ckpt parameter (cut in
  // 512 MiB records), a map tensor's whole records, a safetensors tensor's data.
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
};

struct PlannedRecords {
  std::string_view format;  // "ckpt", "safetensors", or "other" (no records: extra.json)
  std::vector<PlannedRecord> records;
};

// The records of `target`, in file order (a .safetensors file's in its header's order). Throws
// Error naming the file if its bytes are not laid out as planning lays out its format.
PlannedRecords planned_records(const TargetFile& target);

}  // namespace ckptfs::plan
