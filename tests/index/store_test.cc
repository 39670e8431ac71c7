// The LMDB store: round trips of hand-built scans, invalidation, persistence and failures.
#include "ckptfs/index/store.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ckptfs/ckpt/crc32.h"
#include "ckptfs/error.h"
#include "ckptfs/index/lmdb.h"
#include "index.pb.h"
#include "support/test_support.h"

namespace ckptfs::index {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testsupport::unprivileged;

void expect_same(const scan::FileScan& a, const scan::FileScan& b) {
  EXPECT_EQ(a.format, b.format);
  EXPECT_EQ(a.file_size, b.file_size);
  EXPECT_EQ(a.body_size, b.body_size);
  EXPECT_EQ(a.has_crc_trailer, b.has_crc_trailer);
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    SCOPED_TRACE(a.params[i].name);
    EXPECT_EQ(a.params[i].name, b.params[i].name);
    EXPECT_EQ(a.params[i].dtype, b.params[i].dtype);
    EXPECT_EQ(a.params[i].shape, b.params[i].shape);
    EXPECT_EQ(a.params[i].dims_zero, b.params[i].dims_zero);
    EXPECT_EQ(a.params[i].kind, b.params[i].kind);
    EXPECT_EQ(a.params[i].element_size, b.params[i].element_size);
    EXPECT_EQ(a.params[i].content, b.params[i].content);
    EXPECT_EQ(a.params[i].records, b.params[i].records);
    EXPECT_EQ(a.params[i].view, b.params[i].view);
    EXPECT_EQ(a.params[i].storage_offset, b.params[i].storage_offset);
    EXPECT_EQ(a.params[i].strides, b.params[i].strides);
  }
  EXPECT_EQ(a.tree, b.tree);
}

// Every field set, and values that need all the bits of their types.
scan::FileScan full_scan() {
  scan::FileScan scan;
  scan.file_size = (uint64_t{1} << 40) + 27;
  scan.body_size = uint64_t{1} << 40;
  scan.has_crc_trailer = true;

  scan::Param& w = scan.params.emplace_back();
  w.name = "model.layers.0.attention.wq.weight";
  w.dtype = "BFloat16";
  w.shape = {16384, 32768};
  w.kind = scan::EntryKind::Tensor;
  w.element_size = 2;
  w.content = {{100, 536870912}, {536871100, 536870912}};
  w.records = {{0, 536871012}, {536871012, 536871000}};

  scan::Param& epoch = scan.params.emplace_back();
  epoch.name = "epoch_num";
  epoch.dtype = "Int64";
  epoch.dims_zero = true;
  epoch.element_size = 8;
  epoch.content = {{1073742100, 8}};
  epoch.records = {{1073742080, 34}};

  scan::Param& note = scan.params.emplace_back();
  note.name = "note";
  note.dtype = "str";
  note.shape = {};
  note.dims_zero = true;
  note.kind = scan::EntryKind::String;
  note.content = {{1073742200, 8}};
  note.records = {{1073742180, 27}};

  scan::Param& map = scan.params.emplace_back();
  map.name = "embedding.table";
  map.kind = scan::EntryKind::MapTensor;
  map.records = {{(uint64_t{1} << 40) - 1000, 1000}};

  scan::Param& opaque = scan.params.emplace_back();
  opaque.name = "quant.weight";
  opaque.dtype = "Int4";
  opaque.shape = {-1, 0, int64_t{1} << 62};
  opaque.kind = scan::EntryKind::Opaque;
  opaque.content = {{(uint64_t{1} << 40) - 2005, 5}};
  opaque.records = {{(uint64_t{1} << 40) - 2040, 40}};
  return scan;
}

scan::FileScan small_scan(uint64_t file_size, size_t params) {
  scan::FileScan scan;
  scan.file_size = scan.body_size = file_size;
  for (size_t i = 0; i < params; ++i) {
    scan::Param& p = scan.params.emplace_back();
    p.name = fmt::format("p{}", i);
    p.dtype = "Float32";
    p.shape = {1};
    p.element_size = 4;
    p.content = {{i * 30 + 26, 4}};
    p.records = {{i * 30, 30}};
  }
  return scan;
}

class StoreTest : public ::testing::Test {
 protected:
  // Rewrites the stored entry of `fp` through LMDB directly, as another version would have.
  void tamper(const source::Fingerprint& fp, const std::function<void(std::string&)>& change) {
    lmdb::Env env = lmdb::Env::open(dir_, kDefaultMapSize, 2, MDB_NOTLS);
    std::optional<lmdb::Txn> txn = lmdb::Txn::begin(env, 0);
    ASSERT_TRUE(txn);
    const MDB_dbi scans = txn->open_db(kScansDb, 0).value();
    std::optional<std::string_view> value = txn->get(scans, fp.key());
    ASSERT_TRUE(value);
    std::string bytes(*value);
    change(bytes);
    ASSERT_TRUE(txn->put(scans, fp.key(), bytes));
    ASSERT_TRUE(txn->commit());
  }
  // Rewrites the stored message of `fp` with a checksum that matches, as a writer with other
  // ideas (or a bug) would have.
  void rewrite(const source::Fingerprint& fp,
               const std::function<void(indexpb::ScannedFile&)>& change) {
    tamper(fp, [&](std::string& bytes) {
      ASSERT_GE(bytes.size(), 4u);
      indexpb::ScannedFile file;
      ASSERT_TRUE(file.ParseFromString(bytes.substr(0, bytes.size() - 4)));
      change(file);
      bytes = file.SerializeAsString();
      const uint32_t crc = ckpt::crc32_update(
          0, std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
      for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<char>(crc >> shift));
    });
  }

