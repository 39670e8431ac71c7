// The status tree and attributes without FUSE: a hand-built .ckpt target over random sources,
// whose plan must name extents that hold exactly the bytes the tree serves, and the grouping
// of strided runs, checked against the runs VirtualFile::map gives one by one.
#include "../../src/fs/status.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckptfs/ckpt/encoder.h"
#include "ckptfs/index/deferred_check.h"
#include "ckptfs/plan/read_map.h"
#include "fs/test_data.h"

namespace ckptfs::fs {
namespace {

using testing::Bytes;
using testing::Range;
using testing::TargetSpec;
using testing::TempDir;
using testing::TestData;

// Every byte an extent list names, expanded, against `expected` (bytes by target offset).
void expect_extents_hold(const std::vector<Extent>& extents, const std::vector<plan::Run>& runs,
                         uint64_t begin) {
  // The runs, expanded to one (source, offset) per target byte.
  std::vector<std::pair<int64_t, uint64_t>> want;
  for (const plan::Run& r : runs)
    for (uint64_t k = 0; k < r.length; ++k)
      want.emplace_back(r.mem ? -1 : static_cast<int64_t>(r.source), r.mem ? 0 : r.offset + k);
  std::vector<std::pair<int64_t, uint64_t>> got(want.size(), {-2, 0});
  for (const Extent& e : extents)
    for (uint64_t i = 0; i < e.count; ++i)
      for (uint64_t k = 0; k < e.length; ++k) {
        const uint64_t at = e.at + i * e.at_stride + k - begin;
        ASSERT_LT(at, got.size());
        EXPECT_EQ(got[at].first, -2) << "target byte " << at + begin << " named twice";
        got[at] = {e.source, e.source < 0 ? 0 : e.offset + i * e.stride + k};
      }
  EXPECT_EQ(got, want);
}

TEST(MapExtents, StridedRowsBecomeOneGroup) {
  auto content = std::make_shared<plan::StridedContent>();
  content->source = 3;
  content->base = 1000;
  content->element_size = 2;
  content->shape = {4, 3};
  content->strides = {10, 1};
  plan::VirtualFile::Builder b;
  b.add_bytes("hdr");
  b.add_strided(content, 0, content->nbytes());
  const plan::VirtualFile f = b.finish();
  std::vector<Extent> out;
  map_extents(f, 3, 24, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].source, 3);
  EXPECT_EQ(out[0].offset, 1000u);
  EXPECT_EQ(out[0].length, 6u);
  EXPECT_EQ(out[0].at, 3u);
  EXPECT_EQ(out[0].count, 4u);
  EXPECT_EQ(out[0].stride, 20);
  EXPECT_EQ(out[0].at_stride, 6u);
}

TEST(MapExtents, InterleavedBlocksBecomeOneGroupEach) {
  plan::VirtualFile::Builder b;
  for (uint64_t row = 0; row < 5; ++row) {
    b.add_source_range(0, row * 10, 4);
    b.add_source_range(1, 100 + row * 16, 4);
  }
  b.add_source_range(2, 7, 3);  // a lone run after the pattern
  const plan::VirtualFile f = b.finish();
  std::vector<Extent> out;
  map_extents(f, 0, f.size(), out);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].count, 5u);
  EXPECT_EQ(out[0].stride, 10);
  EXPECT_EQ(out[1].count, 5u);
  EXPECT_EQ(out[1].stride, 16);
  EXPECT_EQ(out[1].at, 4u);
  EXPECT_EQ(out[2].count, 1u);
  std::vector<plan::Run> runs;
  f.map(0, f.size(), runs);
  expect_extents_hold(out, runs, 0);
}

TEST(MapExtents, IrregularRunsAndPartialRangesStayExact) {
  plan::VirtualFile::Builder b;
  b.add_bytes("ab");
  const uint64_t offsets[] = {5, 90, 17, 300, 301, 44, 1000, 7, 7, 7};
  for (size_t i = 0; i < std::size(offsets); ++i)
    b.add_source_range(static_cast<uint32_t>(i % 3), offsets[i], 3 + i % 2);
  const plan::VirtualFile f = b.finish();
  for (uint64_t begin : {0, 1, 2, 5, 11}) {
    for (uint64_t len : {1, 7, 20, 100}) {
      std::vector<Extent> out;
      map_extents(f, begin, len, out);
      std::vector<plan::Run> runs;
      f.map(begin, len, runs);
      expect_extents_hold(out, runs, begin);
    }
  }
}

TEST(MapExtents, GroupsGoOnAcrossMappingChunks) {
  // 32 MiB of 32-byte rows 64 bytes apart: mapped in several chunks, still one group.
  auto content = std::make_shared<plan::StridedContent>();
  content->source = 0;
  content->element_size = 4;
  content->shape = {1 << 20, 8};
  content->strides = {16, 1};
  plan::VirtualFile::Builder b;
  b.add_strided(content, 0, content->nbytes());
  const plan::VirtualFile f = b.finish();
  std::vector<Extent> out;
  map_extents(f, 0, f.size(), out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].count, uint64_t{1} << 20);
  EXPECT_EQ(out[0].stride, 64);
}

