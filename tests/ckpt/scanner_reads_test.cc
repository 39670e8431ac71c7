// How the header walk reads (issue 33): on a remote filesystem each read is a request, so the
// `large` pattern must pass through a file in few big ordered reads, find exactly what the
// `small` pattern finds, and still step over a tensor larger than its window. Expected content
// offsets are summed here from the record layout the encoder writes.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ckptfs/ckpt/encoder.h"
#include "ckptfs/ckpt/scanner.h"
#include "ckptfs/util/fd.h"
#include "ckptfs/util/remote_fs.h"
#include "support/test_support.h"

namespace ckptfs::ckpt {
namespace {

constexpr uint64_t kMiB = 1 << 20;

struct Built {
  std::string bytes;
  std::vector<scan::Extent> contents;  // each tensor's content, in file order
};

// One UInt8 tensor per size, named t<i>, content filled with its index.
Built build(const std::vector<uint64_t>& sizes) {
  Built out;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t dim = static_cast<int64_t>(sizes[i]);
    const std::string name = fmt::format("t{}", i);
    out.bytes += record_header(name, std::span<const int64_t>(&dim, 1), "UInt8", sizes[i]);
    out.contents.push_back({out.bytes.size(), sizes[i]});
    out.bytes.append(sizes[i], static_cast<char>(i));
  }
  return out;
}

struct Reads {
  std::vector<std::pair<uint64_t, uint64_t>> calls;  // (offset, length)
  uint64_t bytes() const {
    uint64_t n = 0;
    for (const auto& c : calls) n += c.second;
    return n;
  }
};

scan::FileScan scan_counting(const std::string& file, ReadPattern pattern, Reads& reads) {
  ReadExact read = [&](uint64_t offset, std::span<uint8_t> out) {
    reads.calls.emplace_back(offset, out.size());
    ASSERT_LE(offset + out.size(), file.size());
    std::copy_n(file.data() + offset, out.size(), out.begin());
  };
  ScanOptions options;
  options.reads = pattern;
  return scan_checkpoint_bytes(read, file.size(), "mem.ckpt", options);
}

std::vector<scan::Extent> contents(const scan::FileScan& scan) {
  std::vector<scan::Extent> out;
  for (const scan::Param& p : scan.params)
    for (const scan::Extent& e : p.content) out.push_back(e);
  return out;
}

TEST(ScannerReads, LargePatternPassesInOrderInFewReads) {
  // 160 tensors of 300 KiB: the shape of a rank's file whose headers are far apart.
  const Built file = build(std::vector<uint64_t>(160, 300 * 1024));
  Reads small, large;
  const scan::FileScan a = scan_counting(file.bytes, ReadPattern::small, small);
  const scan::FileScan b = scan_counting(file.bytes, ReadPattern::large, large);
  EXPECT_EQ(contents(a), file.contents);
  EXPECT_EQ(contents(b), file.contents);
  ASSERT_EQ(b.params.size(), 160u);

  // Small: one read per header (and the trailer probe). Large: one 8 MiB read per window.
  EXPECT_GE(small.calls.size(), 160u);
  const uint64_t windows = (file.bytes.size() + 8 * kMiB - 1) / (8 * kMiB);
  // Before the walk: 4 bytes at 0 (the encryption magic) and the CRC trailer probe at the end.
  EXPECT_LE(large.calls.size(), windows + 2) << "reads: " << large.calls.size();
  // In order, no read overlapping the one before (each byte fetched once).
  uint64_t reach = 0;
  for (size_t i = 2; i < large.calls.size(); ++i) {
    EXPECT_GE(large.calls[i].first, reach) << "read " << i;
    reach = large.calls[i].first + large.calls[i].second;
  }
}

TEST(ScannerReads, LargePatternStepsOverATensorLargerThanItsWindow) {
  const Built file = build({1000, 24 * kMiB, 1000});
  Reads large;
  const scan::FileScan scan = scan_counting(file.bytes, ReadPattern::large, large);
  EXPECT_EQ(contents(scan), file.contents);
  // The first window and the one after the big tensor: far less than the file.
  EXPECT_LT(large.bytes(), 17 * kMiB);
}

TEST(ScannerReads, RemoteFilesystemsByTheirMagic) {
  EXPECT_TRUE(is_remote_fs_magic(0x65735546));   // FUSE
  EXPECT_TRUE(is_remote_fs_magic(0x6969));       // NFS
  EXPECT_FALSE(is_remote_fs_magic(0xEF53));      // ext4
  EXPECT_FALSE(is_remote_fs_magic(0x01021994));  // tmpfs
  testsupport::TempDir tmp("ckptfs_remote");
  const auto path = testsupport::write_file(tmp.path() / "x", "x");
  const UniqueFd fd(::open(path.c_str(), O_RDONLY));
  ASSERT_TRUE(fd);
  EXPECT_FALSE(on_remote_filesystem(fd.get()));  // the test's temp folder is local
}

}  // namespace
}  // namespace ckptfs::ckpt