  testsupport::TempDir tmp_{"ckptfs-store"};
  fs::path root_ = tmp_.path();
  fs::path dir_ = root_ / "index";
  const source::Fingerprint fp_{2049, 1234567, (uint64_t{1} << 40) + 27, 1700000000123456789};
};

TEST_F(StoreTest, RoundTripKeepsEveryField) {
  const scan::FileScan scan = full_scan();
  Store store(dir_);
  EXPECT_FALSE(store.lookup(fp_).has_value());
  const Store::NewEntry item{"/src/rank_0/net.ckpt", fp_, &scan};
  store.insert(std::span(&item, 1));
  const std::optional<scan::FileScan> got = store.lookup(fp_);
  ASSERT_TRUE(got.has_value());
  expect_same(*got, scan);
}

TEST_F(StoreTest, TargetSummariesRoundTripAndAreReplacedAsAWhole) {
  {
    Store store(dir_);
    EXPECT_FALSE(store.targets_view().has_value());
    EXPECT_FALSE(store.target(0).has_value());
    const TargetSummary a{
        3,
        {{"checkpoint_3.ckpt", 1234, -1, false, {}},
         {"checkpoint_3.safetensors", (uint64_t{1} << 40) + 5, 1700000000123456789, true, {2, 7}}},
        {2, 6, 7}};
    const TargetSummary b{4, {{"checkpoint_4.ckpt", 99, 5, false, {}}}, {}};
    const std::vector<TargetSummary> both{a, b};
    store.put_targets("view one", "files one", both);
    const std::vector<TargetSummary> only_b{b};
    store.put_targets("view two", "files two", only_b);
    const std::vector<TargetSummary> again{a};
    store.put_targets("view two", "files three", again);
  }
  const Store shipped = Store::open_shipped(dir_);
  EXPECT_EQ(shipped.targets_view(), "view two");
  EXPECT_EQ(shipped.targets_files(), "files three");
  EXPECT_FALSE(shipped.target(4).has_value());  // not in the last put
  const std::optional<TargetSummary> got = shipped.target(3);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->rank, 3);
  ASSERT_EQ(got->files.size(), 2u);
  EXPECT_EQ(got->files[1].name, "checkpoint_3.safetensors");
  EXPECT_EQ(got->files[1].size, (uint64_t{1} << 40) + 5);
  EXPECT_EQ(got->files[1].mtime_ns, 1700000000123456789);
  EXPECT_TRUE(got->files[1].page_cache);
  EXPECT_EQ(got->files[1].source_ranks, (std::vector<int64_t>{2, 7}));
  EXPECT_TRUE(got->files[0].source_ranks.empty());
  EXPECT_EQ(got->files[0].mtime_ns, -1);
  EXPECT_FALSE(got->files[0].page_cache);
  EXPECT_EQ(got->source_ranks, (std::vector<int64_t>{2, 6, 7}));
}

// The entry reader decodes varints of up to nine bytes itself and hands longer ones to
// get_varint: a ScannedFile whose sizes are written with varints of every length from 1 to 10
// bytes (padded ones too, which protobuf accepts) must read as protobuf's own parser reads it, and
// one of 11 bytes, or of 10 whose last byte holds more than the 64th bit, must be refused.
TEST(DecodeEntryTest, VarintsOfEveryLengthReadAsProtobufReadsThem) {
  const auto entry = [](const std::string& size_varint) {
    std::string bytes = {0x08, static_cast<char>(kFormatVersion), 0x18};  // version, file_size
    bytes += size_varint;
    bytes += '\x20';  // body_size
    bytes += size_varint;
    return bytes;
  };
  const auto checked = [](std::string bytes) {
    const uint32_t crc = ckpt::crc32_update(
        0, std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
    for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<char>(crc >> shift));
    return bytes;
  };
  std::vector<std::string> varints;
  for (int length = 1; length <= 10; ++length) {
    std::string canonical, padded;  // the value 2^(7(length-1)), and 1 padded to this length
    for (int i = 0; i + 1 < length; ++i) canonical += '\x80';
    canonical += '\x01';
    padded = length == 1 ? std::string("\x01") : "\x81" + std::string(length - 2, '\x80') + '\x00';
    varints.push_back(canonical);
    varints.push_back(padded);
  }
  for (const std::string& v : varints) {
    SCOPED_TRACE(v.size());
    indexpb::ScannedFile parsed;
    ASSERT_TRUE(parsed.ParseFromString(entry(v)));
    std::string why;
    const std::optional<scan::FileScan> got =
        decode_entry(checked(entry(v)), parsed.file_size(), &why);
    ASSERT_TRUE(got.has_value()) << why;
    EXPECT_EQ(got->file_size, parsed.file_size());
    EXPECT_EQ(got->body_size, parsed.body_size());
  }
  for (const std::string& bad : {std::string(11, '\x80') + '\x00', std::string(9, '\x80')}) {
    SCOPED_TRACE(bad.size());
    indexpb::ScannedFile parsed;
    EXPECT_FALSE(parsed.ParseFromString(entry(bad)));
    std::string why;
    EXPECT_FALSE(decode_entry(checked(entry(bad)), 0, &why));
    EXPECT_EQ(why, "it does not decode");
  }
}

