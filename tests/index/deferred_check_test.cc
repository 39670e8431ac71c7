// The structure check a mount over a FUSE filesystem defers to the first read of a source whose
// scan the index gave by path, size and mtime: made once, before any byte is served, and a file
// whose headers differ has its index entries dropped so that the next mount scans it again.
#include "ckptfs/index/deferred_check.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ckptfs/ckpt/crc32.h"
#include "ckptfs/index/store.h"
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
StructureDigest digest_of(std::string_view structure) {
  return {structure.size(),
          ckpt::crc32_update(
              0, std::span(reinterpret_cast<const uint8_t*>(structure.data()), structure.size()))};
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
  const DeferredCheck check(digest_of("HEADMIDTAIL"), index_, store_entries());
  EXPECT_TRUE(check.pending());
  const UniqueFd fd = open_file("HEADxxxxxxxxMIDyyyTAIL");
  std::string why;
  EXPECT_EQ(check.verify(fd.get(), "f.ckpt", scan_, why), Result::kMatched);
  EXPECT_FALSE(check.pending());
  EXPECT_TRUE(stored(old_));
  EXPECT_TRUE(stored(other_));
}

TEST_F(DeferredCheckTest, OtherHeadersAreRefusedForGoodAndTheEntryDropped) {
  const DeferredCheck check(digest_of("HEADMIDTAIL"), index_, store_entries());
  ASSERT_TRUE(stored(old_));
  ASSERT_TRUE(stored(other_));
  const UniqueFd fd = open_file("HEADccccccccMJDdddTAIL");  // one header byte
  std::string why;
  EXPECT_EQ(check.verify(fd.get(), "f.ckpt", scan_, why), Result::kDiffers);
  EXPECT_THAT(why, HasSubstr("headers are not those the index was made from"));
  EXPECT_THAT(why, HasSubstr("mount again"));
  EXPECT_FALSE(check.pending());
  EXPECT_FALSE(stored(old_));
  EXPECT_TRUE(stored(other_));
  // Final: not read again (no descriptor), even once the file is put back.
  why.clear();
  EXPECT_EQ(check.verify(-1, "f.ckpt", scan_, why), Result::kDiffers);
  EXPECT_THAT(why, HasSubstr("headers are not those"));
}

// The index may be open elsewhere in this process when a check fails (another source's check
// dropping its entry, a step being planned): LMDB allows one handle a process, so the drop
// waits for it rather than leaving the entry for the next mount to trust again.
TEST_F(DeferredCheckTest, TheEntryIsDroppedOnceTheIndexOpenHereIsClosed) {
  const DeferredCheck check(digest_of("HEADMIDTAIL"), index_, store_entries());
  auto held = std::make_unique<Store>(index_);
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    held.reset();
  });
  const UniqueFd fd = open_file("HEADccccccccMJDdddTAIL");
  std::string why;
  const Result got = check.verify(fd.get(), "f.ckpt", scan_, why);
  closer.join();
  EXPECT_EQ(got, Result::kDiffers);
  EXPECT_FALSE(stored(old_));
  EXPECT_TRUE(stored(other_));
}

TEST_F(DeferredCheckTest, AReadErrorIsAskedAgainAndDropsNothing) {
  const DeferredCheck check(digest_of("HEADMIDTAIL"), index_, store_entries());
  const UniqueFd shorter = open_file(kFile.substr(0, 16), "short.ckpt");
  std::string why;
  EXPECT_EQ(check.verify(shorter.get(), "short.ckpt", scan_, why), Result::kUnreadable);
  EXPECT_THAT(why, HasSubstr("short.ckpt"));
  EXPECT_TRUE(check.pending());
  EXPECT_TRUE(stored(old_));
  EXPECT_EQ(check.verify(-1, "f.ckpt", scan_, why), Result::kUnreadable);
  const UniqueFd fd = open_file(kFile);
  EXPECT_EQ(check.verify(fd.get(), "f.ckpt", scan_, why), Result::kMatched);
}

TEST_F(DeferredCheckTest, ManyThreadsAtOnceGetOneAnswer) {
  for (const bool same : {true, false}) {
    const DeferredCheck check(digest_of("HEADMIDTAIL"), index_, "");
    const UniqueFd fd = open_file(same ? kFile : "HEADccccccccMIDdddTAIX");
    std::vector<Result> got(8);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < got.size(); ++i)
      threads.emplace_back([&, i] {
        std::string why;
        got[i] = check.verify(fd.get(), "f.ckpt", scan_, why);
      });
    for (std::thread& t : threads) t.join();
    for (const Result r : got) EXPECT_EQ(r, same ? Result::kMatched : Result::kDiffers);
  }
}

}  // namespace
}  // namespace ckptfs::index