// One .ckpt target (rank 0): a copied record, one assembled from two sources, and a scalar.
class StatusTest : public ::testing::Test {
 protected:
  StatusTest() : data_(dir_.path()) {
    tree_ = std::make_unique<Tree>(data_.make_plan_from({spec()}));
    expected_ = data_.concat(spec());
    status_ = std::make_unique<Status>(*tree_, "test sources");
  }

  static TargetSpec spec() {
    TargetSpec t{0, {}};
    const std::vector<int64_t> a{4}, b{2, 4};
    t.pieces = {Bytes{ckpt::record_header("a", a, "Float32", 16)}, Range{0, 100, 16},
                Bytes{ckpt::record_header("b", b, "Float32", 32)}, Range{1, 0, 16},
                Range{2, 50, 16}};
    return t;
  }

  uint64_t file_ino() const {
    return tree_->lookup(tree_->lookup(Tree::kRootIno, "rank_0"), "checkpoint_0.ckpt");
  }

  TempDir dir_;
  TestData data_;
  std::unique_ptr<Tree> tree_;
  std::string expected_;
  std::unique_ptr<Status> status_;
};

TEST_F(StatusTest, TreeHasItsNamesAndSizeZeroFiles) {
  const uint64_t dir = status_->lookup(Tree::kRootIno, ".ckptfs");
  ASSERT_EQ(dir, Status::kDirIno);
  EXPECT_EQ(status_->lookup(Tree::kRootIno, "rank_0"), 0u);
  std::vector<std::string> names;
  for (const Tree::DirEntry& e : status_->list(dir)) names.emplace_back(e.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{".", "..", "sources.json", "plan", "stats.json", "log"}));
  const uint64_t plan = status_->lookup(dir, "plan");
  ASSERT_NE(plan, 0u);
  const uint64_t rank0 = status_->lookup(plan, "rank_0.json");
  ASSERT_NE(rank0, 0u);
  EXPECT_EQ(status_->lookup(plan, "rank_1.json"), 0u);
  struct stat st;
  ASSERT_TRUE(status_->stat(rank0, st));
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_size, 0);
  EXPECT_EQ(st.st_mode & 0222, 0u);
  ASSERT_TRUE(status_->stat(plan, st));
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_TRUE(status_->is_file(rank0));
  EXPECT_FALSE(status_->is_file(plan));
  EXPECT_FALSE(status_->stat(Status::kDirIno + 999, st));
}

TEST_F(StatusTest, PlanExtentsHoldTheServedBytes) {
  const uint64_t plan = status_->lookup(status_->lookup(Tree::kRootIno, ".ckptfs"), "plan");
  const nlohmann::json j =
      nlohmann::json::parse(status_->content(status_->lookup(plan, "rank_0.json"), {}));
  ASSERT_EQ(j["files"].size(), 1u);
  const auto& file = j["files"][0];
  EXPECT_EQ(file["file"], "rank_0/checkpoint_0.ckpt");
  EXPECT_EQ(file["format"], "ckpt");
  EXPECT_EQ(file["size"], expected_.size());
  ASSERT_EQ(file["records"].size(), 2u);
  EXPECT_EQ(file["records"][0]["name"], "a");
  EXPECT_EQ(file["records"][1]["shape"], nlohmann::json::parse("[2,4]"));
  EXPECT_EQ(file["records"][1]["dtype"], "Float32");
  EXPECT_EQ(file["records"][1]["extents"].size(), 2u);
  for (const auto& rec : file["records"]) {
    uint64_t covered = 0;
    for (const auto& e : rec["extents"]) {
      const std::string path = file["sources"][e["file"].get<size_t>()];
      size_t source = 0;
      while (data_.source_path(source).string() != path) ++source;
      const uint64_t count = e.value("count", uint64_t{1});
      for (uint64_t i = 0; i < count; ++i) {
        const uint64_t at = e["at"].get<uint64_t>() + i * e.value("at_stride", uint64_t{0});
        const uint64_t off = e["offset"].get<uint64_t>() + i * e.value("stride", int64_t{0});
        const uint64_t len = e["length"];
        EXPECT_EQ(expected_.substr(at, len), data_.source_bytes(source).substr(off, len));
        covered += len;
      }
    }
    EXPECT_EQ(covered, rec["ranges"][0][1].get<uint64_t>());
  }
}

TEST_F(StatusTest, SourcesJsonNamesEverySource) {
  const uint64_t ino = status_->lookup(Status::kDirIno, "sources.json");
  const nlohmann::json j = nlohmann::json::parse(status_->content(ino, {}));
  EXPECT_EQ(j["chosen"], "test sources");
  ASSERT_EQ(j["sources"].size(), 3u);
  EXPECT_EQ(j["sources"][1]["path"], data_.source_path(1).string());
  EXPECT_EQ(j["sources"][1]["size"], data_.source_bytes(1).size());
  EXPECT_EQ(j["sources"][1]["rank"], 1);
}

