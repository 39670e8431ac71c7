// The view module without FUSE: a view assembled from a fixture of the generator
// (scripts/ckpt_fixture.py), checked against the files the generator itself wrote by slicing
// its full tensors (listing, sizes, byte ranges); which family the registry finds for each
// family's sample directory; and a refusal in the family's own words.
#include "ckptfs/view/view.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "ckptfs/error.h"
#include "ckptfs/util/fd.h"
#include "ckptfs/view/families.h"
#include "support/test_support.h"

namespace ckptfs::view {
namespace {

namespace stdfs = std::filesystem;
using nlohmann::json;
using testsupport::make_fixture;
using testsupport::TempDir;

// `length` bytes at `offset` of the tree's file `ino`, read through its runs from the sources.
std::string read_view(const fs::Tree& tree, uint64_t ino, uint64_t offset, uint64_t length) {
  std::vector<plan::Run> runs;
  tree.file(ino)->map(offset, length, runs);
  std::string out;
  for (const plan::Run& run : runs) {
    if (run.mem != nullptr) {
      out.append(run.mem, run.length);
      continue;
    }
    const UniqueFd fd(::open(tree.plan().sources[run.source].file.path.c_str(), O_RDONLY));
    std::string piece(run.length, '\0');
    if (::pread(fd.get(), piece.data(), piece.size(), static_cast<off_t>(run.offset)) !=
        static_cast<ssize_t>(piece.size()))
      throw std::runtime_error("short source read");
    out += piece;
  }
  return out;
}

std::map<std::string, uint64_t> entries(const fs::Tree& tree, uint64_t ino) {
  std::map<std::string, uint64_t> out;
  for (const fs::Tree::DirEntry& e : tree.list(ino))
    if (e.name != "." && e.name != "..") out.emplace(std::string(e.name), e.ino);
  return out;
}

std::set<std::string> names_in(const stdfs::path& dir) {
  std::set<std::string> out;
  for (const auto& entry : stdfs::directory_iterator(dir)) out.insert(entry.path().filename());
  return out;
}

TEST(BuildTree, RankDirectoriesMatchTheGeneratorsExpectedFiles) {
  TempDir tmp("view-test");
  const stdfs::path dir = tmp.path() / "demo";
  const json fixture = make_fixture("demo", dir);
  ViewArgs args;
  args.src_dir = (dir / fixture.at("src_dir").get<std::string>()).string();
  args.src_strategy = (dir / fixture.at("src_strategy").get<std::string>()).string();
  args.dst_strategy = (dir / fixture.at("dst_strategy").get<std::string>()).string();
  args.index_dir = (tmp.path() / "index").string();
  args.quiet = true;
  ViewNotes notes;
  const std::unique_ptr<fs::Tree> tree = build_tree(args, notes, /*steps=*/false);
  EXPECT_NE(notes.chosen.find(stdfs::absolute(args.src_dir).lexically_normal().string()),
            std::string::npos)
      << notes.chosen;

  const stdfs::path expected = dir / fixture.at("expected_dir").get<std::string>();
  const std::map<std::string, uint64_t> ranks = entries(*tree, fs::Tree::kRootIno);
  std::set<std::string> rank_names;
  for (const auto& [name, ino] : ranks) rank_names.insert(name);
  EXPECT_EQ(rank_names, names_in(expected));
  for (const auto& [rank, rank_ino] : ranks) {
    SCOPED_TRACE(rank);
    const std::map<std::string, uint64_t> files = entries(*tree, rank_ino);
    std::set<std::string> file_names;
    for (const auto& [name, ino] : files) file_names.insert(name);
    ASSERT_EQ(file_names, names_in(expected / rank));
    for (const auto& [name, ino] : files) {
      SCOPED_TRACE(name);
      const std::string want = testsupport::read_file(expected / rank / name);
      ASSERT_EQ(tree->file(ino)->size(), want.size());
      // The head (the format's header), a range in the middle, and the tail.
      const uint64_t n = want.size();
      for (const auto& [at, length] :
           {std::pair<uint64_t, uint64_t>{0, std::min<uint64_t>(n, 64)},
            {n / 2, std::min<uint64_t>(n - n / 2, 4096)},
            {n - std::min<uint64_t>(n, 100), std::min<uint64_t>(n, 100)}})
        EXPECT_TRUE(read_view(*tree, ino, at, length) == want.substr(at, length))
            << "bytes " << at << "+" << length;
    }
  }
}

TEST(BuildTree, AFamilyWithItsOwnLayoutRefusesASourceStrategyInItsOwnWords) {
  TempDir tmp("view-test");
  ViewArgs args;
  args.src_dir = std::string(CKPTFS_TEST_DATA) + "/hfai/hfai_t113_n1";
  args.src_strategy = "/nonexistent/strategy.ckpt";
  args.index_dir = (tmp.path() / "index").string();
  args.quiet = true;
  ViewNotes notes;
  try {
    build_tree(args, notes, /*steps=*/false);
    FAIL() << "an hfai checkpoint with --src-strategy was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              args.src_dir +
                  ": an hfai checkpoint records no parallel layout (its PART files merge into one "
                  "full model); omit --src-strategy");
  }
}

TEST(BuildTree, TargetSummariesRefuseAnotherFamily) {
  TempDir tmp("view-test");
  index::Store store(tmp.path() / "index");
  ViewArgs args;
  args.src_dir = std::string(CKPTFS_TEST_DATA) + "/hfai/hfai_t113_n1";
  args.dst_strategy = "/nonexistent/strategy.ckpt";
  try {
    summarize_targets(args, store);
    FAIL() << "target summaries of an hfai checkpoint were made";
  } catch (const Error& e) {
    EXPECT_EQ(
        std::string(e.what()),
        args.src_dir + ": target summaries are for directories of rank_<N>/ checkpoints only");
  }
}

// Each family's sample directory is told as that family's; the rank-directory family takes
// what no other claims.
TEST(Families, EachSampleDirectoryIsItsFamilys) {
  TempDir tmp("view-test");
  const stdfs::path unified = tmp.path() / "unified";
  stdfs::create_directories(unified);
  stdfs::copy_file(stdfs::path(CKPTFS_TEST_DATA) / "safetensors/merged_model_t113.safetensors",
                   unified / "part0.safetensors");
  testsupport::write_file(unified / "param_name_map.json", R"({"w": "part0.safetensors"})");
  const stdfs::path iteration = tmp.path() / "iteration_00000010";
  testsupport::write_file(iteration / "metadata.json", "{}");
  const stdfs::path fixture = tmp.path() / "demo";
  make_fixture("demo", fixture);

  const auto family_of = [](const stdfs::path& dir) {
    return std::string(detect(dir, "latest").family->name);
  };
  EXPECT_EQ(family_of(stdfs::path(CKPTFS_TEST_DATA) / "hfai/hfai_t113_n2"), "hfai");
  EXPECT_EQ(family_of(iteration), "mindformers-metadata");
  EXPECT_EQ(family_of(unified), "unified_safetensors");
  EXPECT_EQ(family_of(fixture / "src"), "mindspore-rank-dirs");
  EXPECT_EQ(family_of(tmp.path()), "mindspore-rank-dirs");
  EXPECT_EQ(detect(iteration, "latest").found, iteration);
  // index build scans what the family names: a unified directory's parts.
  const family::Family& unified_family = *detect(unified, "latest").family;
  ASSERT_NE(unified_family.index_files, nullptr);
  const std::vector<stdfs::path> parts = unified_family.index_files(unified);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0].filename(), "part0.safetensors");

  // Every name is one family's, and the last takes every directory.
  std::set<std::string_view> names;
  for (const family::Family* f : families()) EXPECT_TRUE(names.insert(f->name).second);
  EXPECT_TRUE(is_rank_dirs(*families().back()));
}

// A file given alone is read by the reader its name and first bytes call for.
TEST(Families, ASingleFileGetsTheReaderOfItsFormat) {
  const auto format_of = [](const stdfs::path& path) {
    const UniqueFd fd(::open(path.c_str(), O_RDONLY));
    return reader_for_file(fd.get(), path.string()).format;
  };
  const stdfs::path data(CKPTFS_TEST_DATA);
  EXPECT_EQ(format_of(data / "hfai/hfai_t113_n1/PART_000.pt"), scan::SourceFormat::TorchZip);
  EXPECT_EQ(format_of(data / "safetensors/merged_model_t113.safetensors"),
            scan::SourceFormat::Safetensors);
  TempDir tmp("view-test");
  const stdfs::path ckpt = tmp.path() / "demo";
  make_fixture("demo", ckpt);
  EXPECT_EQ(format_of(ckpt / "src/rank_0/checkpoint-1_1.ckpt"), scan::SourceFormat::Ckpt);
}

}  // namespace
}  // namespace ckptfs::view
