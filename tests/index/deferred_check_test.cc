// The structure check a mount over a FUSE filesystem defers to the reads of a source whose scan
// the index gave by path, size and mtime: made before any byte is served (the whole file, or for
// a format parsed from its start each region up to the read's end), and a file whose headers
// differ has its index entries dropped so that the next mount scans it again.
#include "ckptfs/index/deferred_check.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ckptfs/ckpt/crc32.h"
#include "ckptfs/ckpt/encoder.h"
#include "ckptfs/ckpt/scanner.h"
#include "ckptfs/ckpt/varint.h"
#include "ckptfs/index/store.h"
#include "ckptfs/safetensors/scanner.h"
#include "ckptfs/util/fd.h"
#include "support/test_support.h"

namespace ckptfs::index {
namespace {

using ::testing::HasSubstr;
using Result = DeferredCheck::Result;

// "HEAD" + 8 content bytes of "a" + "MID" + 3 of "b" + "TAIL": 11 structure bytes.
constexpr std::string_view kFile = "HEADccccccccMIDdddTAIL";

scan::Param param(char name, std::string dtype, uint64_t element_size, scan::Extent content,
                  scan::Extent record) {
  scan::Param p;
  p.name = std::string(1, name);
  p.dtype = std::move(dtype);
  p.element_size = element_size;
  p.shape = {static_cast<int64_t>(content.length / element_size)};
  p.content = {content};
  p.records = {record};
  return p;
}

scan::FileScan file_scan() {
  scan::FileScan scan;
  scan.file_size = scan.body_size = kFile.size();
  scan.params = {param('a', "Float32", 4, {4, 8}, {0, 12}),
                 param('b', "Int8", 1, {15, 3}, {12, 10})};
  return scan;
}

// The digest by construction: the CRC-32 of the bytes outside the contents, in file order.
// Without regions, as an entry written before they were kept: checked whole.
uint32_t bytes_crc(std::string_view bytes) {
  return ckpt::crc32_update(
      0, std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}
StructureDigest digest_of(std::string_view structure) {
  StructureDigest d;
  d.bytes = structure.size();
  d.crc = bytes_crc(structure);
  return d;
}

class DeferredCheckTest : public ::testing::Test {
 protected:
  UniqueFd open_file(std::string_view bytes, const char* name = "f.ckpt") {
    const auto path = testsupport::write_file(tmp_.path() / name, bytes);
    return UniqueFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  }
  // An index holding the scan of f.ckpt, and another file's entry beside it.
  std::string store_entries() {
    Store store(index_);
    const std::vector<Store::NewEntry> items{
        {"/s3/rank_0/f.ckpt", old_, &scan_, digest_of("HEADMIDTAIL")},
        {"/s3/rank_1/g.ckpt", other_, &scan_, digest_of("HEADMIDTAIL")}};
    store.insert(items);
    return old_.key();
  }
  bool stored(const source::Fingerprint& fp) { return Store(index_).lookup(fp).has_value(); }

  testsupport::TempDir tmp_{"ckptfs-deferred"};
  std::filesystem::path index_ = tmp_.path() / "index";
  const scan::FileScan scan_ = file_scan();
  const source::Fingerprint old_{40, 7, kFile.size(), 1700000000000000000, 1700000000000000000};
  const source::Fingerprint other_{41, 9, kFile.size(), 1700000000000000000, 1700000000000000000};
};

TEST_F(DeferredCheckTest, TheSameHeadersMatchWhateverTheTensorBytes) {
  const DeferredCheck check(digest_of("HEADMIDTAIL"), scan_, index_, store_entries());
  EXPECT_TRUE(check.pending());
  const UniqueFd fd = open_file("HEADxxxxxxxxMIDyyyTAIL");
  std::string why;
  EXPECT_EQ(check.verify(fd.get(), "f.ckpt", scan_, 0, why), Result::kMatched);
  EXPECT_FALSE(check.pending());
  EXPECT_TRUE(stored(old_));
  EXPECT_TRUE(stored(other_));
}

TEST_F(DeferredCheckTest, OtherHeadersAreRefusedForGoodAndTheEntryDropped) {
  const DeferredCheck check(digest_of("HEADMIDTAIL"), scan_, index_, store_entries());
  ASSERT_TRUE(stored(old_));
  ASSERT_TRUE(stored(other_));
  const UniqueFd fd = open_file("HEADccccccccMJDdddTAIL");  // one header byte
  std::string why;
  EXPECT_EQ(check.verify(fd.get(), "f.ckpt", scan_, 0, why), Result::kDiffers);
  EXPECT_THAT(why, HasSubstr("headers are not those the index was made from"));
  EXPECT_THAT(why, HasSubstr("mount again"));
  EXPECT_FALSE(check.pending());
  EXPECT_FALSE(stored(old_));
  EXPECT_TRUE(stored(other_));
  // Final: not read again (no descriptor), even once the file is put back.
  why.clear();
  EXPECT_EQ(check.verify(-1, "f.ckpt", scan_, 0, why), Result::kDiffers);
  EXPECT_THAT(why, HasSubstr("headers are not those"));
}

// The index may be open elsewhere in this process when a check fails (another source's check
// dropping its entry, a step being planned): LMDB allows one handle a process, so the drop
// waits for it rather than leaving the entry for the next mount to trust again.
TEST_F(DeferredCheckTest, TheEntryIsDroppedOnceTheIndexOpenHereIsClosed) {
  const DeferredCheck check(digest_of("HEADMIDTAIL"), scan_, index_, store_entries());
  auto held = std::make_unique<Store>(index_);
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    held.reset();
  });
  const UniqueFd fd = open_file("HEADccccccccMJDdddTAIL");
  std::string why;
  const Result got = check.verify(fd.get(), "f.ckpt", scan_, 0, why);
  closer.join();
  EXPECT_EQ(got, Result::kDiffers);
  EXPECT_FALSE(stored(old_));
  EXPECT_TRUE(stored(other_));
}

TEST_F(DeferredCheckTest, AReadErrorIsAskedAgainAndDropsNothing) {
  const DeferredCheck check(digest_of("HEADMIDTAIL"), scan_, index_, store_entries());
  const UniqueFd shorter = open_file(kFile.substr(0, 16), "short.ckpt");
  std::string why;
  EXPECT_EQ(check.verify(shorter.get(), "short.ckpt", scan_, 0, why), Result::kUnreadable);
  EXPECT_THAT(why, HasSubstr("short.ckpt"));
  EXPECT_TRUE(check.pending());
  EXPECT_TRUE(stored(old_));
  EXPECT_EQ(check.verify(-1, "f.ckpt", scan_, 0, why), Result::kUnreadable);
  const UniqueFd fd = open_file(kFile);
  EXPECT_EQ(check.verify(fd.get(), "f.ckpt", scan_, 0, why), Result::kMatched);
}

TEST_F(DeferredCheckTest, ManyThreadsAtOnceGetOneAnswer) {
  for (const bool same : {true, false}) {
    const DeferredCheck check(digest_of("HEADMIDTAIL"), scan_, index_, "");
    const UniqueFd fd = open_file(same ? kFile : "HEADccccccccMIDdddTAIX");
    std::vector<Result> got(8);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < got.size(); ++i)
      threads.emplace_back([&, i] {
        std::string why;
        got[i] = check.verify(fd.get(), "f.ckpt", scan_, 0, why);
      });
    for (std::thread& t : threads) t.join();
    for (const Result r : got) EXPECT_EQ(r, same ? Result::kMatched : Result::kDiffers);
  }
}

