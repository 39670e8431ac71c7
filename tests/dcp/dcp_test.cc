// The DCP reader on checkpoints real torch 2.6 wrote (tests/data/dcp/README.md): every tensor,
// read back through the extents the reader returns, equals the full tensor the generator started
// from (a safetensors file written by the safetensors package, parsed here by hand); and each
// damaged copy is refused with its one line.
#include "ckptfs/dcp/dcp.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "ckptfs/error.h"

namespace ckptfs::dcp {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kData = fs::path(CKPTFS_TEST_DATA) / "dcp";

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct Reference {
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

// A safetensors file: 8-byte little-endian header length, JSON header, data.
std::map<std::string, Reference> read_reference(const fs::path& path) {
  const std::string file = slurp(path);
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  const json header = json::parse(file.substr(8, n));
  std::map<std::string, Reference> out;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") continue;
    const auto begin = v["data_offsets"][0].get<size_t>(), end = v["data_offsets"][1].get<size_t>();
    out[name] = {v["dtype"], v["shape"].get<std::vector<int64_t>>(),
                 file.substr(8 + n + begin, end - begin)};
  }
  return out;
}

// The tensor `t` assembled in C order from its chunks, each read element by element through
// the view the reader located (content extent, strides, storage offset).
std::string assemble(const fs::path& dir, const Checkpoint& ckpt, const Tensor& t) {
  uint64_t total = 1;
  for (int64_t d : t.shape) total *= static_cast<uint64_t>(d);
  std::string out(total * t.element_size, '\xAA');
  for (const Chunk& c : t.chunks) {
    const scan::FileScan& scan = ckpt.scans.at(c.storage.file);
    const json tree = json::parse(scan.tree);
    const scan::Param* param = nullptr;
    for (size_t i = 0; i < scan.params.size(); ++i)
      if (scan.params[i].name == t.fqn && tree["chunks"][i]["offsets"] == c.offsets)
        param = &scan.params[i];
    if (!param) {
      ADD_FAILURE() << t.fqn << ": no param for a chunk";
      return out;
    }
    const std::string file = slurp(dir / ckpt.metadata.files[c.storage.file]);
    const scan::Extent& e = param->content[0];
    EXPECT_GE(e.offset, c.storage.offset);
    EXPECT_LE(e.offset + e.length, c.storage.offset + c.storage.length);
    const std::string storage = file.substr(e.offset, e.length);
    const size_t rank = t.shape.size();
    std::vector<int64_t> index(rank, 0);
    for (uint64_t k = 0; k < c.elements(); ++k) {
      uint64_t src = param->storage_offset, dst = 0;
      for (size_t d = 0; d < rank; ++d) {
        src += static_cast<uint64_t>(index[d] * param->strides[d]);
        dst = dst * static_cast<uint64_t>(t.shape[d]) +
              static_cast<uint64_t>(c.offsets[d] + index[d]);
      }
      out.replace(dst * t.element_size, t.element_size,
                  storage.substr(src * t.element_size, t.element_size));
      for (size_t d = rank; d-- > 0;) {
        if (++index[d] < c.sizes[d]) break;
        index[d] = 0;
      }
    }
  }
  return out;
}

class RealFiles : public ::testing::TestWithParam<std::string> {};

TEST_P(RealFiles, EveryTensorEqualsTheReference) {
  const fs::path dir = kData / GetParam();
  const Checkpoint ckpt = read_checkpoint(dir);
  const auto reference = read_reference(kData / (GetParam() + ".reference.safetensors"));
  ASSERT_EQ(ckpt.metadata.tensors.size(), reference.size());
  ASSERT_EQ(ckpt.scans.size(), ckpt.metadata.files.size());
  for (const Tensor& t : ckpt.metadata.tensors) {
    SCOPED_TRACE(t.fqn);
    const auto it = reference.find(t.fqn);
    ASSERT_NE(it, reference.end());
    EXPECT_EQ(t.code, it->second.dtype);
    EXPECT_EQ(t.shape, it->second.shape);
    EXPECT_TRUE(assemble(dir, ckpt, t) == it->second.bytes);
  }
  // Every param of every scan is one chunk of the metadata: nothing located twice or left out.
  size_t chunks = 0, params = 0;
  for (const Tensor& t : ckpt.metadata.tensors) chunks += t.chunks.size();
  for (const scan::FileScan& s : ckpt.scans) {
    params += s.params.size();
    EXPECT_EQ(s.format, scan::SourceFormat::Dcp);
    EXPECT_EQ(scan::check_scan(s, s.file_size), "");
  }
  EXPECT_EQ(params, chunks);
}

INSTANTIATE_TEST_SUITE_P(Dcp, RealFiles,
                         ::testing::Values("plain", "fsdp", "tp", "objects", "threads", "tp_py3112"));

TEST(DcpRealFiles, ShardsAsTorchLaidThemOut) {
  const Checkpoint ckpt = read_checkpoint(kData / "fsdp");
  std::map<std::string, std::vector<std::vector<int64_t>>> offsets;
  for (const Tensor& t : ckpt.metadata.tensors)
    for (const Chunk& c : t.chunks) offsets[t.fqn].push_back(c.offsets);
  // 5 rows over 4 ranks: 2, 2, 1, 0 rows; the empty shard sits at offset == dim.
  EXPECT_EQ(offsets["odd"], (std::vector<std::vector<int64_t>>{{0, 0}, {2, 0}, {4, 0}, {5, 0}}));
  EXPECT_EQ(offsets["few"], (std::vector<std::vector<int64_t>>{{0, 0}, {1, 0}, {2, 0}, {3, 0}}));
  EXPECT_EQ(ckpt.metadata.files, (std::vector<std::string>{"__0_0.distcp", "__1_0.distcp",
                                                           "__2_0.distcp", "__3_0.distcp"}));
  // Replicated tensors are saved once (tp: norm and plain have one chunk each).
  const Checkpoint tp = read_checkpoint(kData / "tp");
  for (const Tensor& t : tp.metadata.tensors)
    if (t.fqn == "norm" || t.fqn == "plain") {
      EXPECT_EQ(t.chunks.size(), 1u) << t.fqn;
    }
}

TEST(DcpRealFiles, ObjectsAreListedNotRead) {
  const Checkpoint ckpt = read_checkpoint(kData / "objects");
  std::set<std::string> names;
  for (const Object& o : ckpt.metadata.objects) names.insert(o.fqn);
  const json expected = json::parse(slurp(kData / "objects.objects.json"));
  EXPECT_EQ(names, expected.get<std::set<std::string>>());
  std::set<std::string> listed;
  for (const scan::FileScan& s : ckpt.scans) {
    const json tree = json::parse(s.tree);
    for (const json& o : tree["objects"]) listed.insert(o["fqn"]);
  }
  EXPECT_EQ(listed, names);
}

// The registry-shaped entry points: a data file scanned alone (its .metadata found beside it)
// gives the same scan as the whole-directory reader; detection.
TEST(DcpRealFiles, DataFileScannedAloneAsInTheDirectory) {
  const fs::path dir = kData / "tp";
  const Checkpoint ckpt = read_checkpoint(dir);
  for (size_t i = 0; i < ckpt.metadata.files.size(); ++i) {
    const fs::path path = dir / ckpt.metadata.files[i];
    const std::string head = slurp(path).substr(0, 4);
    EXPECT_TRUE(claims_data_file(path.string(), head));
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    const scan::FileScan alone = scan_data_file_beside(fd, path.string());
    ::close(fd);
    EXPECT_EQ(alone.tree, ckpt.scans[i].tree);
    ASSERT_EQ(alone.params.size(), ckpt.scans[i].params.size());
    for (size_t k = 0; k < alone.params.size(); ++k)
      EXPECT_EQ(alone.params[k].content[0], ckpt.scans[i].params[k].content[0]);
  }
  EXPECT_FALSE(claims_data_file((dir / ".metadata").string(), "\x80\x04"));
  EXPECT_EQ(detect(dir, ""), dir);
  EXPECT_EQ(detect(kData, ""), std::nullopt);
  std::vector<fs::path> files;
  for (const std::string& f : ckpt.metadata.files) files.push_back(dir / f);
  EXPECT_EQ(index_files(dir), files);
}

TEST(DcpRefusals, RankLocalMetadataOnly) {
  const fs::path dir = fs::path(::testing::TempDir()) / "dcp_rank_local";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(kData / "plain" / ".metadata", dir / "__0.metadata");
  try {
    detect(dir, "");
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              dir.string() +
                  ": a rank-local DCP checkpoint (__<rank>.metadata files, saved without "
                  "collectives): ckptfs reads only checkpoints with one global .metadata");
  }
}

