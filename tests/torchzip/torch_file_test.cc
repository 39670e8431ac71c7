// The torch.save reader on the real fixtures (tests/data/hfai, written by torch 1.13 and 2.6),
// checked against expected/files.json and the expected trees, which the fixture tools derived
// with Python's zipfile and a stub unpickler, not with this code; and on damaged copies and
// hand-built archives.
#include "ckptfs/torchzip/torch_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "ckptfs/error.h"
#include "ckptfs/torchzip/pickle.h"
#include "ckptfs/torchzip/zip.h"
#include "ckptfs/util/fd.h"
#include "support/test_support.h"
#include "torchzip/torch_test_util.h"

namespace ckptfs::torchzip {
namespace {

using nlohmann::json;
using testsupport::read_file;
using testsupport::TempDir;
using testsupport::write_file;
namespace tt = torchtest;
using namespace std::string_literals;

const std::filesystem::path kData = std::filesystem::path(CKPTFS_SOURCE_DIR) / "tests/data/hfai";

json load_json(const std::filesystem::path& p) { return json::parse(read_file(p)); }

ZipArchive zip_of(const std::filesystem::path& p) {
  UniqueFd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  return read_zip(fd.get(), p.string());
}

// The message of the Error `body` throws ("" if it does not throw).
template <typename F>
std::string error_of(F body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TorchFixtures, RecordsAndTensorsMatchFilesJson) {
  const json files = load_json(kData / "expected/files.json");
  ASSERT_GE(files.size(), 25u);
  for (const auto& [rel, expected] : files.items()) {
    SCOPED_TRACE(rel);
    const ZipArchive zip = zip_of(kData / rel);
    EXPECT_EQ(zip.file_size, expected["bytes"].get<uint64_t>());
    EXPECT_EQ(zip.folder, expected["archive"].get<std::string>());
    ASSERT_EQ(zip.records.size(), expected["records"].size());
    for (size_t i = 0; i < zip.records.size(); ++i) {
      const json& r = expected["records"][i];
      EXPECT_EQ(zip.folder + "/" + zip.records[i].name, r["name"].get<std::string>());
      EXPECT_EQ(zip.records[i].header_offset, r["header_offset"].get<uint64_t>());
      EXPECT_EQ(zip.records[i].data_offset, r["data_offset"].get<uint64_t>());
      EXPECT_EQ(zip.records[i].size, r["size"].get<uint64_t>());
      EXPECT_EQ(zip.records[i].crc32, r["crc32"].get<uint32_t>());
    }
    const scan::FileScan scan = scan_torch((kData / rel).string());
    EXPECT_EQ(scan.format, scan::SourceFormat::TorchZip);
    const json& tensors = expected["tensors"];
    ASSERT_EQ(scan.params.size(), tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      const json& t = tensors[i];
      const scan::Param& p = scan.params[i];
      SCOPED_TRACE(p.name);
      EXPECT_EQ(p.name, t["name"].get<std::string>());
      EXPECT_EQ(p.dtype, t["dtype"].get<std::string>());
      EXPECT_EQ(p.shape, t["shape"].get<std::vector<int64_t>>());
      EXPECT_EQ(p.strides, t["stride"].get<std::vector<int64_t>>());
      EXPECT_EQ(p.storage_offset, t["storage_offset"].get<uint64_t>());
      EXPECT_TRUE(p.view);
      ASSERT_EQ(p.content.size(), 1u);
      EXPECT_EQ(p.content[0].offset + p.storage_offset * p.element_size,
                t["data_file_offset"].get<uint64_t>());
      const uint64_t numel = t["storage_numel"].get<uint64_t>();
      EXPECT_EQ(p.content[0].length,
                t["storage_type"] == "UntypedStorage" ? numel : numel * p.element_size);
      const auto& rec = *zip.find("data/" + t["storage_key"].get<std::string>());
      EXPECT_EQ(p.content[0].offset, rec.data_offset);
    }
  }
}

// Walks an expected tree and ours side by side; tensors compare by dtype, shape and size
// (their bytes are compared through the mount, by the integration test).
void expect_same_tree(const json& expected, const json& ours, const scan::FileScan& scan,
                      const std::string& at) {
  SCOPED_TRACE(at);
  if (expected.is_object() && expected.contains("$tensor")) {
    ASSERT_TRUE(ours.is_object() && ours.contains("$tensor")) << ours.dump();
    const scan::Param& p = scan.params.at(ours["$tensor"].get<size_t>());
    const json& t = expected["$tensor"];
    EXPECT_EQ(p.dtype, t["dtype"].get<std::string>());
    EXPECT_EQ(p.shape, t["shape"].get<std::vector<int64_t>>());
    EXPECT_EQ(p.nbytes(), t["nbytes"].get<uint64_t>());
    return;
  }
  ASSERT_EQ(expected.type(), ours.type()) << expected.dump() << " vs " << ours.dump();
  if (expected.is_array()) {
    ASSERT_EQ(expected.size(), ours.size());
    for (size_t i = 0; i < expected.size(); ++i)
      expect_same_tree(expected[i], ours[i], scan, at + "/" + std::to_string(i));
  } else if (expected.is_object()) {
    ASSERT_EQ(expected.size(), ours.size()) << ours.dump();
    for (const auto& [k, v] : expected.items()) {
      ASSERT_TRUE(ours.contains(k)) << k;
      expect_same_tree(v, ours[k], scan, at + "/" + k);
    }
  } else {
    EXPECT_EQ(expected, ours);
  }
}

TEST(TorchFixtures, PlainFilesUnpickleToTheExpectedTrees) {
  size_t checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kData / "expected")) {
    const std::string name = entry.path().filename().string();
    if (name.size() < 10 || name.substr(name.size() - 10) != ".tree.json" ||
        name.rfind("hfai", 0) == 0)
      continue;
    const json expected = load_json(entry.path());
    SCOPED_TRACE(name);
    const scan::FileScan scan =
        scan_torch((kData / expected["source"].get<std::string>()).string());
    expect_same_tree(expected["loaded"], json::parse(scan.tree), scan, "");
    ++checked;
  }
  EXPECT_GE(checked, 12u);
}