// A file of three 1 MiB regions and a tail: a 16-byte header opens each region, the rest of
// the region is one tensor's content, and the last 100 bytes are structure too. Labelled a
// safetensors file, the one format checked by prefix (a real one keeps all its structure in its
// header: RewrittenSourceTest).
constexpr uint64_t kMiB = uint64_t{1} << 20;

class PrefixCheckTest : public DeferredCheckTest {
 protected:
  PrefixCheckTest() {
    big_.format = scan::SourceFormat::Safetensors;
    big_.file_size = big_.body_size = 3 * kMiB + 100;
    for (int r = 0; r < 3; ++r)
      big_.params.push_back(param(static_cast<char>('a' + r), "Int8", 1, {r * kMiB + 16, kMiB - 16},
                                  {r * kMiB, kMiB}));
  }
  // The file's bytes, with region `changed`'s header (if any) rewritten.
  std::string bytes(int changed = -1) const {
    std::string out(big_.file_size, 'c');
    for (int r = 0; r < 3; ++r) out.replace(r * kMiB, 16, header(r, r == changed));
    out.replace(3 * kMiB, 100, std::string(100, 'T'));
    return out;
  }
  static std::string header(int r, bool changed) {
    std::string h = "HEADER-OF-REGN-" + std::to_string(r);
    if (changed) h[0] = 'X';
    return h;
  }
  // By construction: the headers' CRC whole and one per region.
  StructureDigest digest() const {
    std::string all;
    StructureDigest d;
    d.region = kMiB;
    for (int r = 0; r < 3; ++r) {
      all += header(r, false);
      d.regions.push_back(bytes_crc(header(r, false)));
    }
    all += std::string(100, 'T');
    d.regions.push_back(bytes_crc(std::string(100, 'T')));
    d.bytes = all.size();
    d.crc = bytes_crc(all);
    return d;
  }
  scan::FileScan big_;
};