TEST_F(StatusTest, StatsCountReadsPerFile) {
  const uint64_t ino = file_ino();
  status_->opened(ino);
  status_->served(ino, 100);
  status_->served(ino, 23);
  status_->failed(ino, 5, 10, EIO);
  const nlohmann::json j = nlohmann::json::parse(
      status_->content(status_->lookup(Status::kDirIno, "stats.json"), ReadTotals{4, 5, 6}));
  EXPECT_EQ(j["reads"], 2);
  EXPECT_EQ(j["bytes"], 123);
  EXPECT_EQ(j["eio"], 1);
  EXPECT_EQ(j["spliced"], 4);
  EXPECT_EQ(j["read_ahead_hits"], 5);
  const auto& f = j["files"]["rank_0/checkpoint_0.ckpt"];
  EXPECT_EQ(f["opens"], 1);
  EXPECT_EQ(f["reads"], 2);
  EXPECT_EQ(f["bytes"], 123);
  EXPECT_EQ(f["eio"], 1);
}

TEST_F(StatusTest, LogKeepsTheLastLines) {
  auto logger = std::make_shared<spdlog::logger>("status_test", status_->log_sink());
  for (int i = 0; i < 300; ++i) logger->warn("line {}", i);
  const std::string log = status_->content(status_->lookup(Status::kDirIno, "log"), {});
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), static_cast<long>(Status::kLogLines));
  EXPECT_NE(log.find("line 299\n"), std::string::npos);
  EXPECT_EQ(log.find("line 43\n"), std::string::npos);
}

TEST_F(StatusTest, FailedReadNamesTheChangedSource) {
  auto logger = std::make_shared<spdlog::logger>("failed_read", status_->log_sink());
  logger->set_level(spdlog::level::info);
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(logger);
  data_.change_source(1);
  const uint64_t ino = file_ino();
  const uint64_t at = expected_.size() - 20;  // inside record b, which reads sources 1 and 2
  status_->failed(ino, at, 8, EIO);
  spdlog::set_default_logger(previous);
  const std::string log = status_->content(status_->lookup(Status::kDirIno, "log"), {});
  EXPECT_NE(log.find(fmt::format("read of rank_0/checkpoint_0.ckpt at byte offset {} (8 bytes) "
                                 "failed",
                                 at)),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("changed since mounted: " + data_.source_path(1).string()), std::string::npos)
      << log;
}

// A source whose deferred header check failed (index/deferred_check.h) is named as such: its
// fingerprint never moved, so "changed since mounted" would not name it.
TEST_F(StatusTest, FailedReadNamesASourceWhoseHeadersAreNotThoseIndexed) {
  plan::Plan plan = data_.make_plan_from({spec()});
  plan.sources[1].scan.file_size = data_.source_bytes(1).size();
  index::StructureDigest other;  // not the file's: it has more than one structure byte
  other.bytes = 1;
  plan.sources[1].deferred = std::make_shared<const index::DeferredCheck>(
      other, plan.sources[1].scan, dir_.path() / "index", std::string());
  const Tree tree(std::move(plan));
  Status status(tree, "test sources");
  const uint64_t ino = tree.lookup(tree.lookup(Tree::kRootIno, "rank_0"), "checkpoint_0.ckpt");
  const uint64_t at = expected_.size() - 20;  // inside record b, which reads sources 1 and 2
  EXPECT_EQ(tree.check_file(ino), EIO);
  auto logger = std::make_shared<spdlog::logger>("failed_read", status.log_sink());
  logger->set_level(spdlog::level::info);
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(logger);
  status.failed(ino, at, 8, EIO);
  spdlog::set_default_logger(previous);
  const std::string log = status.content(status.lookup(Status::kDirIno, "log"), {});
  EXPECT_NE(log.find("headers not those indexed: " + data_.source_path(1).string()),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("changed since mounted"), std::string::npos) << log;
}

TEST_F(StatusTest, XattrsOfFilesOnly) {
  const uint64_t ino = file_ino();
  const std::string names = status_->xattr_names(ino);
  EXPECT_EQ(names, std::string("user.ckptfs.sources\0user.ckptfs.layout\0", 39));
  EXPECT_EQ(status_->xattr_names(tree_->lookup(Tree::kRootIno, "rank_0")), "");
  EXPECT_EQ(status_->xattr(ino, "user.other"), std::nullopt);
  EXPECT_EQ(*status_->xattr(ino, "user.ckptfs.sources"), data_.source_path(0).string() + "\n" +
                                                             data_.source_path(1).string() + "\n" +
                                                             data_.source_path(2).string());
  const std::string layout = *status_->xattr(ino, "user.ckptfs.layout");
  EXPECT_NE(layout.find("2 records: 1 copied from one source extent, 1 assembled from 2 extent"),
            std::string::npos)
      << layout;
  EXPECT_NE(layout.find(".ckptfs/plan/rank_0.json"), std::string::npos) << layout;
}

}  // namespace
}  // namespace ckptfs::fs