TEST(TorchFixtures, LegacyFormatIsRefusedClearly) {
  const std::string path = (kData / "plain/legacy_format_t113.pt").string();
  EXPECT_NE(error_of([&] { scan_torch(path); }).find("legacy torch.save format"),
            std::string::npos);
}

TEST(TorchFixtures, EveryTruncationIsRefusedNamingTheFile) {
  TempDir dir;
  const std::string whole = read_file(kData / "plain/tiny_t26.pt");
  const auto cut = dir.path() / "cut.pt";
  for (size_t n = 0; n < whole.size(); ++n) {
    write_file(cut, std::string_view(whole).substr(0, n));
    const std::string message = error_of([&] { scan_torch(cut.string()); });
    ASSERT_NE(message.find(cut.string()), std::string::npos) << "prefix of " << n << " bytes";
  }
}

TEST(TorchFixtures, CrcsAreNotChecked) {
  // torch.load does not check them (spec §2.4): neither a wrong CRC field nor changed data
  // bytes make the file unreadable.
  TempDir dir;
  std::string bytes = read_file(kData / "plain/tiny_t113.pt");
  const scan::FileScan before = scan_torch((kData / "plain/tiny_t113.pt").string());
  bytes[0x212 + 16] ^= 0x55;  // CRC-32 of data.pkl in the central directory
  bytes[384] ^= 0x01;         // a byte of data/0
  write_file(dir.path() / "crc.pt", bytes);
  const scan::FileScan after = scan_torch((dir.path() / "crc.pt").string());
  ASSERT_EQ(after.params.size(), before.params.size());
  EXPECT_EQ(after.params[1].content, before.params[1].content);
  EXPECT_EQ(after.tree, before.tree);
}

TEST(TorchFixtures, HugeSizeInTheDirectoryIsRefused) {
  TempDir dir;
  std::string bytes = read_file(kData / "plain/tiny_t113.pt");
  // Entry 2 of the central directory (data/0) starts at 0x212 + 46 + 18 = 0x252.
  ASSERT_EQ(bytes.substr(0x252, 4), std::string("PK\x01\x02"));
  bytes.replace(0x252 + 20, 8, tt::u32(0xFFFFFF00) + tt::u32(0xFFFFFF00));
  write_file(dir.path() / "huge.pt", bytes);
  const std::string message = error_of([&] { scan_torch((dir.path() / "huge.pt").string()); });
  EXPECT_NE(message.find("record \"tiny_t113/data/0\""), std::string::npos) << message;
  EXPECT_NE(message.find("run past"), std::string::npos) << message;
}

TEST(TorchFixtures, WrongStorageSizeIsRefused) {
  // tiny_t113's pid says 6 elements (K 06): make it 7.
  TempDir dir;
  std::string bytes = read_file(kData / "plain/tiny_t113.pt");
  const size_t at = bytes.find(std::string("cpu") + "q\x07" + "K\x06");
  ASSERT_NE(at, std::string::npos);
  bytes[at + 6] = 7;
  write_file(dir.path() / "size.pt", bytes);
  const std::string message = error_of([&] { scan_torch((dir.path() / "size.pt").string()); });
  EXPECT_NE(message.find("needs 28 bytes but record \"data/0\" holds 24"), std::string::npos)
      << message;
}