// A shipped index comes from another machine: a summary whose names could not be directory
// entries of the mount, whose sizes overflow an off_t or whose source ranks are not ascending
// reads as absent (the mount then plans the ranks itself), with the reason.
TEST(DecodeTargetTest, SummariesAMountCouldNotServeAreRefused) {
  const TargetSummary good{5, {{"checkpoint_5.ckpt", 10, 1, false, {0}}}, {0, 3}};
  std::string why;
  ASSERT_TRUE(decode_target(encode_target(good), 5, &why).has_value()) << why;
  EXPECT_FALSE(decode_target(encode_target(good), 6, &why).has_value());
  EXPECT_EQ(why, "it is the summary of rank 5");
  std::string damaged = encode_target(good);
  damaged[3] ^= 1;
  EXPECT_FALSE(decode_target(damaged, 5, &why).has_value());
  EXPECT_EQ(why, "its checksum does not match");
  const auto refused = [&](TargetSummary t) {
    t.rank = 5;
    why.clear();
    const bool ok = decode_target(encode_target(t), 5, &why).has_value();
    return !ok && !why.empty();
  };
  for (const std::string& name :
       {std::string(), std::string("."), std::string(".."), std::string("a/b"),
        std::string("a\0b", 3), std::string(256, 'x')}) {
    EXPECT_TRUE(refused({5, {{name, 1, 0, false, {}}}, {}})) << name;
  }
  EXPECT_TRUE(refused({5, {{"a", 1, 0, false, {}}, {"a", 2, 0, false, {}}}, {}}));
  EXPECT_TRUE(refused({5, {{"a", uint64_t{1} << 63, 0, false, {}}}, {}}));
  EXPECT_TRUE(refused({5, {}, {3, 3}}));
  EXPECT_TRUE(refused({5, {}, {4, 2}}));
  EXPECT_TRUE(refused({5, {}, {-1}}));
  EXPECT_TRUE(refused({5, {{"a", 1, 0, false, {2, 1}}}, {1, 2}}));  // a file's ranks unordered
  EXPECT_FALSE(
      refused({5, {{std::string(255, 'x'), (uint64_t{1} << 63) - 1, -1, true, {7}}}, {7}}));
}

TEST_F(StoreTest, FingerprintOfAPathWithoutDecodingItsScan) {
  const scan::FileScan scan = full_scan();
  Store store(dir_);
  EXPECT_FALSE(store.fingerprint("/src/rank_0/net.ckpt").has_value());
  const Store::NewEntry item{"/src/rank_0/net.ckpt", fp_, &scan};
  store.insert(std::span(&item, 1));
  EXPECT_EQ(store.fingerprint("/src/rank_0/net.ckpt"), fp_);
  EXPECT_FALSE(store.fingerprint("/src/rank_1/net.ckpt").has_value());
}

// Over a FUSE filesystem that hands inode numbers out again, two files of one size and mtime can
// have had the same fingerprint: the later scan replaced the earlier one under it, and the
// earlier file's path still leads there. Its lookup by path must miss, not give the other
// file's scan.
TEST_F(StoreTest, APathNeverGetsAnotherFilesScan) {
  const scan::FileScan first = small_scan(fp_.size, 2);
  const scan::FileScan second = small_scan(fp_.size, 3);
  Store store(dir_);
  const Store::NewEntry a{"/s3/rank_0/net.ckpt", fp_, &first};
  store.insert(std::span(&a, 1));
  std::string why;
  StructureDigest structure;
  ASSERT_TRUE(store.lookup_path(a.path, fp_.size, fp_.mtime_ns, why, structure)) << why;
  const Store::NewEntry b{"/s3/rank_1/net.ckpt", fp_, &second};
  store.insert(std::span(&b, 1));
  const std::optional<scan::FileScan> got =
      store.lookup_path(b.path, fp_.size, fp_.mtime_ns, why, structure);
  ASSERT_TRUE(got) << why;
  EXPECT_EQ(got->params.size(), 3u);
  EXPECT_FALSE(store.lookup_path(a.path, fp_.size, fp_.mtime_ns, why, structure));
  EXPECT_THAT(why, HasSubstr("the scan of another file, /s3/rank_1/net.ckpt"));
}

TEST_F(StoreTest, RoundTripKeepsTheSourceFormat) {
  scan::FileScan scan = full_scan();
  scan.format = scan::SourceFormat::Safetensors;
  Store store(dir_);
  const Store::NewEntry item{"/src/rank_0/net.safetensors", fp_, &scan};
  store.insert(std::span(&item, 1));
  const std::optional<scan::FileScan> got = store.lookup(fp_);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->format, scan::SourceFormat::Safetensors);
  expect_same(*got, scan);
}