TEST_F(PrefixCheckTest, TheDigestIsTheOneIndexBuildTakes) {
  const UniqueFd fd = open_file(bytes());
  EXPECT_EQ(structure_digest(fd.get(), "f.ckpt", big_), digest());
}

// A read of the first bytes waits for the first region only: the rest of the file is not read
// (here it is not even there).
TEST_F(PrefixCheckTest, APrefixIsReadNoFurtherThanTheReadGoes) {
  const DeferredCheck check(digest(), big_, index_, store_entries());
  EXPECT_FALSE(check.whole());
  const UniqueFd fd = open_file(bytes().substr(0, kMiB + kMiB / 2));
  std::string why;
  EXPECT_FALSE(check.needs(0));
  EXPECT_EQ(check.verify(fd.get(), "f.ckpt", big_, 0, why), Result::kMatched);
  EXPECT_TRUE(check.needs(1));
  EXPECT_EQ(check.verify(fd.get(), "f.ckpt", big_, 100, why), Result::kMatched);
  EXPECT_FALSE(check.needs(kMiB));
  EXPECT_EQ(check.verify(fd.get(), "f.ckpt", big_, 2 * kMiB, why), Result::kMatched);
  EXPECT_TRUE(check.pending());
  EXPECT_EQ(check.verify(fd.get(), "f.ckpt", big_, 2 * kMiB + 1, why), Result::kUnreadable);
  EXPECT_TRUE(stored(old_));
  const UniqueFd whole = open_file(bytes(), "whole.ckpt");
  EXPECT_EQ(check.verify(whole.get(), "f.ckpt", big_, 3 * kMiB + 100, why), Result::kMatched);
  EXPECT_FALSE(check.pending());
}

TEST_F(PrefixCheckTest, ARewriteIsFoundInItsRegionAndRefusedForGood) {
  const DeferredCheck check(digest(), big_, index_, store_entries());
  const UniqueFd fd = open_file(bytes(2));
  std::string why;
  EXPECT_EQ(check.verify(fd.get(), "f.ckpt", big_, 2 * kMiB, why), Result::kMatched);
  EXPECT_TRUE(stored(old_));
  EXPECT_EQ(check.verify(fd.get(), "f.ckpt", big_, 2 * kMiB + 17, why), Result::kDiffers);
  EXPECT_THAT(why, HasSubstr("mount again"));
  EXPECT_TRUE(check.differs());
  EXPECT_FALSE(stored(old_));
  EXPECT_TRUE(stored(other_));
  EXPECT_EQ(check.verify(fd.get(), "f.ckpt", big_, 1, why), Result::kDiffers);
}

// A torch zip is read from its directory at the end, a `.ckpt`'s later records and fields can
// move the bytes of an earlier name (RewrittenSourceTest): a prefix proves nothing there.
TEST_F(PrefixCheckTest, AFormatNotParsedFromItsStartIsCheckedWhole) {
  for (const scan::SourceFormat format : {scan::SourceFormat::TorchZip, scan::SourceFormat::Ckpt}) {
    big_.format = format;
    const DeferredCheck check(digest(), big_, index_, "");
    EXPECT_TRUE(check.whole());
    const UniqueFd fd = open_file(bytes(2));
    std::string why;
    EXPECT_EQ(check.verify(fd.get(), "f.ckpt", big_, 0, why), Result::kDiffers);
  }
}