TEST(TorchBuilt, DisallowedGlobalsAreRefusedByName) {
  TempDir dir;
  const auto path = dir.path() / "evil.pt";
  for (const auto& [module, name] : std::vector<std::pair<std::string, std::string>>{
           {"os", "system"},
           {"builtins", "eval"},
           {"torch._utils", "_rebuild_qtensor"},
           {"torch.storage", "_load_from_bytes"},
           {"numpy.core.multiarray", "_reconstruct"}}) {
    tt::write_torch(path, "\x80\x02" + tt::global(module, name) + "(" + tt::str("id") + "tR.");
    const std::string message = error_of([&] { scan_torch(path.string()); });
    EXPECT_NE(message.find(path.string()), std::string::npos) << message;
    EXPECT_NE(message.find("unsupported object \"" + module + "." + name + "\""), std::string::npos)
        << message;
  }
  // Opcodes that would run or build arbitrary objects.
  for (const std::string& pickle :
       {std::string("\x80\x02") + "(ios\nsystem\n" + tt::str("x") + ".",  // INST
        std::string("\x80\x02") + "}\x81.",                               // NEWOBJ
        std::string("\x80\x02") + "S'x'\n."}) {                           // STRING
    tt::write_torch(path, pickle);
    EXPECT_NE(error_of([&] { scan_torch(path.string()); }).find("is not accepted"),
              std::string::npos);
  }
}

TEST(TorchBuilt, TensorOutsideItsStorageIsRefused) {
  TempDir dir;
  const auto path = dir.path() / "t.pt";
  const std::string storage(24, '\0');  // 6 floats
  tt::write_torch(path, tt::dict_pickle({{"w", tt::tensor("0", 6, 1, {2, 3}, {3, 1})}}),
                  {{"0", storage}});
  EXPECT_NE(error_of([&] { scan_torch(path.string()); }).find("reaches past the 24 bytes"),
            std::string::npos);
  tt::write_torch(
      path, tt::dict_pickle({{"w", tt::tensor("0", 6, 0, {1 << 30, 1 << 30, 1 << 30}, {0, 0, 0})}}),
      {{"0", storage}});
  EXPECT_NE(error_of([&] { scan_torch(path.string()); }).find("too many elements"),
            std::string::npos);
  tt::write_torch(path, tt::dict_pickle({{"w", tt::tensor("0", int64_t{1} << 60, 0, {2}, {1})}}),
                  {{"0", storage}});
  EXPECT_NE(error_of([&] { scan_torch(path.string()); }).find("needs"), std::string::npos);
  tt::write_torch(path, tt::dict_pickle({{"w", tt::tensor("9", 6, 0, {2}, {1})}}),
                  {{"0", storage}});
  EXPECT_NE(error_of([&] { scan_torch(path.string()); }).find("no record \"data/9\""),
            std::string::npos);
  // A transposed view that fits exactly is accepted.
  tt::write_torch(path, tt::dict_pickle({{"w", tt::tensor("0", 6, 0, {3, 2}, {1, 3})}}),
                  {{"0", storage}});
  const scan::FileScan ok = scan_torch(path.string());
  ASSERT_EQ(ok.params.size(), 1u);
  EXPECT_EQ(ok.params[0].strides, (std::vector<int64_t>{1, 3}));
}

TEST(TorchBuilt, Zip64OffsetsPastFourGiB) {
  // A sparse file: the storage record's local header lies past 4 GiB, so the central directory
  // gives its offset in a zip64 extra field.
  TempDir dir;
  const auto path = dir.path() / "big.pt";
  const std::string storage = tt::u32(0x3F800000) + tt::u32(0x40000000);  // 1.0f, 2.0f
  tt::write_zip(path, {{"big/data.pkl", tt::dict_pickle({{"w", tt::tensor("0", 2, 0, {2}, {1})}})},
                       {"big/data/0", storage, uint64_t{5} << 30},
                       {"big/version", "3\n"}});
  const scan::FileScan scan = scan_torch(path.string());
  ASSERT_EQ(scan.params.size(), 1u);
  const uint64_t data = scan.params[0].content[0].offset;
  EXPECT_GT(data, uint64_t{5} << 30);
  UniqueFd fd(::open(path.c_str(), O_RDONLY));
  std::string got(8, '\0');
  ASSERT_EQ(::pread(fd.get(), got.data(), 8, static_cast<off_t>(data)), 8);
  EXPECT_EQ(got, storage);
}