TEST_F(StoreTest, AnyChangeOfTheFingerprintMisses) {
  const scan::FileScan scan = full_scan();
  Store store(dir_);
  const Store::NewEntry item{"/a.ckpt", fp_, &scan};
  store.insert(std::span(&item, 1));
  ASSERT_TRUE(store.lookup(fp_).has_value());
  for (auto change :
       {+[](source::Fingerprint& f) { f.dev += 1; }, +[](source::Fingerprint& f) { f.ino += 1; },
        +[](source::Fingerprint& f) { f.size -= 1; },
        +[](source::Fingerprint& f) { f.mtime_ns += 1; },
        +[](source::Fingerprint& f) { f.ctime_ns += 1; }}) {
    source::Fingerprint other = fp_;
    change(other);
    EXPECT_FALSE(store.lookup(other).has_value());
  }
}

TEST_F(StoreTest, ScanOfAnotherSizeThanTheFingerprintIsNotTrusted) {
  const scan::FileScan scan = small_scan(90, 3);
  Store store(dir_);
  const Store::NewEntry item{"/a.ckpt", fp_, &scan};  // fp_.size is not 90
  store.insert(std::span(&item, 1));
  EXPECT_FALSE(store.lookup(fp_).has_value());
}

TEST_F(StoreTest, ReopenFindsWhatWasStored) {
  const scan::FileScan scan = full_scan();
  {
    Store store(dir_);
    const Store::NewEntry item{"/a.ckpt", fp_, &scan};
    store.insert(std::span(&item, 1));
  }
  EXPECT_TRUE(fs::exists(dir_ / "data.mdb"));
  Store store(dir_);
  const std::optional<scan::FileScan> got = store.lookup(fp_);
  ASSERT_TRUE(got.has_value());
  expect_same(*got, scan);
  Store moved = std::move(store);
  EXPECT_TRUE(moved.lookup(fp_).has_value());
}

// index build with summaries: the scans' sync runs while they are read back and the summaries
// are written; everything is there after the store is closed and opened again.
TEST_F(StoreTest, SyncInBackgroundKeepsReadsAndLaterWritesGoing) {
  const scan::FileScan scan = full_scan();
  source::Fingerprint other = fp_;
  other.ino += 1;
  {
    Store store(dir_);
    store.defer_sync(true);
    const Store::NewEntry item{"/a.ckpt", fp_, &scan};
    store.insert(std::span(&item, 1));
    store.sync_in_background();
    EXPECT_TRUE(store.lookup(fp_).has_value());
    const Store::NewEntry later{"/b.ckpt", other, &scan};
    store.insert(std::span(&later, 1));
    store.wait_synced();
    store.wait_synced();  // waited for already: nothing more to wait for
  }
  Store store(dir_);
  ASSERT_TRUE(store.lookup(fp_).has_value());
  ASSERT_TRUE(store.lookup(other).has_value());
  expect_same(*store.lookup(other), scan);
}

TEST_F(StoreTest, OtherFormatVersionReadsAsAbsent) {
  const scan::FileScan scan = full_scan();
  { Store(dir_).insert(std::vector<Store::NewEntry>{{"/a.ckpt", fp_, &scan}}); }
  rewrite(fp_, [](indexpb::ScannedFile& file) {
    EXPECT_EQ(file.format_version(), kFormatVersion);
    EXPECT_EQ(file.path(), "/a.ckpt");
    file.set_format_version(kFormatVersion + 1);
  });
  Store store(dir_);
  EXPECT_FALSE(store.lookup(fp_).has_value());
  EXPECT_TRUE(store.entries().empty());
  // Still there until cleared or replaced.
  EXPECT_EQ(store.clear(), 1u);
}

TEST_F(StoreTest, UndecodableEntryReadsAsAbsent) {
  const scan::FileScan scan = full_scan();
  { Store(dir_).insert(std::vector<Store::NewEntry>{{"/a.ckpt", fp_, &scan}}); }
  tamper(fp_, [](std::string& bytes) { bytes = "\xff\xff\xff garbage"; });
  Store store(dir_);
  EXPECT_FALSE(store.lookup(fp_).has_value());
  EXPECT_TRUE(store.entries().empty());
}

// The index reads its entries with its own wire reader: what protobuf's generated serializer
// writes for the same message (its own field order, the optional view fields set, a field this
// version does not know) must decode to the same scan.
TEST_F(StoreTest, EntriesProtobufItselfWroteDecodeTheSame) {
  scan::FileScan scan = full_scan();
  scan::Param& strided = scan.params.emplace_back();
  strided.name = "strided";
  strided.dtype = "Float32";
  strided.shape = {2, 3};
  strided.element_size = 4;
  strided.view = true;
  strided.storage_offset = 5;
  strided.strides = {1, 2};
  strided.content = {{4096, 64}};
  strided.records = {{4000, 200}};
  { Store(dir_).insert(std::vector<Store::NewEntry>{{"/a.ckpt", fp_, &scan}}); }
  rewrite(fp_, [](indexpb::ScannedFile& file) {
    indexpb::ScannedParam& p = *file.mutable_params(0);
    p.GetReflection()->MutableUnknownFields(&p)->AddVarint(111, 7);
    file.GetReflection()->MutableUnknownFields(&file)->AddLengthDelimited(112, "later");
  });
  const std::optional<scan::FileScan> got = Store(dir_).lookup(fp_);
  ASSERT_TRUE(got.has_value());
  expect_same(*got, scan);
}

