// index_sources over real (tiny) checkpoint files: what is scanned, what comes from the index,
// and what happens when files change between runs.
#include <fcntl.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "ckptfs/ckpt/encoder.h"
#include "ckptfs/error.h"
#include "ckptfs/index/store.h"
#include "support/test_support.h"

namespace ckptfs::index {
namespace {

// A digest no file of these tests has (one structure byte).
StructureDigest not_its_structure() {
  StructureDigest d;
  d.bytes = d.crc = 1;
  return d;
}

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// Spec §1.3: parameter "w", shape [2], Float32 1.0, 2.0, as 28 bytes.
const std::string kSpecRecord{
    "\x0A\x1A\x0A\x01w\x12\x15\x08\x02\x12\x07"
    "Float32\x1A\x08\x00\x00\x80\x3F\x00\x00\x00\x40",
    28};

// One Float32 record per name, each of `elements` elements.
std::string records(const std::vector<std::string>& names, int64_t elements) {
  std::string out;
  for (const std::string& name : names) {
    const std::vector<int64_t> dims{elements};
    out += ckpt::record_header(name, dims, "Float32", 4 * elements);
    out += std::string(4 * elements, '\x11');
  }
  return out;
}

class IndexSourcesTest : public ::testing::Test {
 protected:
  // Writes root_/relative with an old, distinct mtime, so that a later rewrite moves it.
  fs::path write(const std::string& relative, const std::string& bytes) {
    const fs::path path = testsupport::write_file(root_ / relative, bytes);
    testsupport::set_mtime(path, 1'000'000'000, 0);
    return path;
  }

  std::vector<bool> hits(const std::vector<IndexedSource>& sources) {
    std::vector<bool> out;
    for (const IndexedSource& s : sources) out.push_back(s.from_index);
    return out;
  }

  testsupport::TempDir tmp_{"ckptfs-sources"};
  fs::path root_ = tmp_.path();
};

TEST_F(IndexSourcesTest, SpecRecordIsScannedThenServedFromTheIndex) {
  const fs::path path = write("src/rank_0/net.ckpt", kSpecRecord);
  for (bool second : {false, true}) {
    Store store(root_ / "index");
    const std::vector<IndexedSource> sources = index_sources(store, {path});
    ASSERT_EQ(sources.size(), 1u);
    const IndexedSource& s = sources[0];
    EXPECT_EQ(s.from_index, second);
    EXPECT_EQ(s.file.path, path);
    EXPECT_TRUE(s.file.fd);
    EXPECT_EQ(s.file.fingerprint.size, 28u);
    EXPECT_EQ(s.scan.file_size, 28u);
    EXPECT_EQ(s.scan.body_size, 28u);
    EXPECT_FALSE(s.scan.has_crc_trailer);
    ASSERT_EQ(s.scan.params.size(), 1u);
    const scan::Param& w = s.scan.params[0];
    EXPECT_EQ(w.name, "w");
    EXPECT_EQ(w.dtype, "Float32");
    EXPECT_EQ(w.shape, std::vector<int64_t>{2});
    EXPECT_EQ(w.kind, scan::EntryKind::Tensor);
    EXPECT_EQ(w.element_size, 4u);
    EXPECT_EQ(w.content, (scan::Extents{{20, 8}}));
    EXPECT_EQ(w.records, (scan::Extents{{0, 28}}));
  }
  // Stored under the absolute path, with the file's fingerprint.
  const std::vector<Entry> entries = Store(root_ / "index").entries();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].path, path.string());
  EXPECT_EQ(entries[0].params, 1u);
  EXPECT_EQ(entries[0].fingerprint.size, 28u);
}

TEST_F(IndexSourcesTest, ChangedFilesAreRescannedAndUnchangedOnesAreHits) {
  const std::vector<fs::path> paths = {write("src/rank_0/a.ckpt", records({"x", "y"}, 2)),
                                       write("src/rank_1/b.ckpt", records({"x", "y"}, 3)),
                                       write("src/rank_2/c.ckpt", records({"x", "y"}, 4)),
                                       write("src/rank_3/d.ckpt", records({"x", "y"}, 5))};
  Store store(root_ / "index");
  EXPECT_EQ(hits(index_sources(store, paths)), (std::vector<bool>{false, false, false, false}));
  EXPECT_EQ(hits(index_sources(store, paths)), (std::vector<bool>{true, true, true, true}));

  // b: rewritten with other content; c: only touched; d: replaced by rename with the same bytes
  // and mtime (a copy with its mtime kept), which its structure bytes show to be the same scan.
  { std::ofstream(paths[1], std::ios::binary | std::ios::trunc) << records({"x", "y", "z"}, 3); }
  const struct timespec later[2] = {{1'000'000'001, 0}, {1'000'000'001, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, paths[2].c_str(), later, 0), 0);
  const fs::path next = write("src/rank_3/d.tmp", records({"x", "y"}, 5));
  fs::rename(next, paths[3]);

  const std::vector<IndexedSource> after = index_sources(store, paths);
  EXPECT_EQ(hits(after), (std::vector<bool>{true, false, false, true}));
  EXPECT_EQ(after[1].scan.params.size(), 3u);
  EXPECT_EQ(after[1].scan.params[2].name, "z");
  for (size_t i = 0; i < paths.size(); ++i) EXPECT_EQ(after[i].file.path, paths[i]);

  EXPECT_EQ(hits(index_sources(store, paths)), (std::vector<bool>{true, true, true, true}));
  // The previous versions' entries were replaced, not kept beside the new ones.
  EXPECT_EQ(store.entries().size(), 4u);
}

// A FUSE or network filesystem (s3fs after the kernel forgot the inode, NFS or s3fs mounted
// again) gives an unchanged file another device and inode, keeping its size, mtime and ctime:
// the entry is found by path and used without reading the file (its stored structure digest
// here is one no file has, so a check would have rescanned), then recorded under the new
// fingerprint.
TEST_F(IndexSourcesTest, FileWithAnotherInodeAndItsTimesKeptIsAHitWithoutReadingIt) {
  const fs::path a = write("src/rank_0/a.ckpt", records({"wq", "wk"}, 4));
  const source::Fingerprint now = source::SourceFile::open(a).fingerprint;
  const scan::FileScan scan = index_sources(nullptr, {a})[0].scan;
  Store store(root_ / "index");
  source::Fingerprint before = now;
  before.dev += 1;
  before.ino += 1;
  const Store::NewEntry entry{a.string(), before, &scan, not_its_structure()};
  store.insert(std::span(&entry, 1));

  const std::vector<IndexedSource> sources = index_sources(store, {a});
  EXPECT_EQ(hits(sources), std::vector<bool>{true});
  EXPECT_EQ(sources[0].scan.params[1].name, "wk");
  EXPECT_EQ(store.fingerprint(a.string()), now);
  EXPECT_EQ(store.entries().size(), 1u);
  // index build finds it the same way.
  store.insert(std::span(&entry, 1));
  EXPECT_EQ(build_index(&store, {a}).from_index, 1u);
  EXPECT_EQ(store.fingerprint(a.string()), now);
  EXPECT_EQ(freshness(Entry{a.string(), before, 2}).state, Freshness::kCurrent);

  // Another size or mtime is never looked at further.
  for (const bool size : {true, false}) {
    source::Fingerprint other = before;
    if (size)
      other.size += 1;
    else
      other.mtime_ns += 1;
    store.clear();
    const Store::NewEntry stale{a.string(), other, &scan, not_its_structure()};
    store.insert(std::span(&stale, 1));
    EXPECT_EQ(hits(index_sources(store, {a})), std::vector<bool>{false}) << size;
  }
}

// Another inode and ctime with the size and mtime kept (a copy with its mtime kept, a chmod, a
// rewrite in place with the mtime put back): the file's structure bytes decide. Two same-shaped
// tensors' names swapped are found and the file scanned again; the same headers are a hit.
TEST_F(IndexSourcesTest, FileWithItsCtimeMovedIsCheckedAgainstItsStructure) {
  const std::vector<fs::path> paths = {write("src/rank_0/a.ckpt", records({"wq", "wk"}, 4)),
                                       write("src/rank_1/b.ckpt", records({"wq", "wk"}, 4))};
  Store store(root_ / "index");
  EXPECT_EQ(hits(index_sources(store, paths)), (std::vector<bool>{false, false}));
  const source::Fingerprint was = *store.fingerprint(paths[1].string());
  // File times tick at the kernel's clock granularity (a few ms): let the ctime move.
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  fs::rename(write("src/rank_0/a.tmp", records({"wq", "wk"}, 4)), paths[0]);
  write("src/rank_1/b.ckpt", records({"wk", "wq"}, 4));  // in place: the same size and mtime
  const source::Fingerprint rewritten = source::SourceFile::open(paths[1]).fingerprint;
  ASSERT_EQ(rewritten.size, was.size);
  ASSERT_EQ(rewritten.mtime_ns, was.mtime_ns);
  ASSERT_NE(rewritten.ctime_ns, was.ctime_ns);

  const std::vector<IndexedSource> after = index_sources(store, paths);
  EXPECT_EQ(hits(after), (std::vector<bool>{true, false}));
  EXPECT_EQ(after[1].scan.params[0].name, "wk");
  EXPECT_EQ(hits(index_sources(store, paths)), (std::vector<bool>{true, true}));
  EXPECT_EQ(store.entries().size(), 2u);
}

TEST_F(IndexSourcesTest, ResultsKeepInputOrderAcrossManyFiles) {
  std::vector<fs::path> paths;
  for (int rank = 63; rank >= 0; --rank) {
    paths.push_back(write(fmt::format("src/rank_{}/net.ckpt", rank),
                          records({fmt::format("p{}", rank)}, 1 + rank % 7)));
  }
  Store store(root_ / "index");
  for (bool second : {false, true}) {
    const std::vector<IndexedSource> sources = index_sources(store, paths);
    ASSERT_EQ(sources.size(), paths.size());
    for (size_t i = 0; i < paths.size(); ++i) {
      const int rank = 63 - static_cast<int>(i);
      SCOPED_TRACE(rank);
      EXPECT_EQ(sources[i].from_index, second);
      EXPECT_EQ(sources[i].file.path, paths[i]);
      ASSERT_EQ(sources[i].scan.params.size(), 1u);
      EXPECT_EQ(sources[i].scan.params[0].name, fmt::format("p{}", rank));
      EXPECT_EQ(sources[i].scan.params[0].shape, std::vector<int64_t>{1 + rank % 7});
    }
  }
  EXPECT_EQ(store.entries().size(), 64u);
}

TEST_F(IndexSourcesTest, SamePathTwiceGivesTwoResults) {
  const fs::path path = write("src/rank_0/a.ckpt", kSpecRecord);
  Store store(root_ / "index");
  EXPECT_EQ(hits(index_sources(store, {path, path})), (std::vector<bool>{false, false}));
  EXPECT_EQ(hits(index_sources(store, {path, path})), (std::vector<bool>{true, true}));
  EXPECT_EQ(store.entries().size(), 1u);
}

TEST_F(IndexSourcesTest, EmptyInputIsEmptyOutput) {
  Store store(root_ / "index");
  EXPECT_TRUE(index_sources(store, {}).empty());
}

TEST_F(IndexSourcesTest, MissingFileIsAnErrorNamingIt) {
  const fs::path missing = root_ / "src/rank_0/missing.ckpt";
  Store store(root_ / "index");
  try {
    index_sources(store, {missing});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(missing.string()));
  }
}