// A region as large as 64 bits allow (a forged entry: one region for the whole file) is the
// whole file, from the first read: no offset wraps.
TEST_F(PrefixCheckTest, ARegionOfAllSixtyFourBitsIsTheWholeFile) {
  StructureDigest want = digest();
  want.region = ~uint64_t{0};
  want.regions = {want.crc};
  const DeferredCheck check(want, big_, index_, "");
  EXPECT_TRUE(check.needs(1));
  const UniqueFd changed = open_file(bytes(2));
  std::string why;
  EXPECT_EQ(check.verify(changed.get(), "f.ckpt", big_, 1, why), Result::kDiffers);
  const DeferredCheck same(want, big_, index_, "");
  const UniqueFd fd = open_file(bytes(), "same.ckpt");
  EXPECT_EQ(same.verify(fd.get(), "f.ckpt", big_, 1, why), Result::kMatched);
  EXPECT_FALSE(same.pending());
}

// A shipped index is never written: nothing is dropped, and the line says to rebuild it.
TEST_F(PrefixCheckTest, AShippedIndexIsToBeRebuiltAndKeepsItsEntries) {
  store_entries();
  const DeferredCheck check(digest(), big_, index_, old_.key(), /*shipped=*/true);
  const UniqueFd fd = open_file(bytes(0));
  std::string why;
  EXPECT_EQ(check.verify(fd.get(), "f.ckpt", big_, 1, why), Result::kDiffers);
  EXPECT_THAT(why,
              HasSubstr("rebuild it with `ckptfs index build SRC --output " + index_.string()));
  EXPECT_TRUE(stored(old_));
}

// Real files, digested as index build digests them, rewritten in place with their size kept:
// whether a read of a parameter's bytes whose structure checks pass gets the bytes that the
// file, as it is now, holds under that name (the parameters as MindSpore loads them, by the
// scanner: an independent reading of the rewritten file).
class RewrittenSourceTest : public DeferredCheckTest {
 protected:
  // One .ckpt record: `tag`, an Int8 tensor of `content`, the tag after the tensor when
  // `tag_last` (protobuf fields may come in any order).
  static std::string record(std::string_view tag, std::string_view content, bool tag_last = false) {
    if (!tag_last) {
      const int64_t dims[] = {static_cast<int64_t>(content.size())};
      return ckpt::record_header(tag, dims, "Int8", content.size()) + std::string(content);
    }
    std::string tensor = "\x08";
    ckpt::put_varint(tensor, content.size());
    tensor += "\x12\x04Int8\x1a";
    ckpt::put_varint(tensor, content.size());
    tensor += content;
    std::string value = "\x12";
    ckpt::put_varint(value, tensor.size());
    value += tensor + "\x0a";
    ckpt::put_varint(value, tag.size());
    value += tag;
    std::string out = "\x0a";
    ckpt::put_varint(out, value.size());
    return out + value;
  }
  // Where the file now places parameter `name`'s bytes, as MindSpore would load it.
  static std::optional<scan::Extent> now_at(int fd, std::string_view name) {
    for (const scan::Param& p : ckpt::loaded_params(ckpt::scan_checkpoint_fd(fd, "now.ckpt")))
      if (p.name == name && p.content.size() == 1) return p.content.front();
    return std::nullopt;
  }
  // Makes the check index build's digest of `before` gives, and verifies `after` up to the end
  // of parameter `name`'s bytes as `before` placed them: the read of them that a view makes.
  Result read_of(const std::string& before, const std::string& after, std::string_view name) {
    const UniqueFd old_fd = open_file(before, "before.ckpt");
    const scan::FileScan scan = ckpt::scan_checkpoint_fd(old_fd.get(), "before.ckpt");
    const DeferredCheck check(structure_digest(old_fd.get(), "before.ckpt", scan), scan, index_,
                              "");
    const std::optional<scan::Extent> was = now_at(old_fd.get(), name);
    if (!was) ADD_FAILURE() << name << " not in the file before";
    const UniqueFd fd = open_file(after, "after.ckpt");
    std::string why;
    return check.verify(fd.get(), "after.ckpt", scan, was ? was->offset + was->length : 0, why);
  }
};