// One flipped bit anywhere in an entry (here: in a content offset) must not become a view of
// other bytes: the checksum refuses it, and the caller scans the file again.
TEST_F(StoreTest, DamagedEntryReadsAsAbsent) {
  const scan::FileScan scan = full_scan();
  { Store(dir_).insert(std::vector<Store::NewEntry>{{"/a.ckpt", fp_, &scan}}); }
  std::string good;
  tamper(fp_, [&](std::string& bytes) { good = bytes; });
  for (size_t at : {size_t{0}, good.size() / 2, good.size() - 5, good.size() - 1}) {
    tamper(fp_, [&](std::string& bytes) { bytes = good, bytes[at] ^= 0x01; });
    std::string why;
    EXPECT_FALSE(decode_entry(good.substr(0, at) + char(good[at] ^ 1) + good.substr(at + 1),
                              fp_.size, &why));
    EXPECT_FALSE(Store(dir_).lookup(fp_).has_value()) << "flipped byte " << at;
  }
  tamper(fp_, [&](std::string& bytes) { bytes = good; });
  EXPECT_TRUE(Store(dir_).lookup(fp_).has_value());
}

// Entries whose checksum holds but that no scan of the file could have produced.
TEST_F(StoreTest, EntryInconsistentWithItsFileReadsAsAbsent) {
  const scan::FileScan scan = full_scan();
  const std::vector<std::pair<std::string, std::function<void(indexpb::ScannedFile&)>>> cases = {
      {"content past the file",
       [](indexpb::ScannedFile& f) { f.mutable_params(0)->set_content(0, uint64_t{1} << 41); }},
      {"a 2^60-byte tensor",
       [](indexpb::ScannedFile& f) {
         f.mutable_params(0)->set_shape(0, int64_t{1} << 59);
         f.mutable_params(0)->set_shape(1, 1);
       }},
      {"a shape product past 64 bits",
       [](indexpb::ScannedFile& f) { f.mutable_params(0)->set_shape(0, int64_t{1} << 62); }},
      {"a negative dim", [](indexpb::ScannedFile& f) { f.mutable_params(0)->set_shape(0, -1); }},
      {"the wrong element size",
       [](indexpb::ScannedFile& f) { f.mutable_params(0)->set_element_size(4); }},
      {"a body past the file", [](indexpb::ScannedFile& f) { f.set_body_size(f.file_size() + 1); }},
      {"a record past the body",
       [](indexpb::ScannedFile& f) { f.mutable_params(3)->set_records(1, uint64_t{1} << 40); }},
  };
  for (const auto& [what, change] : cases) {
    SCOPED_TRACE(what);
    { Store(dir_).insert(std::vector<Store::NewEntry>{{"/a.ckpt", fp_, &scan}}); }
    ASSERT_TRUE(Store(dir_).lookup(fp_).has_value());
    rewrite(fp_, change);
    EXPECT_FALSE(Store(dir_).lookup(fp_).has_value());
  }
}

// The structure digest's regions (structure.h) come back as stored; regions that do not tile
// the file would leave bytes no region vouches for: such an entry reads as absent. An entry
// without regions (written before they were kept) is read, and its file is checked whole.
TEST_F(StoreTest, StructureRegionsComeBackAndMustTileTheFile) {
  const scan::FileScan scan = full_scan();
  StructureDigest digest;
  digest.bytes = 12;
  digest.crc = 0xDEADBEEF;
  digest.region = region_size(scan.file_size);  // 8 GiB: 129 regions
  digest.regions.assign(scan.file_size / digest.region + 1, 0);
  digest.regions.front() = 0xFFFFFFFF;
  digest.regions.back() = 7;
  const auto stored = [&]() -> std::optional<StructureDigest> {
    std::string why;
    StructureDigest got;
    if (!Store(dir_).lookup_path("/a.ckpt", fp_.size, fp_.mtime_ns, why, got)) return std::nullopt;
    return got;
  };
  const auto insert = [&] {
    Store(dir_).insert(std::vector<Store::NewEntry>{{"/a.ckpt", fp_, &scan, digest}});
  };
  insert();
  EXPECT_EQ(stored(), digest);
  rewrite(fp_, [](indexpb::ScannedFile& f) { f.add_structure_region_crcs(0); });
  EXPECT_FALSE(stored().has_value());
  insert();
  rewrite(fp_, [](indexpb::ScannedFile& f) { f.set_structure_region(0); });
  EXPECT_FALSE(stored().has_value());
  insert();
  rewrite(fp_, [](indexpb::ScannedFile& f) {
    f.clear_structure_region();
    f.clear_structure_region_crcs();
  });
  StructureDigest older = digest;
  older.region = 0;
  older.regions.clear();
  EXPECT_EQ(stored(), older);
}