TEST_F(IndexSourcesTest, MalformedFileIsAnErrorAndTheGoodOnesBeforeItAreKept) {
  std::vector<fs::path> paths;
  for (int rank = 0; rank < 5; ++rank) {
    paths.push_back(write(fmt::format("src/rank_{}/a.ckpt", rank), kSpecRecord));
  }
  // A record cut short: the scanner must refuse it.
  paths.push_back(write("src/rank_5/a.ckpt", kSpecRecord.substr(0, 25)));
  Store store(root_ / "index");
  try {
    index_sources(store, paths);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(paths[5].string()));
  }
  // The five good files were recorded; the retry only scans the bad one (now fixed).
  EXPECT_EQ(store.entries().size(), 5u);
  write("src/rank_5/a.ckpt", kSpecRecord);
  const std::vector<IndexedSource> retry = index_sources(store, paths);
  EXPECT_EQ(hits(retry), (std::vector<bool>{true, true, true, true, true, false}));
}

// A shipped index compares a file's size and mtime only (it is copied between machines): a
// rewrite in place that keeps both, here two same-shaped tensors' names swapped, is found by the
// file's header bytes, and refused in one line naming the file.
TEST_F(IndexSourcesTest, ShippedIndexRefusesAFileRewrittenWithItsSizeAndMtimeKept) {
  const fs::path a = write("src/rank_0/a.ckpt", records({"wq", "wk"}, 4));
  const fs::path b = write("src/rank_1/b.ckpt", records({"wq", "wk"}, 4));
  {
    Store built(root_ / "shipped");
    EXPECT_EQ(build_index(&built, {a, b}).from_index, 0u);
  }
  {
    const Store shipped = Store::open_shipped(root_ / "shipped");
    const std::vector<IndexedSource> sources = index_sources_shipped(shipped, {a, b});
    EXPECT_EQ(sources[0].scan.params[0].name, "wq");
  }
  write("src/rank_1/b.ckpt", records({"wk", "wq"}, 4));  // the same size and mtime
  const Store shipped = Store::open_shipped(root_ / "shipped");
  try {
    index_sources_shipped(shipped, {a, b});
    FAIL() << "a stale scan was used";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(b.string()));
    EXPECT_THAT(e.what(), HasSubstr("other headers"));
    EXPECT_THAT(e.what(), HasSubstr("index build SRC --output"));
  }
}

