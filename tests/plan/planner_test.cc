// make_plan against the fixture generator, without FUSE: for each built-in case the generator
// writes the sources, the strategies and, by slicing the full tensors itself, the expected
// target files and a per-target summary (records with name, dims and dtype, the file size, the
// source ranks). Every planned .ckpt target must match that summary record for record and the
// expected file byte for byte.
#include "ckptfs/plan/planner.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "ckptfs/ckpt/scanner.h"
#include "ckptfs/index/store.h"
#include "ckptfs/plan/file_records.h"
#include "ckptfs/safetensors/scanner.h"
#include "ckptfs/strategy/strategy.h"
#include "ckptfs/util/fd.h"
#include "support/test_support.h"

namespace ckptfs::plan {
namespace {

namespace stdfs = std::filesystem;
using nlohmann::json;
using testsupport::make_fixture;
using testsupport::TempDir;

std::optional<strategy::Strategy> strategy_of(const json& fixture, const char* key,
                                              const stdfs::path& dir) {
  if (!fixture.contains(key) || fixture[key].is_null()) return std::nullopt;
  return strategy::read_strategy(dir / fixture[key].get<std::string>());
}

// The bytes of `file`, read through its runs from the plan's sources.
std::string materialize(const Plan& plan, const VirtualFile& file) {
  std::vector<Run> runs;
  file.map(0, file.size(), runs);
  std::map<uint32_t, UniqueFd> fds;
  std::string out;
  out.reserve(file.size());
  for (const Run& run : runs) {
    if (run.mem != nullptr) {
      out.append(run.mem, run.length);
      continue;
    }
    auto [it, fresh] = fds.try_emplace(run.source);
    if (fresh) it->second = UniqueFd(::open(plan.sources[run.source].file.path.c_str(), O_RDONLY));
    std::string piece(run.length, '\0');
    const ssize_t n =
        ::pread(it->second.get(), piece.data(), piece.size(), static_cast<off_t>(run.offset));
    if (n != static_cast<ssize_t>(piece.size())) throw std::runtime_error("short source read");
    out += piece;
  }
  return out;
}

// One built-in case of the generator: its files, its strategies and the targets it expects.
class PlannerAgainstGenerator : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    fixture_ = make_fixture(GetParam(), dir_);
    for (const auto& [rank, rel] : fixture_.at("source_files").items()) {
      ranks_.push_back(std::stoll(rank));
      paths_.push_back(dir_ / rel.get<std::string>());
    }
    src_ = strategy_of(fixture_, "src_strategy", dir_);
    dst_ = strategy_of(fixture_, "dst_strategy", dir_);
  }

  // A plan of the case's sources, freshly indexed (a plan takes them).
  Plan plan(const ViewOptions& views) const {
    std::vector<index::IndexedSource> indexed = index::index_sources(nullptr, paths_);
    std::map<int64_t, index::IndexedSource> sources;
    for (size_t i = 0; i < indexed.size(); ++i) sources.emplace(ranks_[i], std::move(indexed[i]));
    return make_plan(std::move(sources), src_ ? &*src_ : nullptr, dst_ ? &*dst_ : nullptr, views);
  }

  TempDir tmp_{"planner-test"};
  const stdfs::path dir_ = tmp_.path() / GetParam();
  json fixture_;
  std::vector<int64_t> ranks_;
  std::vector<stdfs::path> paths_;
  std::optional<strategy::Strategy> src_, dst_;
};

TEST_P(PlannerAgainstGenerator, TargetsMatchTheSummariesAndTheExpectedBytes) {
  ViewOptions views;
  views.safetensors = false;
  const Plan plan = this->plan(views);

  const json& targets = fixture_.at("targets");
  ASSERT_EQ(plan.targets.size(), targets.size());
  for (size_t t = 0; t < targets.size(); ++t) {
    const json& want = targets[t];
    const TargetFile& got = plan.targets[t];
    SCOPED_TRACE("target rank " + std::to_string(want.at("rank").get<int64_t>()));
    ASSERT_EQ(got.rank, want.at("rank").get<int64_t>());
    EXPECT_EQ(got.file.size(), want.at("size").get<uint64_t>());

    // The sources the file reads are among those the generator's rank list loads, and include
    // every rank a passed-through record comes from.
    const std::vector<int64_t> ranks_read = sources_read(plan, got.file).ranks;
    const std::set<int64_t> read(ranks_read.begin(), ranks_read.end());
    const auto rank_list = want.at("rank_list").get<std::vector<int64_t>>();
    for (int64_t r : read)
      EXPECT_NE(std::find(rank_list.begin(), rank_list.end(), r), rank_list.end()) << r;
    for (const json& record : want.at("records")) {
      if (record.at("source_rank").is_null()) continue;
      EXPECT_TRUE(read.count(record.at("source_rank").get<int64_t>()))
          << record.at("name").get<std::string>();
    }

    const std::string bytes = materialize(plan, got.file);
    const std::string expected = testsupport::read_file(dir_ / want.at("file").get<std::string>());
    EXPECT_TRUE(bytes == expected) << "bytes differ from " << want.at("file");

    // Record for record, as a checkpoint reader sees the planned file.
    const stdfs::path written = testsupport::write_file(tmp_.path() / "planned.ckpt", bytes);
    const scan::FileScan scan = ckpt::scan_checkpoint(written.string());
    const json& records = want.at("records");
    ASSERT_EQ(scan.params.size(), records.size());
    for (size_t i = 0; i < records.size(); ++i) {
      const scan::Param& p = scan.params[i];
      EXPECT_EQ(p.name, records[i].at("name").get<std::string>());
      EXPECT_EQ(p.dtype, records[i].at("dtype").get<std::string>()) << p.name;
      const auto dims = records[i].at("dims").get<std::vector<int64_t>>();
      EXPECT_EQ(p.dims_zero ? std::vector<int64_t>{0} : p.shape, dims) << p.name;
    }
  }
}