// index build keeps at most 256 regions a file (structure.h), so that an entry, and the check a
// mount holds for each deferred source, stays small. A forged entry of 4 KiB regions for a
// 1 TiB file (2^28 CRCs) would have a mount hold a GiB for it; one of 1 MiB regions, 4 MiB.
// Anything past 256 reads as absent: the file is scanned again, or a shipped index refused.
TEST_F(StoreTest, AnEntryOfMoreRegionsThanIndexBuildKeepsReadsAsAbsent) {
  const scan::FileScan scan = full_scan();
  StructureDigest digest;
  digest.bytes = 12;
  digest.crc = 0xDEADBEEF;
  digest.region = uint64_t{1} << 20;
  digest.regions.assign(scan.file_size / digest.region + 1, 0);  // 1,048,577
  Store(dir_).insert(std::vector<Store::NewEntry>{{"/a.ckpt", fp_, &scan, digest}});
  std::string why;
  StructureDigest got;
  EXPECT_FALSE(Store(dir_).lookup_path("/a.ckpt", fp_.size, fp_.mtime_ns, why, got));
  EXPECT_FALSE(Store(dir_).lookup(fp_).has_value());
}

TEST_F(StoreTest, EntriesListPathFingerprintAndParamCount) {
  const scan::FileScan a = small_scan(60, 2);
  const scan::FileScan b = small_scan(150, 5);
  const source::Fingerprint fa{1, 10, 60, 5};
  const source::Fingerprint fb{1, 11, 150, 6};
  Store store(dir_);
  EXPECT_TRUE(store.entries().empty());
  // Inserted out of path order; entries() sorts.
  store.insert(
      std::vector<Store::NewEntry>{{"/src/rank_1/b.ckpt", fb, &b}, {"/src/rank_0/a.ckpt", fa, &a}});
  const std::vector<Entry> entries = store.entries();
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].path, "/src/rank_0/a.ckpt");
  EXPECT_EQ(entries[0].fingerprint, fa);
  EXPECT_EQ(entries[0].params, 2u);
  EXPECT_EQ(entries[1].path, "/src/rank_1/b.ckpt");
  EXPECT_EQ(entries[1].fingerprint, fb);
  EXPECT_EQ(entries[1].params, 5u);
}

TEST_F(StoreTest, NewVersionOfAPathReplacesTheOldEntry) {
  const scan::FileScan v1 = small_scan(60, 2);
  const scan::FileScan v2 = small_scan(90, 3);
  const source::Fingerprint f1{1, 10, 60, 5};
  const source::Fingerprint f2{1, 10, 90, 7};
  const source::Fingerprint other{1, 12, 60, 5};
  Store store(dir_);
  store.insert(std::vector<Store::NewEntry>{{"/a.ckpt", f1, &v1}, {"/b.ckpt", other, &v1}});
  store.insert(std::vector<Store::NewEntry>{{"/a.ckpt", f2, &v2}});
  EXPECT_FALSE(store.lookup(f1).has_value());
  ASSERT_TRUE(store.lookup(f2).has_value());
  EXPECT_EQ(store.lookup(f2)->params.size(), 3u);
  EXPECT_TRUE(store.lookup(other).has_value());
  EXPECT_EQ(store.entries().size(), 2u);
  // Storing the same version again keeps it.
  store.insert(std::vector<Store::NewEntry>{{"/a.ckpt", f2, &v2}});
  EXPECT_TRUE(store.lookup(f2).has_value());
}

TEST_F(StoreTest, ClearRemovesEverything) {
  const scan::FileScan a = small_scan(60, 2);
  const source::Fingerprint fa{1, 10, 60, 5};
  const source::Fingerprint fb{1, 11, 60, 5};
  Store store(dir_);
  EXPECT_EQ(store.clear(), 0u);
  store.insert(std::vector<Store::NewEntry>{{"/a.ckpt", fa, &a}, {"/b.ckpt", fb, &a}});
  EXPECT_EQ(store.clear(), 2u);
  EXPECT_FALSE(store.lookup(fa).has_value());
  EXPECT_TRUE(store.entries().empty());
  EXPECT_EQ(store.clear(), 0u);
  // Still usable afterwards, and across a reopen.
  store.insert(std::vector<Store::NewEntry>{{"/a.ckpt", fa, &a}});
  store = Store(root_ / "elsewhere");
  EXPECT_TRUE(Store(dir_).lookup(fa).has_value());
}

TEST_F(StoreTest, EmptyInsertIsANoOp) {
  Store store(dir_);
  store.insert({});
  EXPECT_TRUE(store.entries().empty());
}

TEST_F(StoreTest, FullMapGrows) {
  // 20000 parameters are about 600 KiB stored, far past a 64 KiB map.
  const scan::FileScan big = small_scan(600000, 20000);
  const source::Fingerprint fp{1, 10, 600000, 5};
  {
    Store store(dir_, 64 << 10);
    store.insert(std::vector<Store::NewEntry>{{"/big.ckpt", fp, &big}});
    const std::optional<scan::FileScan> got = store.lookup(fp);
    ASSERT_TRUE(got.has_value());
    expect_same(*got, big);
  }
  // A small map asked for again does not hide what is already there.
  Store store(dir_, 64 << 10);
  ASSERT_TRUE(store.lookup(fp).has_value());
  const scan::FileScan more = small_scan(60000, 2000);
  const source::Fingerprint fp2{1, 11, 60000, 5};
  store.insert(std::vector<Store::NewEntry>{{"/more.ckpt", fp2, &more}});
  EXPECT_EQ(store.lookup(fp2)->params.size(), 2000u);
  EXPECT_EQ(store.entries().size(), 2u);
}