// The .metadata kept between data files of one directory is read again once it changes.
TEST(DcpRealFiles, ChangedMetadataIsReadAgain) {
  const fs::path dir = fs::path(::testing::TempDir()) / "dcp_changed";
  fs::remove_all(dir);
  fs::copy(kData / "fsdp", dir);
  const std::string file = (dir / "__0_0.distcp").string();
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(scan_data_file_beside(fd, file).params.size(), 5u);
  fs::copy_file(kData / "bad" / "past_end" / ".metadata", dir / ".metadata",
                fs::copy_options::overwrite_existing);
  EXPECT_THROW(scan_data_file_beside(fd, file), Error);
  ::close(fd);
}

// A damaged copy: bad/<kind>/.metadata with fsdp's data files (or its own).
std::string refusal(const std::string& kind) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("dcp_" + kind);
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& entry : fs::directory_iterator(kData / "fsdp"))
    fs::copy_file(entry.path(), dir / entry.path().filename());
  for (const auto& entry : fs::directory_iterator(kData / "bad" / kind))
    fs::copy_file(entry.path(), dir / entry.path().filename(),
                  fs::copy_options::overwrite_existing);
  try {
    read_checkpoint(dir);
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    return what.substr(what.find(dir.filename().string()) + dir.filename().string().size());
  }
  ADD_FAILURE() << kind << " was accepted";
  return "";
}