// The status tree lists each file's records from the plan (planned_records), never reading a
// source: what it lists must be what a reader of the file's bytes finds, record for record.
TEST_P(PlannerAgainstGenerator, PlannedRecordsAreWhatAReaderOfTheFileFinds) {
  const Plan plan = this->plan(ViewOptions{});
  ASSERT_FALSE(plan.targets.empty());
  for (const TargetFile& target : plan.targets) {
    SCOPED_TRACE(target.path());
    const std::string bytes = materialize(plan, target.file);
    const PlannedRecords planned = planned_records(target);
    std::vector<PlannedRecord> read;
    if (target.file_name().ends_with(".safetensors")) {
      EXPECT_EQ(planned.format, "safetensors");
      const ReadExact from_bytes = [&](uint64_t offset, std::span<uint8_t> out) {
        ASSERT_LE(offset + out.size(), bytes.size());
        std::copy_n(bytes.data() + offset, out.size(), out.data());
      };
      const safetensors::Header h =
          safetensors::read_header(from_bytes, bytes.size(), target.path());
      for (const safetensors::Tensor& t : h.tensors)
        read.push_back({t.name, t.code, t.shape, {{h.data_start() + t.begin, t.end - t.begin}}});
    } else {
      EXPECT_EQ(planned.format, "ckpt");
      const stdfs::path written = testsupport::write_file(tmp_.path() / "planned.ckpt", bytes);
      for (const scan::Param& p : ckpt::scan_checkpoint(written.string()).params) {
        PlannedRecord& r =
            read.emplace_back(PlannedRecord{p.name, std::string(p.dtype.name()), p.shape, {}});
        for (const scan::Extent& x : p.content) r.ranges.emplace_back(x.offset, x.length);
      }
    }
    ASSERT_EQ(planned.records.size(), read.size());
    for (size_t i = 0; i < read.size(); ++i) {
      const PlannedRecord& got = planned.records[i];
      EXPECT_EQ(got.name, read[i].name);
      EXPECT_EQ(got.dtype, read[i].dtype) << got.name;
      EXPECT_EQ(got.shape, read[i].shape) << got.name;
      EXPECT_EQ(got.ranges, read[i].ranges) << got.name;
    }
  }
}

// index build plans one target rank at a time with a memo of what derives from the strategies
// alone, shared by the targets: each target's file must be what the generator expects, as when
// all are planned at once.
TEST_P(PlannerAgainstGenerator, OneTargetAtATimeWithASharedMemoPlansTheSame) {
  ViewOptions views;
  views.safetensors = false;
  views.layout_memo = new_layout_memo();
  for (const json& want : fixture_.at("targets")) {
    const int64_t t = want.at("rank").get<int64_t>();
    SCOPED_TRACE("target rank " + std::to_string(t));
    views.ranks = {t};
    const Plan plan = this->plan(views);
    ASSERT_EQ(plan.targets.size(), 1u);
    EXPECT_EQ(plan.targets[0].file.size(), want.at("size").get<uint64_t>());
    const std::string expected = testsupport::read_file(dir_ / want.at("file").get<std::string>());
    EXPECT_TRUE(materialize(plan, plan.targets[0].file) == expected)
        << "bytes differ from " << want.at("file");
  }
}

// The memo's per-stage table of roles and layouts is built by the first target of a stage and
// read by the others, in whatever order they come (index build's threads take targets as they
// free up): targets planned last to first, each twice, give the generator's files too.
TEST_P(PlannerAgainstGenerator, TargetsInAnyOrderWithASharedMemoPlanTheSame) {
  ViewOptions views;
  views.safetensors = false;
  views.layout_memo = new_layout_memo();
  const json& targets = fixture_.at("targets");
  for (size_t k = targets.size(); k-- > 0;) {
    for (int pass = 0; pass < 2; ++pass) {
      const json& want = targets[k];
      const int64_t t = want.at("rank").get<int64_t>();
      SCOPED_TRACE("target rank " + std::to_string(t) + ", pass " + std::to_string(pass));
      views.ranks = {t};
      const Plan plan = this->plan(views);
      ASSERT_EQ(plan.targets.size(), 1u);
      const std::string expected =
          testsupport::read_file(dir_ / want.at("file").get<std::string>());
      EXPECT_TRUE(materialize(plan, plan.targets[0].file) == expected)
          << "bytes differ from " << want.at("file");
    }
  }
}

