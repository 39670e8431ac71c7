// The structure bytes of a source file (every byte outside its tensor contents) and their digest,
// which a shipped index's entry carries so that a scan is checked against the file before use.
#include "ckptfs/index/structure.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "ckptfs/ckpt/crc32.h"
#include "ckptfs/error.h"
#include "ckptfs/util/fd.h"
#include "support/test_support.h"

namespace ckptfs::index {
namespace {

using ::testing::HasSubstr;

scan::FileScan scan_with(uint64_t file_size, std::vector<scan::Extents> contents) {
  scan::FileScan scan;
  scan.file_size = scan.body_size = file_size;
  for (scan::Extents& c : contents) scan.params.emplace_back().content = std::move(c);
  return scan;
}

uint32_t crc_of(const std::string& bytes) {
  return ckpt::crc32_update(
      0, std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

TEST(StructureExtents, AreTheBytesOutsideEveryContentInFileOrder) {
  // Contents listed out of order, one of two chunks, one empty.
  const scan::FileScan scan = scan_with(100, {{{30, 4}}, {{10, 4}, {50, 0}}, {}});
  EXPECT_EQ(structure_extents(scan), (std::vector<scan::Extent>{{0, 10}, {14, 16}, {34, 66}}));
}

TEST(StructureExtents, SharedAndOverlappingContentsMerge) {
  // Views of one storage share its extent; a content reaching the end of the file leaves no
  // tail.
  const scan::FileScan scan =
      scan_with(64, {{{8, 20}}, {{8, 20}}, {{12, 4}}, {{20, 20}}, {{50, 14}}});
  EXPECT_EQ(structure_extents(scan), (std::vector<scan::Extent>{{0, 8}, {40, 10}}));
}

TEST(StructureExtents, AFileOfNoContentIsAllStructure) {
  EXPECT_EQ(structure_extents(scan_with(7, {})), (std::vector<scan::Extent>{{0, 7}}));
  EXPECT_TRUE(structure_extents(scan_with(0, {})).empty());
}

class StructureDigestTest : public ::testing::Test {
 protected:
  StructureDigest digest_of(const std::string& bytes, const scan::FileScan& scan) {
    const auto path = testsupport::write_file(tmp_.path() / "f.bin", bytes);
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    return structure_digest(fd.get(), path.string(), scan);
  }
  testsupport::TempDir tmp_{"ckptfs-structure"};
};

TEST_F(StructureDigestTest, CoversTheHeadersAndNotTheContents) {
  // "HEAD" + 8 content bytes + "MID" + 3 content bytes + "TAIL".
  const std::string file = "HEADccccccccMIDdddTAIL";
  const scan::FileScan scan = scan_with(file.size(), {{{4, 8}}, {{15, 3}}});
  const StructureDigest d = digest_of(file, scan);
  EXPECT_EQ(d.bytes, 11u);
  EXPECT_EQ(d.crc, crc_of("HEADMIDTAIL"));
  EXPECT_EQ(digest_of("HEADxxxxxxxxMIDyyyTAIL", scan), d);  // other tensor bytes: the same
  EXPECT_NE(digest_of("HEADccccccccMJDdddTAIL", scan), d);  // a header byte: not
}

TEST_F(StructureDigestTest, FarApartAndLongStructureIsReadWhole) {
  // Headers 3 MiB apart, and a structure run longer than one read buffer.
  std::string file(8 << 20, 'c');
  file.replace(0, 5, "first");
  file.replace(3 << 20, 6, "second");
  const scan::FileScan scan =
      scan_with(file.size(), {{{5, (3 << 20) - 5}}, {{(3 << 20) + 6, 100}}});
  const std::string structure =
      file.substr(0, 5) + file.substr(3 << 20, 6) + file.substr((3 << 20) + 106);
  const StructureDigest d = digest_of(file, scan);
  EXPECT_EQ(d.bytes, structure.size());
  EXPECT_EQ(d.crc, crc_of(structure));
  // By region of 1 MiB: "first"; nothing twice; "second" and the rest of the fourth MiB; the
  // four last MiB whole.
  const uint64_t mib = 1 << 20;
  EXPECT_EQ(d.region, mib);
  std::vector<uint32_t> regions = {
      crc_of(file.substr(0, 5)), 0, 0,
      crc_of(file.substr(3 * mib, 6) + file.substr(3 * mib + 106, mib - 106))};
  for (uint64_t r = 4; r < 8; ++r) regions.push_back(crc_of(file.substr(r * mib, mib)));
  EXPECT_EQ(d.regions, regions);
}

TEST(RegionSizeTest, AtLeastAMebibyteAndAtMost256RegionsAFile) {
  const uint64_t mib = 1 << 20;
  EXPECT_EQ(region_size(0), mib);
  EXPECT_EQ(region_size(256 * mib), mib);
  EXPECT_EQ(region_size(256 * mib + 1), 2 * mib);
  EXPECT_EQ(region_size(uint64_t{1} << 40), uint64_t{4} << 30);
  for (uint64_t size : {uint64_t{1}, 300 * mib, uint64_t{3} << 33, (uint64_t{1} << 50) + 17}) {
    const uint64_t region = region_size(size);
    EXPECT_EQ(region & (region - 1), 0u) << size;
    EXPECT_LE((size + region - 1) / region, 256u) << size;
  }
}

TEST_F(StructureDigestTest, AFileShorterThanItsScanIsAnErrorNamingIt) {
  const scan::FileScan scan = scan_with(40, {{{4, 8}}});
  try {
    digest_of("HEADcccc", scan);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("f.bin"));
  }
}

}  // namespace
}  // namespace ckptfs::index