TEST_F(StoreTest, CreatesTheDirectoryTreePrivately) {
  const fs::path deep = root_ / "a" / "b" / "c";
  Store store(deep);
  struct stat st;
  ASSERT_EQ(::stat(deep.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_EQ(store.dir(), deep);
}

TEST_F(StoreTest, OneStorePerDirectoryPerProcess) {
  Store store(dir_);
  try {
    Store second(dir_);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(dir_.string()));
    EXPECT_THAT(e.what(), HasSubstr("already open"));
  }
  // Through another spelling of the same directory too.
  EXPECT_THROW(Store(root_ / "." / "index"), Error);
  EXPECT_FALSE(store.lookup(fp_).has_value());  // the first one is unharmed
}

TEST_F(StoreTest, DirectoryBeneathAFileIsAnError) {
  std::ofstream(root_ / "file") << "x";
  try {
    Store store(root_ / "file" / "index");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr((root_ / "file").string()));
    EXPECT_THAT(e.what(), HasSubstr("Not a directory"));
  }
  try {
    Store store(root_ / "file");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr((root_ / "file").string() + ": "));
    EXPECT_THAT(e.what(), HasSubstr("not a directory"));
  }
}

// LMDB is not handed a data.mdb that is not a regular file (it would map /dev/zero, or block on
// nothing but fail obscurely): the file is named with what it is.
TEST_F(StoreTest, UnopenableEnvironmentNamesTheFileAndWhatItIs) {
  fs::create_directories(dir_ / "data.mdb");
  try {
    Store store(dir_);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr((dir_ / "data.mdb").string() +
                                    ": the index file is a directory, not a regular file"));
    EXPECT_THAT(e.what(), HasSubstr("ckptfs index clear --index-dir " + dir_.string()));
  }
  // The failed open released the directory.
  fs::remove(dir_ / "data.mdb");
  Store store(dir_);
}

// LMDB keeps no checksums: damaged page headers make it abort, fault or read past its map. The
// store finds each kind of damage in a child process and refuses in one line naming the index
// and `index clear`; this process survives, and the damaged files can be removed.
class DamagedStoreTest : public StoreTest, public ::testing::WithParamInterface<std::string> {
 protected:
  static constexpr size_t kPage = 4096;

  // Enough entries for branch pages above the leaves.
  void fill() {
    Store store(dir_);
    std::vector<scan::FileScan> scans;
    for (int i = 0; i < 400; ++i) scans.push_back(small_scan(300, 3));
    std::vector<Store::NewEntry> items;
    for (int i = 0; i < 400; ++i) {
      source::Fingerprint fp = fp_;
      fp.ino = static_cast<uint64_t>(i);
      fp.size = 300;
      items.push_back({fmt::format("/src/rank_{}/net.ckpt", i), fp, &scans[i]});
    }
    store.insert(items);
  }
  // The first page past the meta pages whose mp_flags (at byte 10 of its header) are `flags`.
  size_t page_with(const std::string& data, uint16_t flags) {
    for (size_t p = 2; p < data.size() / kPage; ++p)
      if ((static_cast<uint8_t>(data[p * kPage + 10]) | data[p * kPage + 11] << 8) == flags)
        return p;
    ADD_FAILURE() << "no page with flags " << flags;
    return 2;
  }
  static void put16(std::string& data, size_t at, uint16_t v) {
    data[at] = static_cast<char>(v & 0xff);
    data[at + 1] = static_cast<char>(v >> 8);
  }
  void damage(const std::string& how) {
    const fs::path path = dir_ / "data.mdb";
    std::string data = testsupport::read_file(path);
    if (how == "truncated") {
      fs::resize_file(path, data.size() / 2);
      return;
    }
    if (how == "page 5 mp_lower") put16(data, 5 * kPage + 12, 4000);
    // Every leaf page: the first one may be an old copy on the free list, which LMDB never reads.
    for (size_t p = 2; p < data.size() / kPage; ++p) {
      if (data[p * kPage + 10] != 2 || data[p * kPage + 11] != 0) continue;
      if (how == "leaf mp_lower") put16(data, p * kPage + 12, 4000);
      if (how == "leaf node offset") put16(data, p * kPage + 16, 0xfff0);
    }
    if (how == "branch mp_lower") put16(data, page_with(data, 1) * kPage + 12, 4000);
    if (how == "branch flags") put16(data, page_with(data, 1) * kPage + 10, 0x7f);
    if (how == "meta roots")  // md_root of the main database in both meta pages
      for (size_t meta : {0, 1})
        for (int i = 0; i < 8; ++i) data[meta * kPage + 16 + 24 + 48 + 40 + i] = '\x7f';
    testsupport::write_file(path, data);
  }
};

TEST_P(DamagedStoreTest, IsFoundWithoutCrashingAndCleared) {
  fill();
  damage(GetParam());
  for (bool shipped : {false, true}) {
    try {
      if (shipped)
        Store::open_shipped(dir_);
      else
        Store store(dir_);
      FAIL() << "the damage went unnoticed";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(dir_.string()));
      EXPECT_THAT(e.what(), HasSubstr("damaged"));
      EXPECT_THAT(e.what(), HasSubstr(shipped ? "rebuild it" : "ckptfs index clear"));
    }
  }
  EXPECT_TRUE(remove_environment(dir_));
  Store fresh(dir_);
  EXPECT_TRUE(fresh.entries().empty());
}

