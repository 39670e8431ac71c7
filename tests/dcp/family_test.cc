// The DCP family's entry and merged view: detection through the registry's entry, and the plan
// of tensors whose chunks tile them in the ways torch writes (Shard(d) splits on several
// dimensions, empty shards, a chunk stored with non-C-order strides) and in a tiling that is no
// grid, and the same tensors cut by a --dst-strategy. Expected bytes are the tensors' global C
// order, made by the test as it writes the chunks, and cut here.
#include "ckptfs/dcp/family.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckptfs/error.h"

namespace ckptfs::dcp {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kData = fs::path(CKPTFS_TEST_DATA) / "dcp";

// One per process: ctest runs the tests of this file in parallel processes, which must not
// remove each other's files.
fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / (name + "." + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(DcpFamily, DetectsADirectoryWithGlobalMetadata) {
  EXPECT_EQ(kFamily.name, "pytorch-dcp");
  EXPECT_EQ(kFamily.detect(kData / "fsdp", ""), kData / "fsdp");
  EXPECT_EQ(kFamily.detect(kData, ""), std::nullopt);  // no .metadata of its own
  const fs::path local = fresh_dir("dcp_family_local");
  fs::copy_file(kData / "fsdp" / ".metadata", local / "__0.metadata");
  EXPECT_THROW(kFamily.detect(local, ""), Error);
  EXPECT_EQ(kFamily.index_files(kData / "threads"),
            (std::vector<fs::path>{
                kData / "threads" / "__0_0.distcp", kData / "threads" / "__0_1.distcp",
                kData / "threads" / "__1_0.distcp", kData / "threads" / "__1_1.distcp"}));
  ASSERT_EQ(kFamily.readers().size(), 1u);
  EXPECT_TRUE(kFamily.readers()[0]->claims("__0_0.distcp", std::string_view("PK\x03\x04", 4)));
  EXPECT_FALSE(kFamily.readers()[0]->claims(".metadata", "\x80\x04\x95\x00"));
}

// A planned file's bytes, read whole through its runs.
std::string read_all(const plan::Plan& plan, const plan::VirtualFile& file) {
  std::vector<plan::Run> runs;
  file.map(0, file.size(), runs);
  std::string out;
  for (const plan::Run& r : runs) {
    if (r.mem) {
      out.append(r.mem, r.length);
      continue;
    }
    std::string piece(r.length, '\0');
    EXPECT_EQ(::pread(plan.sources[r.source].file.fd.get(), piece.data(), r.length,
                      static_cast<off_t>(r.offset)),
              static_cast<ssize_t>(r.length));
    out += piece;
  }
  return out;
}

// Synthetic chunks in one data file: each chunk's storage written as the test lays it out.
struct Synthetic {
  fs::path dir = fresh_dir("dcp_family_synthetic");
  Metadata md;
  std::string bytes;                  // the data file
  std::vector<scan::Param> params;    // one per chunk
  json chunks = json::array();        // the scan's tree
  std::vector<std::string> expected;  // per tensor: its global C-order bytes

  // Tensor `fqn` of I32 elements whose value is their global C-order index.
  void tensor(const std::string& fqn, std::vector<int64_t> shape) {
    Tensor t;
    t.fqn = fqn;
    t.code = "I32";
    t.element_size = 4;
    t.shape = std::move(shape);
    md.tensors.push_back(t);
    int64_t n = 1;
    for (int64_t d : md.tensors.back().shape) n *= d;
    std::string out(static_cast<size_t>(n) * 4, '\0');
    for (int32_t i = 0; i < n; ++i) std::memcpy(&out[static_cast<size_t>(i) * 4], &i, 4);
    expected.push_back(out);
  }

  // A chunk of the last tensor at `offsets` of `sizes`, its storage `pad` elements after the
  // record's start, with `strides` (C order when empty).
  void chunk(std::vector<int64_t> offsets, std::vector<int64_t> sizes,
             std::vector<int64_t> strides = {}, uint64_t pad = 0) {
    const Tensor& t = md.tensors.back();
    const size_t rank = sizes.size();
    if (strides.empty()) {
      strides.assign(rank, 1);
      for (size_t k = rank; k-- > 1;) strides[k - 1] = strides[k] * sizes[k];
    }
    int64_t elements = 1, span = 1;
    for (size_t k = 0; k < rank; ++k) {
      elements *= sizes[k];
      span += (sizes[k] - 1) * strides[k];
    }
    if (elements == 0) span = 0;
    std::string storage(static_cast<size_t>(pad + span) * 4, '\xEE');
    std::vector<int64_t> index(rank, 0);
    for (int64_t e = 0; e < elements; ++e) {
      int64_t at = static_cast<int64_t>(pad), global = 0;
      for (size_t k = 0; k < rank; ++k) {
        at += index[k] * strides[k];
        global = global * t.shape[k] + offsets[k] + index[k];
      }
      const int32_t v = static_cast<int32_t>(global);
      std::memcpy(&storage[static_cast<size_t>(at) * 4], &v, 4);
      for (size_t k = rank; k-- > 0;)
        if (++index[k] < sizes[k])
          break;
        else
          index[k] = 0;
    }
    scan::Param p;
    p.name = t.fqn;
    p.dtype = "I32";
    p.element_size = 4;
    p.shape = sizes;
    p.view = true;
    p.content.push_back({bytes.size(), storage.size()});
    p.records.push_back({bytes.size(), storage.size()});
    p.storage_offset = pad;
    p.strides = strides;
    bytes += storage;
    params.push_back(p);
    chunks.push_back({{"fqn", t.fqn}, {"offsets", offsets}, {"shape", t.shape}});
  }

  // The merged view of the chunks written so far.
  plan::Plan plan(const strategy::Strategy* dst = nullptr) {
    const fs::path path = dir / "__0_0.distcp";
    std::ofstream(path, std::ios::binary) << bytes;
    md.files = {"__0_0.distcp"};
    index::IndexedSource source;
    source.file = source::SourceFile::open(path);
    source.scan.format = scan::SourceFormat::Dcp;
    source.scan.file_size = source.scan.body_size = bytes.size();
    source.scan.params = params;
    source.scan.tree = json{{"metadata", {{"bytes", 0}, {"digest", 0}}}, {"chunks", chunks}}.dump();
    std::vector<index::IndexedSource> files;
    files.push_back(std::move(source));
    return make_dcp_plan(std::move(files), md, "D", dst);
  }

  // The merged view's model.safetensors, read whole.
  std::string view() {
    const plan::Plan plan = this->plan();
    EXPECT_EQ(plan.targets.size(), 1u);
    EXPECT_EQ(plan.targets.at(0).name, "model.safetensors");
    EXPECT_EQ(plan.targets.at(0).rank, plan::kRootRank);
    return read_all(plan, plan.targets.at(0).file);
  }
};

// Each tensor of a safetensors file (parsed here): its data section bytes.
std::map<std::string, std::string> tensors_of(const std::string& file) {
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  const json header = json::parse(file.substr(8, n));
  std::map<std::string, std::string> out;
  for (const auto& [name, v] : header.items())
    if (name != "__metadata__")
      out[name] =
          file.substr(8 + n + v["data_offsets"][0].get<size_t>(),
                      v["data_offsets"][1].get<size_t>() - v["data_offsets"][0].get<size_t>());
  return out;
}

TEST(DcpFamily, MergesChunksThatTileATensorAnyWay) {
  Synthetic s;
  // Not a grid: two whole rows, then the last two rows cut at column 2; the lower-left chunk
  // stored column-major after 3 elements of padding; an empty shard at offset == dim.
  s.tensor("x", {4, 6});
  s.chunk({2, 2}, {2, 4});
  s.chunk({0, 0}, {2, 6});
  s.chunk({2, 0}, {2, 2}, {1, 2}, 3);
  s.chunk({4, 0}, {0, 6});
  // Shard(1) x Shard(2) of a [2,3,4] tensor, uneven along dimension 1.
  s.tensor("y", {2, 3, 4});
  for (int64_t r : {0, 1})
    for (int64_t c : {0, 2}) s.chunk({0, r, c}, {2, r == 0 ? 1 : 2, 2});
  // A scalar, and a tensor with no elements (no chunk holds bytes).
  s.tensor("s", {});
  s.chunk({}, {});
  s.tensor("e", {0, 4});
  s.chunk({0, 0}, {0, 4});
  const std::map<std::string, std::string> got = tensors_of(s.view());
  ASSERT_EQ(got.size(), 4u);
  EXPECT_TRUE(got.at("x") == s.expected[0]);
  EXPECT_TRUE(got.at("y") == s.expected[1]);
  EXPECT_TRUE(got.at("s") == s.expected[2]);
  EXPECT_EQ(got.at("e"), "");
}

TEST(DcpFamily, MergesColumnSplitChunksAsTheirGrid) {
  Synthetic s;
  // Shard(1) of 10 columns over 4 ranks as torch.chunk cuts them (3, 3, 3, 1) plus an empty
  // shard at offset == dim, one chunk stored column-major, one after padding: 33 rows.
  s.tensor("col", {33, 10});
  s.chunk({0, 3}, {33, 3}, {1, 33});
  s.chunk({0, 0}, {33, 3});
  s.chunk({0, 9}, {33, 1}, {}, 7);
  s.chunk({0, 6}, {33, 3});
  s.chunk({0, 10}, {33, 0});
  // Shard(0) x Shard(1) on a 2x2 mesh, with a third, whole-row block below: a 3x2 grid.
  s.tensor("mesh", {5, 4});
  for (int64_t r : {0, 2, 4})
    for (int64_t c : {0, 2}) s.chunk({r, c}, {r == 4 ? 1 : 2, 2});
  const std::map<std::string, std::string> got = tensors_of(s.view());
  EXPECT_TRUE(got.at("col") == s.expected[0]);
  EXPECT_TRUE(got.at("mesh") == s.expected[1]);
}

TEST(DcpFamily, ChunksThatDoNotTileAreRefusedNamingTheTensor) {
  Synthetic s;
  s.tensor("x", {4, 6});
  s.chunk({0, 0}, {2, 6});
  s.chunk({2, 0}, {2, 2});  // columns 2-5 of rows 2-3 held by nothing
  try {
    s.view();
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "tensor x: nothing holds index 2 of dimension 1: its chunks do not tile it; the "
              "checkpoint's data files do not match its .metadata");
  }
}

TEST(DcpFamily, ObjectsAreNamedInOneWarning) {
  Synthetic s;
  s.tensor("x", {2});
  s.chunk({0}, {2});
  s.md.objects = {{"step", {}}, {"extra.lr", {}}};
  const plan::Plan plan = s.plan();
  EXPECT_EQ(plan.warnings,
            (std::vector<std::string>{"D: 2 non-tensor items are not served (DCP BYTE_IO objects, "
                                      "never unpickled): step, extra.lr"}));
}

// --dst-strategy: x split in two along dimension 1, as `ckptfs strategy new --devices 2
// --split x=1` writes it.
strategy::Strategy split_x(const fs::path& dir) {
  const fs::path path = dir / "split_x.json";
  std::ofstream(path) << R"({"current_stage": 1,
    "parallel_strategy_item": {"StrategyNew_x": {"stage": 0, "parallel_strategy": [[1, 2]]}},
    "parallel_layout_item": {"x": {"dev_matrix": [2], "tensor_map": [-1, 0],
      "tensor_shape": [4, 6], "field": 0, "opt_weight_shard_step": 0,
      "opt_weight_shard_size": 0}}})";
  return strategy::read_strategy(path);
}

