// The scanner's memory must not depend on file size: a sparse file of several GiB whose first
// parameter is one 3 GiB record plus a second chunk is scanned without reading the content.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>

#include "ckptfs/ckpt/scanner.h"
#include "ckptfs/util/fd.h"
#include "support/test_support.h"

namespace ckptfs::ckpt {
namespace {

using scan::Extent;
using scan::FileScan;
using scan::Param;

using ::testing::ElementsAre;
using testsupport::varint;

constexpr uint64_t kGiB = uint64_t{1} << 30;

std::string len_prefix(char key, uint64_t n) {
  std::string out(1, key);
  out.append(varint(n));
  return out;
}

// Header of a one-dim UInt8 record up to and including the content length prefix.
std::string header(const std::string& tag, uint64_t dim, uint64_t content) {
  const std::string type = "UInt8";
  std::string tensor_head(1, '\x08');
  tensor_head.append(varint(dim)).append(len_prefix(0x12, type.size())).append(type);
  tensor_head.append(len_prefix(0x1A, content));
  std::string value_head = len_prefix(0x0A, tag.size());
  value_head.append(tag).append(len_prefix(0x12, tensor_head.size() + content));
  value_head.append(tensor_head);
  return len_prefix(0x0A, value_head.size() + content).append(value_head);
}

long max_rss_kib() {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

// Bytes this process has read through read()/pread() so far (/proc/self/io rchar).
uint64_t bytes_read() {
  std::ifstream io("/proc/self/io");
  std::string key;
  uint64_t value = 0;
  while (io >> key >> value)
    if (key == "rchar:") return value;
  ADD_FAILURE() << "no rchar in /proc/self/io";
  return 0;
}

void pwrite_all(int fd, const std::string& bytes, uint64_t offset) {
  ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(offset)),
            static_cast<ssize_t>(bytes.size()));
}

TEST(ScannerMemory, SparseMultiGigabyteFile) {
  std::optional<testsupport::TempDir> tmp(std::in_place, "ckptfs_sparse");
  const std::string path = (tmp->path() / "big.ckpt").string();

  const uint64_t first = 3 * kGiB;
  const uint64_t second = 1000;
  const uint64_t dim = first + second;
  const std::string h1 = header("big", dim, first);
  const std::string h2 = header("big", dim, second);
  const std::string tail = header("small", 3, 3) + "xyz";
  const uint64_t rec2 = h1.size() + first;
  const uint64_t rec3 = rec2 + h2.size() + second;
  {
    UniqueFd fd(::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600));
    ASSERT_TRUE(fd);
    pwrite_all(fd.get(), h1, 0);
    // The first chunk's content stays a hole: it costs no disk and reads as zeros.
    ASSERT_EQ(::ftruncate(fd.get(), static_cast<off_t>(rec2)), 0);
    pwrite_all(fd.get(), h2, rec2);
    pwrite_all(fd.get(), std::string(second, '\x01'), rec2 + h2.size());
    pwrite_all(fd.get(), tail, rec3);
  }

  const long before = max_rss_kib();
  const uint64_t read_before = bytes_read();
  const FileScan scan = scan_checkpoint(path);
  const uint64_t read_by_scan = bytes_read() - read_before;
  const long after = max_rss_kib();
  tmp.reset();

  EXPECT_EQ(scan.file_size, rec3 + tail.size());
  EXPECT_GT(scan.file_size, 3 * kGiB);
  ASSERT_EQ(scan.params.size(), 2u);
  const Param& big = scan.params[0];
  EXPECT_EQ(big.name, "big");
  EXPECT_THAT(big.shape, ElementsAre(static_cast<int64_t>(dim)));
  EXPECT_THAT(big.content, ElementsAre(Extent{h1.size(), first}, Extent{rec2 + h2.size(), second}));
  EXPECT_THAT(big.records, ElementsAre(Extent{0, rec2}, Extent{rec2, h2.size() + second}));
  EXPECT_EQ(big.nbytes(), dim);
  EXPECT_EQ(scan.params[1].name, "small");
  EXPECT_THAT(scan.params[1].content, ElementsAre(Extent{scan.file_size - 3, 3}));

  EXPECT_LT(after - before, 16 * 1024) << "peak RSS grew by " << (after - before) << " KiB";
  // Headers only: the 3 GiB of content are stepped over, not read.
  EXPECT_LT(read_by_scan, 16u << 20) << "the scan read " << read_by_scan << " bytes";
}

}  // namespace
}  // namespace ckptfs::ckpt