TEST(TorchBuilt, OtherContainersAreNamed) {
  TempDir dir;
  const auto path = dir.path() / "x.pt";
  write_file(path, std::string(300, 'a'));
  EXPECT_NE(error_of([&] { scan_torch(path.string()); }).find("not a torch.save zip"),
            std::string::npos);
  write_file(path, std::string(257, '\0') + "ustar" + std::string(300, '\0'));
  EXPECT_NE(error_of([&] { scan_torch(path.string()); }).find("tar archive"), std::string::npos);
  tt::write_zip(path,
                {{"m/data.pkl", "\x80\x02N."}, {"m/constants.pkl", "x"}, {"m/version", "3\n"}});
  EXPECT_NE(error_of([&] { scan_torch(path.string()); }).find("TorchScript"), std::string::npos);
  tt::write_zip(path, {{"m/data.pkl", "\x80\x02N."}, {"m/byteorder", "big"}, {"m/version", "3\n"}});
  EXPECT_NE(error_of([&] { scan_torch(path.string()); }).find("big-endian"), std::string::npos);
  tt::write_zip(path, {{"m/data.pkl", "\x80\x02N."}, {"other/version", "3\n"}});
  EXPECT_NE(error_of([&] { scan_torch(path.string()); }).find("not under the archive's folder"),
            std::string::npos);
}

TEST(Pickle, ScalarsAndContainers) {
  const auto none = [](std::string_view) { return std::optional<uint64_t>(); };
  // {"a": [-5, 2**40, 1.5, True, None], (0, "x"): ("α",)}
  // Appended piece by piece: GCC 12 sees a chain of operator+ as possibly overlapping copies
  // (-Wrestrict).
  std::string p = "\x80\x02}(";
  for (const std::string& piece :
       {tt::str("a"), std::string("](J"), tt::u32(0xFFFFFFFB), std::string("\x8A\x06"),
        std::string("\x00\x00\x00\x00\x00\x01", 6), std::string("G"),
        std::string("\x3F\xF8\x00\x00\x00\x00\x00\x00", 8), std::string("\x88Ne"), tt::int1(0),
        tt::str("x"), std::string("\x86"), tt::str("\xCE\xB1"), std::string("\x85u.")})
    p += piece;
  const Unpickled u = unpickle(p, "t", none);
  EXPECT_EQ(u.tree.dump(),
            R"({"$dict":[["a",[-5,1099511627776,{"$float":"0x1.8000000000000p+0"},true,null]],)"
            R"([{"$tuple":[0,"x"]},{"$tuple":["α"]}]]})");
  EXPECT_EQ(python_float_hex(0.001), "0x1.0624dd2f1a9fcp-10");
  EXPECT_EQ(python_float_hex(-0.0), "-0x0.0p+0");
  EXPECT_EQ(python_float_hex(5e-324), "0x0.0000000000001p-1022");
}

TEST(Pickle, BoundsAreEnforced) {
  const auto none = [](std::string_view) { return std::optional<uint64_t>(); };
  // A list appended into itself is a cycle: refused by the depth cap, not a hang.
  EXPECT_NE(error_of([&] {
              unpickle(
                  "\x80\x02]q\x00h\x00"
                  "a."s,
                  "t", none);
            }).find("deeper"),
            std::string::npos);
  // Doubling sharing (a DAG of 2^40 paths) is refused by the work cap, or first by the memory
  // budget its expanded tree would exceed.
  std::string dag = "\x80\x02N"s;
  for (int i = 0; i < 40; ++i) dag += "q\x00h\x00\x86"s;
  const std::string expanded = error_of([&] { unpickle(dag + ".", "t", none); });
  EXPECT_TRUE(expanded.find("parts") != std::string::npos ||
              expanded.find("memory") != std::string::npos)
      << expanded;
  EXPECT_NE(error_of([&] { unpickle("\x80\x02X\xFF\xFF\xFF\x7F"s, "t", none); }).find("runs past"),
            std::string::npos);
  EXPECT_NE(error_of([&] { unpickle("\x80\x02h\x05."s, "t", none); }).find("never stored"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { unpickle("\x80\x02X\x02\x00\x00\x00\xC3\x28."s, "t", none); }).find("UTF-8"),
      std::string::npos);
  EXPECT_NE(error_of([&] { unpickle("\x80\x02NN."s, "t", none); }).find("STOP"), std::string::npos);
}

}  // namespace
}  // namespace ckptfs::torchzip
