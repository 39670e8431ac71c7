// A synthesized target file: its size and how any byte range of it maps to record-header bytes
// held in memory and byte runs of source files. Built once at mount, immutable afterwards, safe
// to read from many threads. Memory is O(records + source blocks), never O(bytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ckptfs::plan {

// No limit on the runs a map() appends.
inline constexpr size_t kAllRuns = SIZE_MAX;

// One contiguous piece of a reply, in file order.
struct Run {
  const char* mem = nullptr;  // set: `length` bytes at this address (record headers)
  uint32_t source = 0;        // otherwise: index into the plan's source table
  uint64_t offset = 0;        //   and the byte offset in that source file
  uint64_t length = 0;
};

// Content of one resharded tensor record: a box of a global tensor assembled from the source
// blocks that intersect it (spec §4.3). Produced by the planner.
struct TensorContent;
// Content of one strided view of a source storage (torch.save tensors).
struct StridedContent;
// A tensor assembled from strided chunks that tile it as a grid (DCP's merged view).
struct GridContent;

// A record copied whole from a source (a map tensor's, in a .ckpt view): its header is among
// the source's bytes, not the file's, so its place and name are kept beside the file to describe
// it (file_records.h). Map tensors are few: most files keep none.
struct CopiedRecord {
  uint64_t at = 0;  // in the file
  uint64_t length = 0;
  std::string name;
};

class VirtualFile {
 public:
  VirtualFile();
  ~VirtualFile();
  VirtualFile(VirtualFile&&) noexcept;
  VirtualFile& operator=(VirtualFile&&) noexcept;

  uint64_t size() const;
  // Appends the runs covering [offset, offset + length), clipped at size(); consecutive runs of
  // one source file at consecutive offsets are merged. Returns the bytes covered. With
  // `max_runs`, stops as soon as `out` holds more than that many runs and returns 0: the runs
  // then cover only a prefix (for a caller that wants few runs or none, such as the splice
  // stage, which would otherwise map thousands of short runs of a READ only to decline it).
  uint64_t map(uint64_t offset, uint64_t length, std::vector<Run>& out,
               size_t max_runs = kAllRuns) const;
  // Appends runs holding at least the source bytes map() would for [offset, offset + length):
  // resharded tensors as whole rows of the source blocks met (TensorContent::cover), the rest
  // as map() has them; no header bytes. What read-ahead brings in, at O(pieces) cost.
  void cover(uint64_t offset, uint64_t length, std::vector<Run>& out) const;
  // Source indices this file reads from, sorted, unique.
  const std::vector<uint32_t>& sources() const;
  // The records added by add_source_record, in file order.
  const std::vector<CopiedRecord>& copied_records() const;

  class Builder;

 private:
  uint64_t walk(uint64_t offset, uint64_t length, std::vector<Run>& out, size_t max_runs,
                bool cover) const;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class VirtualFile::Builder {
 public:
  Builder();
  // `sizes_only`: the file keeps only its size and sources (index build's target summaries, which
  // list files without serving them): map() of it covers nothing and it has no copied records.
  explicit Builder(bool sizes_only);
  ~Builder();
  // Room for `pieces` additions (each add_* call is one piece), so that a file of millions of
  // records is not copied as it grows. An estimate: more pieces are still taken.
  void reserve(size_t pieces);
  // Bytes held in memory (record headers).
  void add_bytes(std::string bytes);
  // `length` such bytes, not written: sizes only (a full builder throws std::logic_error).
  void add_bytes(uint64_t length);
  bool sizes_only() const;
  // A verbatim byte range of a source file.
  void add_source_range(uint32_t source, uint64_t offset, uint64_t length);
  // A whole record of a source, copied verbatim (a map tensor's), named `name`.
  void add_source_record(uint32_t source, uint64_t offset, uint64_t length, std::string name);
  // Bytes [begin, end) of a resharded tensor's content.
  void add_tensor(std::shared_ptr<const TensorContent> content, uint64_t begin, uint64_t end);
  // Bytes [begin, end) of a strided view, in C order.
  void add_strided(std::shared_ptr<const StridedContent> content, uint64_t begin, uint64_t end);
  // Bytes [begin, end) of a grid-tiled tensor, in C order: one piece, whatever its row count.
  void add_grid(std::shared_ptr<const GridContent> content, uint64_t begin, uint64_t end);
  VirtualFile finish();

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckptfs::plan