// split_x's two targets of `s`'s [4, 6] tensor x: columns [3 rank, 3 rank + 3) of every row,
// cut here from the global C order.
void expect_column_halves(Synthetic& s) {
  const strategy::Strategy dst = split_x(s.dir);
  const plan::Plan plan = s.plan(&dst);
  ASSERT_EQ(plan.targets.size(), 4u);  // .ckpt and .safetensors of ranks 0 and 1
  for (const plan::TargetFile& t : plan.targets) {
    if (!t.name.ends_with(".safetensors")) continue;
    std::string want;
    for (size_t row = 0; row < 4; ++row)
      want += s.expected[0].substr((row * 6 + 3 * static_cast<size_t>(t.rank)) * 4, 12);
    EXPECT_TRUE(tensors_of(read_all(plan, t.file)).at("x") == want) << t.rank;
  }
}

TEST(DcpFamily, ReshardingCutsTheTensorTheChunksTile) {
  Synthetic s;
  s.tensor("x", {4, 6});
  s.chunk({2, 0}, {2, 6});
  s.chunk({0, 0}, {2, 6}, {}, 5);
  expect_column_halves(s);
}

// Chunks that tile the tensor as a grid are cut cell by cell, whatever their strides.
TEST(DcpFamily, ReshardingCutsAGridWhoseChunkIsNotInCOrder) {
  Synthetic s;
  s.tensor("x", {4, 6});
  s.chunk({0, 0}, {2, 6});
  s.chunk({2, 0}, {2, 6}, {1, 2});
  expect_column_halves(s);
}

// Chunks laid like bricks (no grid) are assembled range by range, which needs C order.
TEST(DcpFamily, ReshardingRefusesASplitChunkNotInCOrder) {
  Synthetic s;
  s.tensor("x", {4, 6});
  s.chunk({0, 0}, {2, 6});
  s.chunk({2, 0}, {2, 3}, {1, 2});
  s.chunk({2, 3}, {2, 3});
  const strategy::Strategy dst = split_x(s.dir);
  try {
    s.plan(&dst);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "D: tensor x: its chunk at [2,0] is stored with strides [1,2], not in C order, "
              "which --dst-strategy cannot cut yet; mount without it for the merged view");
  }
}

}  // namespace
}  // namespace ckptfs::dcp