INSTANTIATE_TEST_SUITE_P(Pages, DamagedStoreTest,
                         ::testing::Values("page 5 mp_lower", "leaf mp_lower", "leaf node offset",
                                           "branch mp_lower", "branch flags", "meta roots",
                                           "truncated"),
                         [](const auto& case_info) {
                           std::string name = case_info.param;
                           for (char& c : name)
                             if (c == ' ') c = '_';
                           return name;
                         });

TEST_F(StoreTest, AnIntactStoreIsProbedOncePerVersion) {
  {
    Store store(dir_);
    const scan::FileScan scan = full_scan();
    const Store::NewEntry item{"/src/rank_0/net.ckpt", fp_, &scan};
    store.insert(std::span(&item, 1));
  }
  EXPECT_EQ(lmdb::probe(dir_, kDefaultMapSize, 3, MDB_NOTLS), "");
  EXPECT_EQ(lmdb::probe(dir_, kDefaultMapSize, 3, MDB_NOLOCK), "");
  Store store(dir_);
  EXPECT_TRUE(store.lookup(fp_).has_value());
}

// The probe's child once was a bare fork of a process whose other threads allocate: under a
// sanitizer (whose allocator a fork does not reset) it could inherit a held allocator lock and
// wait for it for ever (the mount's progress thread did this in CI). Threads that start, stop
// and allocate all the while must not stall a probe.
TEST_F(StoreTest, ProbesWhileOtherThreadsStartAndAllocate) {
  {
    Store store(dir_);
    const scan::FileScan scan = full_scan();
    const Store::NewEntry item{"/src/rank_0/net.ckpt", fp_, &scan};
    store.insert(std::span(&item, 1));
  }
  std::atomic<bool> stop{false};
  auto churn = [&] {
    while (!stop.load()) {
      std::thread([] {
        std::vector<std::string> held;
        for (size_t i = 0; i < 256; ++i) held.emplace_back(16 + i * 97 % 4000, 'x');
      }).join();
    }
  };
  std::thread a(churn), b(churn);
  const auto start = std::chrono::steady_clock::now();
  std::string why;
  for (int i = 0; i < 100 && why.empty(); ++i)
    why = lmdb::probe(dir_, kDefaultMapSize, 3, MDB_NOLOCK);
  stop = true;
  a.join();
  b.join();
  EXPECT_EQ(why, "");
  // A stalled child is given up after 60 s as "reading it did not finish"; 100 sound probes
  // take well under a second each.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(50));
}

TEST_F(StoreTest, UnwritableDirectoryIsAnError) {
  const fs::path ro = root_ / "ro";
  fs::create_directories(ro);
  fs::permissions(root_, fs::perms::owner_all | fs::perms::others_exec | fs::perms::group_exec);
  fs::permissions(ro, fs::perms::owner_all | fs::perms::others_exec | fs::perms::group_exec |
                          fs::perms::others_read | fs::perms::group_read);
  const std::optional<std::string> out = unprivileged([&]() -> std::string {
    std::string result;
    for (const fs::path& dir : {ro, ro / "index"}) {
      try {
        Store store(dir);
        result += "opened;";
      } catch (const Error& e) {
        result += std::string(e.what()) + ";";
      }
    }
    return result;
  });
  if (!out) GTEST_SKIP() << "cannot drop root privileges here";
  EXPECT_THAT(*out,
              HasSubstr(ro.string() + ": cannot open the LMDB environment: Permission denied;"));
  EXPECT_THAT(*out, HasSubstr((ro / "index").string() +
                              ": cannot create index directory: Permission denied;"));
}

class DefaultDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"XDG_CACHE_HOME", "HOME"}) {
      const char* value = std::getenv(name);
      saved_.emplace_back(name, value ? std::optional<std::string>(value) : std::nullopt);
    }
  }
  void TearDown() override {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name, value->c_str(), 1);
      } else {
        ::unsetenv(name);
      }
    }
  }
  std::vector<std::pair<const char*, std::optional<std::string>>> saved_;
};

TEST_F(DefaultDirTest, PrefersXdgCacheHome) {
  ::setenv("XDG_CACHE_HOME", "/var/cache/me", 1);
  ::setenv("HOME", "/home/me", 1);
  EXPECT_EQ(default_dir(), fs::path("/var/cache/me/ckptfs/index"));
}

TEST_F(DefaultDirTest, FallsBackToHomeWhenXdgIsUnsetEmptyOrRelative) {
  ::setenv("HOME", "/home/me", 1);
  for (const char* xdg : {static_cast<const char*>(nullptr), "", "relative/cache"}) {
    if (xdg) {
      ::setenv("XDG_CACHE_HOME", xdg, 1);
    } else {
      ::unsetenv("XDG_CACHE_HOME");
    }
    EXPECT_EQ(default_dir(), fs::path("/home/me/.cache/ckptfs/index")) << (xdg ? xdg : "unset");
  }
}

TEST_F(DefaultDirTest, NeitherVariableIsAnError) {
  ::unsetenv("XDG_CACHE_HOME");
  ::unsetenv("HOME");
  EXPECT_THROW(default_dir(), Error);
}

}  // namespace
}  // namespace ckptfs::index