// index build's summaries plan with sizes_only: no pieces are built, but every file's size and
// sources must be those of the file a mount serves. The .ckpt sizes are the generator's; the
// .safetensors sizes are the served files' (whose bytes PlannedRecordsAreWhatAReaderOfTheFileFinds
// reads back).
TEST_P(PlannerAgainstGenerator, SizesOnlyGiveTheServedFilesSizesAndSources) {
  ViewOptions sized;
  sized.sizes_only = true;
  const Plan served = this->plan(ViewOptions{}), summary = this->plan(sized);
  ASSERT_EQ(summary.targets.size(), served.targets.size());
  ASSERT_FALSE(summary.targets.empty());
  std::map<int64_t, uint64_t> ckpt_sizes;
  for (const json& want : fixture_.at("targets"))
    ckpt_sizes[want.at("rank").get<int64_t>()] = want.at("size").get<uint64_t>();
  for (size_t i = 0; i < served.targets.size(); ++i) {
    const TargetFile &got = summary.targets[i], &want = served.targets[i];
    SCOPED_TRACE(want.path());
    EXPECT_EQ(got.path(), want.path());
    EXPECT_EQ(got.page_cache, want.page_cache);
    if (!want.file_name().ends_with(".safetensors")) {
      EXPECT_EQ(got.file.size(), ckpt_sizes.at(got.rank));
    }
    EXPECT_EQ(got.file.size(), want.file.size());
    EXPECT_EQ(got.file.sources(), want.file.sources());
    EXPECT_EQ(sources_read(summary, got.file).ranks, sources_read(served, want.file).ranks);
    EXPECT_TRUE(got.file.copied_records().empty());
    std::vector<plan::Run> runs;
    EXPECT_EQ(got.file.map(0, got.file.size(), runs), 0u);
    EXPECT_TRUE(runs.empty());
  }
}

// Layout changes of every kind the generator knows with one strategy file (or directory) per
// side: M -> N, merge, split, optimizer sharding on either side, pipelines on either side,
// JSON, multi-axis maps, a non-multiple, chunked sources, CRC trailers and old scalars, a real
// 13B strategy, and safetensors sources.
INSTANTIATE_TEST_SUITE_P(Builtins, PlannerAgainstGenerator,
                         ::testing::Values("demo", "8to4_dtypes", "8to1_merge", "1to8_split",
                                           "opt_src", "opt_dst", "pipeline_src_dir",
                                           "pipeline_src_merged", "pipeline_dst", "json",
                                           "json_pipeline", "crc_oldscalars", "multiaxis", "4to6",
                                           "src_chunks", "src_chunks_old", "llama13b_to4",
                                           "record_order", "st_demo", "st_opt_dst",
                                           "st_pipeline_dst", "st_record_order"),
                         [](const ::testing::TestParamInfo<const char*>& param) {
                           std::string name = param.param;
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

// Files of one save that list the same records in different orders (the generator's
// record_order case: rank_3 reversed, rank_2 rotated by two, rank_1 with c moved first). MindSpore
// reads each file in its own order and keeps first appearance over the files it loads, highest
// rank first: target 0 loads ranks 2 and 0 and so follows rank_2, target 1 loads ranks 3 and 1
// and follows rank_3. Resharded parameters come first, then the per-rank entries.
TEST(PlannerRecordOrder, EachTargetFollowsTheFileItLoadsFirst) {
  TempDir tmp("planner-order");
  const json fixture = make_fixture("record_order", tmp.path());
  std::map<int64_t, index::IndexedSource> sources;
  for (const auto& [rank, rel] : fixture.at("source_files").items()) {
    const stdfs::path path = tmp.path() / rel.get<std::string>();
    sources.emplace(std::stoll(rank), std::move(index::index_sources(nullptr, {path}).front()));
  }
  const std::optional<strategy::Strategy> src = strategy_of(fixture, "src_strategy", tmp.path());
  const std::optional<strategy::Strategy> dst = strategy_of(fixture, "dst_strategy", tmp.path());
  ViewOptions views;
  views.safetensors = false;
  const Plan plan = make_plan(std::move(sources), &*src, &*dst, views);

  // rank_2: c learning_rate rank_state epoch_num step_num a b; rank_3: the case order reversed.
  const std::vector<std::vector<std::string>> want = {
      {"c", "a", "b", "learning_rate", "rank_state", "epoch_num", "step_num"},
      {"c", "b", "a", "step_num", "epoch_num", "rank_state", "learning_rate"}};
  ASSERT_EQ(plan.targets.size(), want.size());
  for (size_t t = 0; t < want.size(); ++t) {
    const stdfs::path written = testsupport::write_file(tmp.path() / "planned.ckpt",
                                                        materialize(plan, plan.targets[t].file));
    std::vector<std::string> names;
    for (const scan::Param& p : ckpt::scan_checkpoint(written.string()).params)
      names.push_back(p.name);
    EXPECT_EQ(names, want[t]) << "target rank " << t;
  }
}

}  // namespace
}  // namespace ckptfs::plan