// The cache index records each new scan's structure digest as well: a shipped index built from
// scans a mount made (the same store) checks them the same way.
TEST_F(IndexSourcesTest, ScansMadeByAMountCarryTheirStructureDigest) {
  const fs::path a = write("src/rank_0/a.ckpt", records({"wq", "wk"}, 4));
  {
    Store store(root_ / "index");
    const std::vector<IndexedSource> sources = index_sources(store, {a});
    EXPECT_EQ(sources[0].structure.bytes, 2 * (records({"wq"}, 4).size() - 16));
  }
  const Store shipped = Store::open_shipped(root_ / "index");
  EXPECT_EQ(index_sources_shipped(shipped, {a}).size(), 1u);
  write("src/rank_0/a.ckpt", records({"wk", "wq"}, 4));
  EXPECT_THROW(index_sources_shipped(shipped, {a}), Error);
}

}  // namespace
}  // namespace ckptfs::index

namespace ckptfs::index {
namespace {

// A torch.save file goes through the same index: scanned by its magic, not its name, and read
// back from LMDB with its views and object tree intact.
TEST(IndexTorchFiles, ScannedThenReadBackWithViewsAndTree) {
  testsupport::TempDir tmp{"ckptfs-torch-index"};
  const fs::path data = fs::path(CKPTFS_SOURCE_DIR) / "tests/data/hfai/hfai_t113_n4/PART_000.pt";
  const fs::path copy = tmp.path() / "renamed.bin";
  fs::copy_file(data, copy);
  Store store(tmp.path() / "index");
  const std::vector<IndexedSource> first = index_sources(store, {copy});
  const std::vector<IndexedSource> second = index_sources(store, {copy});
  ASSERT_FALSE(first[0].from_index);
  ASSERT_TRUE(second[0].from_index);
  const scan::FileScan& a = first[0].scan;
  const scan::FileScan& b = second[0].scan;
  EXPECT_EQ(a.format, scan::SourceFormat::TorchZip);
  EXPECT_EQ(b.format, scan::SourceFormat::TorchZip);
  EXPECT_EQ(a.tree, b.tree);
  EXPECT_NE(a.tree.find("\"__nshards__\",4"), std::string::npos);
  ASSERT_EQ(a.params.size(), b.params.size());
  bool strided = false;
  for (size_t i = 0; i < a.params.size(); ++i) {
    EXPECT_EQ(a.params[i].name, b.params[i].name);
    EXPECT_EQ(a.params[i].content, b.params[i].content);
    EXPECT_TRUE(b.params[i].view);
    EXPECT_EQ(a.params[i].strides, b.params[i].strides);
    EXPECT_EQ(a.params[i].storage_offset, b.params[i].storage_offset);
    strided |= b.params[i].storage_offset != 0;
  }
  EXPECT_TRUE(strided);  // bn.running_var and pos_ids sit at offsets in shared storages
}

}  // namespace
}  // namespace ckptfs::index