TEST(DcpRefusals, Overlap) {
  EXPECT_EQ(refusal("overlap"),
            "/.metadata: tensor \"layers.0.w\" has chunks at [0,0] (sizes [4,8]) and at [3,0] "
            "(sizes [4,8]) that overlap: the checkpoint is damaged");
}

TEST(DcpRefusals, Gap) {
  EXPECT_EQ(refusal("gap"),
            "/.metadata: the chunks of tensor \"layers.0.w\" (shape [16,8]) hold 120 of its 128 "
            "elements: the checkpoint is incomplete or damaged");
}

TEST(DcpRefusals, OutOfBounds) {
  EXPECT_EQ(
      refusal("bounds"),
      "/.metadata: tensor \"layers.0.w\" of shape [16,8] has a chunk at [13,0] of sizes [4,8] "
      "outside it (dimension 0): the checkpoint is damaged");
}

TEST(DcpRefusals, ItemPastTheFileEnd) {
  EXPECT_EQ(refusal("past_end"),
            "/__0_0.distcp: the item of tensor \"layers.0.w\" chunk at [0,0] (bytes [100000, "
            "+1308) per the metadata) lies past the end of the 6028-byte file: the file is "
            "truncated or not this checkpoint's");
}

TEST(DcpRefusals, ItemsOverlap) {
  EXPECT_EQ(refusal("items_overlap"),
            "/__0_0.distcp: the items of tensor \"layers.0.w\" chunk at [0,0] and tensor "
            "\"layers.0.b\" chunk at [0] overlap (byte offsets 0 and 1000): the metadata is "
            "damaged");
}

TEST(DcpRefusals, ForeignGlobal) {
  const std::string what = refusal("foreign");
  EXPECT_TRUE(what.starts_with("/.metadata: pickle byte offset ")) << what;
  EXPECT_NE(what.find("unsupported object \"argparse.Namespace\" (a DCP .metadata holds only"),
            std::string::npos)
      << what;
}

TEST(DcpRefusals, MissingStorageEntry) {
  EXPECT_EQ(refusal("no_storage"),
            "/.metadata: tensor \"odd\" at [2,0] has no storage entry: the checkpoint is "
            "incomplete");
}

TEST(DcpRefusals, WrongDataSize) {
  EXPECT_EQ(refusal("bad_size"),
            "/__0_0.distcp: the item of tensor \"w\" chunk at [0,0] has a data/0 record of 128 "
            "bytes where the chunk's 16 elements of F32 take 64");
}

TEST(DcpRefusals, Compressed) {
  EXPECT_EQ(refusal("compressed"),
            "/.metadata: the item of \"w\" at [0,0] is stored through transforms "
            "[\"stream.zstd/1\"] (compressed): ckptfs reads only uncompressed DCP items; save "
            "without the FileSystemWriter extension");
}

}  // namespace
}  // namespace ckptfs::dcp