// MindSpore loads the last of two non-adjacent records of one name. A later record renamed to
// an earlier one's name (same length: the size kept) moves that name's bytes to it, yet every
// structure byte up to the end of the earlier record is as indexed.
TEST_F(RewrittenSourceTest, ALaterCkptRecordRenamedAsAnEarlierOneIsFoundBeforeItsBytesAreServed) {
  const std::string a(kMiB, 'A'), b(kMiB, 'B'), c(kMiB, 'C');
  const std::string before = record("aa", a) + record("bb", b) + record("cc", c);
  const std::string after = record("aa", a) + record("bb", b) + record("aa", c);
  ASSERT_EQ(after.size(), before.size());
  {
    // The attack is real: the rewritten file holds "aa" in its third record, past 2 MiB.
    const UniqueFd fd = open_file(after, "now.ckpt");
    const std::optional<scan::Extent> now = now_at(fd.get(), "aa");
    ASSERT_TRUE(now);
    EXPECT_GT(now->offset, 2 * kMiB);
  }
  EXPECT_NE(read_of(before, after, "aa"), Result::kMatched);
}

// Protobuf fields come in any order, and the scanner takes them so: a record's tag may follow
// its tensor. A tag after a content that ends on a region's edge lies in the next region.
TEST_F(RewrittenSourceTest, ACkptTagAfterItsContentIsComparedBeforeTheContentIsServed) {
  // "aa"'s content ends at 1 MiB, its tag (4 bytes) follows.
  std::string a(kMiB - 64, 'A');
  while (record("aa", a, true).size() < kMiB + 4) a.push_back('A');
  ASSERT_EQ(record("aa", a, true).size(), kMiB + 4);
  const std::string before = record("aa", a, true) + record("bb", std::string(kMiB, 'B'));
  ASSERT_EQ(before.find("\x0a\x02"
                        "aa",
                        kMiB - 2),
            kMiB);  // the tag opens the second region
  std::string after = before;
  after.replace(kMiB + 2, 2, "zz");
  {
    const UniqueFd fd = open_file(after, "now.ckpt");
    EXPECT_FALSE(now_at(fd.get(), "aa"));  // no "aa" any more
    EXPECT_TRUE(now_at(fd.get(), "zz"));
  }
  EXPECT_NE(read_of(before, after, "aa"), Result::kMatched);
}

// A safetensors header comes first and says where every tensor lies: a byte of any tensor lies
// past all of it, so a read of it has every header region compared. Here a header of more than
// a region, whose last two entries (data at the end of the file) have their names swapped.
TEST_F(RewrittenSourceTest, ASafetensorsHeaderRewrittenAnywhereIsFoundByTheFirstTensorsRead) {
  constexpr int kTensors = 20000;
  std::string json = "{";
  for (int i = 0; i < kTensors; ++i)
    json += fmt::format("{}\"t{:05}\":{{\"dtype\":\"U8\",\"shape\":[64],\"data_offsets\":[{},{}]}}",
                        i == 0 ? "" : ",", i, i * 64, (i + 1) * 64);
  json += "}";
  json.resize((json.size() + 7) / 8 * 8, ' ');
  ASSERT_GT(json.size(), kMiB);
  std::string before(8, '\0');
  for (int i = 0; i < 8; ++i) before[i] = static_cast<char>(json.size() >> (8 * i));
  before += json;
  for (int i = 0; i < kTensors; ++i) before += std::string(64, static_cast<char>('a' + i % 26));
  std::string after = before;
  const size_t x = after.find(fmt::format("\"t{:05}\"", kTensors - 2));
  const size_t y = after.find(fmt::format("\"t{:05}\"", kTensors - 1));
  after.replace(x + 2, 5, fmt::format("{:05}", kTensors - 1));
  after.replace(y + 2, 5, fmt::format("{:05}", kTensors - 2));
  const UniqueFd old_fd = open_file(before, "before.safetensors");
  const scan::FileScan scan = safetensors::scan_safetensors_fd(old_fd.get(), "before.safetensors");
  ASSERT_EQ(scan.format, scan::SourceFormat::Safetensors);
  const DeferredCheck check(structure_digest(old_fd.get(), "before.safetensors", scan), scan,
                            index_, "");
  ASSERT_FALSE(check.whole());
  const UniqueFd fd = open_file(after, "after.safetensors");
  std::string why;
  // The first byte of the first tensor.
  EXPECT_EQ(check.verify(fd.get(), "after.safetensors", scan, 8 + json.size() + 1, why),
            Result::kDiffers);
}

}  // namespace
}  // namespace ckptfs::index
