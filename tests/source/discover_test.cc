// Source discovery against the rules of spec §4.6 step 1 and the decisions of §7.
#include "ckptfs/source/discover.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <optional>
#include <string>

#include "ckptfs/error.h"
#include "ckptfs/source/step_choice.h"
#include "support/test_support.h"

namespace ckptfs::source {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using testsupport::unprivileged;

// What a mount with the default --step takes, and every ignored entry as a line.
struct Discovery {
  std::map<int64_t, fs::path> files;
  std::vector<std::string> warnings;
  std::string summary;
};

Discovery discover(const fs::path& root) {
  const Listing listing = list_sources(root);
  Discovery d;
  for (const Ignored& i : listing.ignored)
    d.warnings.push_back(i.path.string() + ": ignored, " + i.why);
  if (!listing.ranks.empty()) {
    Choice choice = choose(listing, {});
    d.files = std::move(choice.files);
    d.summary = std::move(choice.summary);
  }
  return d;
}

class DiscoverTest : public ::testing::Test {
 protected:
  // Creates root_/relative (and its parents) holding `contents`.
  fs::path file(const std::string& relative, const std::string& contents = "x") {
    return testsupport::write_file(root_ / relative, contents);
  }
  fs::path dir(const std::string& relative) {
    fs::create_directories(root_ / relative);
    return root_ / relative;
  }

  // Whether some warning mentions `text`.
  bool warned(const Discovery& d, const std::string& text) {
    for (const std::string& w : d.warnings) {
      if (w.find(text) != std::string::npos) return true;
    }
    return false;
  }

  testsupport::TempDir tmp_{"ckptfs-discover"};
  fs::path root_ = tmp_.path();
};

TEST_F(DiscoverTest, EmptyDirectoryIsNotAnError) {
  const Discovery d = discover(root_);
  EXPECT_TRUE(d.files.empty());
  EXPECT_TRUE(d.warnings.empty());
}

TEST_F(DiscoverTest, RanksWithLeadingZeros) {
  file("rank_0/a.ckpt");
  file("rank_03/b.ckpt");
  file("rank_000010/c.ckpt");
  const Discovery d = discover(root_);
  EXPECT_THAT(d.files,
              ElementsAre(Pair(0, root_ / "rank_0/a.ckpt"), Pair(3, root_ / "rank_03/b.ckpt"),
                          Pair(10, root_ / "rank_000010/c.ckpt")));
  EXPECT_TRUE(d.warnings.empty());
}

TEST_F(DiscoverTest, DuplicateRankIsAnErrorNamingBoth) {
  file("rank_3/a.ckpt");
  file("rank_03/b.ckpt");
  try {
    discover(root_);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank_3"));
    EXPECT_THAT(e.what(), HasSubstr("rank_03"));
    EXPECT_THAT(e.what(), HasSubstr(root_.string()));
  }
}

TEST_F(DiscoverTest, DuplicateRankWithoutCheckpointOnlyWarns) {
  file("rank_3/a.ckpt");
  dir("rank_003");
  const Discovery d = discover(root_);
  EXPECT_THAT(d.files, ElementsAre(Pair(3, root_ / "rank_3/a.ckpt")));
  EXPECT_TRUE(warned(d, "rank_003"));
}

TEST_F(DiscoverTest, NewestStepInNumericOrderWins) {
  // MindSpore's .ckpt transform would take net-9_1.ckpt, the last name in string order.
  file("rank_0/net-10_1.ckpt");
  file("rank_0/net-9_1.ckpt");
  file("rank_0/net-1_100.ckpt");
  const Discovery d = discover(root_);
  EXPECT_THAT(d.files, ElementsAre(Pair(0, root_ / "rank_0/net-10_1.ckpt")));
  EXPECT_EQ(d.summary, "epoch 10 step 1 on the one rank; 2 older checkpoints ignored");
}

TEST_F(DiscoverTest, SideFilesOfTrainingAreNotWarnedAbout) {
  file("rank_0/net-1_1.ckpt");
  file("rank_0/net-2_1.ckpt.tmp");
  file("rank_0/net-graph.meta");
  file("rank_0/meta.json");
  file("rank_0/notes.txt");
  const Listing listing = list_sources(root_);
  ASSERT_EQ(listing.ignored.size(), 4u);
  for (const Ignored& i : listing.ignored)
    EXPECT_EQ(i.side_file, i.path.filename() != "notes.txt") << i.path;
  EXPECT_EQ(ignored_summary(listing),
            root_.string() +
                ": ignored 1 entry that is not checkpoints (rank_0/notes.txt); --log-level debug "
                "says why");
}

TEST_F(DiscoverTest, MindFormersOutputDirectory) {
  file("output/checkpoint/rank_0/llama_rank_0-2_10.ckpt");
  file("output/checkpoint/rank_1/llama_rank_1-2_10.ckpt");
  file("output/strategy/ckpt_strategy_rank_0.ckpt");
  dir("output/log");
  const Listing listing = list_sources(root_ / "output");
  EXPECT_EQ(listing.root, root_ / "output/checkpoint");
  EXPECT_EQ(listing.mindformers_strategy, root_ / "output/strategy");
  EXPECT_EQ(listing.ranks.size(), 2u);
  EXPECT_TRUE(listing.ignored.empty());
}

TEST_F(DiscoverTest, RankDirectoriesBeatACheckpointDirectory) {
  file("rank_0/a.ckpt");
  file("checkpoint/rank_0/b.ckpt");
  const Listing listing = list_sources(root_);
  EXPECT_EQ(listing.root, root_);
  EXPECT_FALSE(listing.mindformers_strategy);
}

TEST_F(DiscoverTest, HiddenFilesAreExcluded) {
  // '-' sorts before '.', so the hidden file would be the last name if it counted.
  file("rank_0/-a.ckpt");
  file("rank_0/.b.ckpt");
  file("rank_1/-b.ckpt");
  file("rank_1/.ckpt");
  const Discovery d = discover(root_);
  EXPECT_EQ(d.files.at(0), root_ / "rank_0/-a.ckpt");
  EXPECT_EQ(d.files.at(1), root_ / "rank_1/-b.ckpt");
  EXPECT_TRUE(warned(d, "rank_0/.b.ckpt: ignored, hidden"));
  EXPECT_TRUE(warned(d, "rank_1/.ckpt: ignored, hidden"));
}

TEST_F(DiscoverTest, HiddenFileIsNeverChosenEvenAlone) {
  file("rank_2/.only.ckpt");
  const Discovery d = discover(root_);
  EXPECT_TRUE(d.files.empty());
  EXPECT_TRUE(warned(d, ".only.ckpt"));
  EXPECT_TRUE(warned(d, "rank_2: ignored, rank_2/ holds no regular, non-hidden *.ckpt"));
}

TEST_F(DiscoverTest, SuffixIsCaseSensitiveAndExact) {
  file("rank_0/a.ckpt");
  file("rank_0/b.CKPT");
  file("rank_0/c.Ckpt");
  file("rank_0/d.ckpt.bak");
  file("rank_0/e.ckpt~");
  file("rank_0/strategy.pb");
  const Discovery d = discover(root_);
  EXPECT_EQ(d.files.at(0), root_ / "rank_0/a.ckpt");
  for (const char* name : {"b.CKPT", "c.Ckpt", "d.ckpt.bak", "e.ckpt~", "strategy.pb"}) {
    EXPECT_TRUE(warned(d, name)) << name;
  }
  EXPECT_FALSE(warned(d, "a.ckpt"));
}

TEST_F(DiscoverTest, RankDirectoryNamesAreCaseSensitiveAndStrict) {
  file("Rank_1/a.ckpt");
  file("rank_/a.ckpt");
  file("rank_1a/a.ckpt");
  file("rank_-1/a.ckpt");
  file("rank_ 1/a.ckpt");
  file("ranks_1/a.ckpt");
  file("rank_99999999999999999999/a.ckpt");
  file("top.ckpt");
  const Discovery d = discover(root_);
  EXPECT_TRUE(d.files.empty());
  for (const char* name :
       {"Rank_1", "rank_:", "rank_1a", "rank_-1", "rank_ 1", "ranks_1", "rank_9999", "top.ckpt"}) {
    // "rank_:" stands for the entry named exactly "rank_" followed by the ": " of the warning.
    EXPECT_TRUE(warned(d, name)) << name;
  }
  EXPECT_EQ(d.warnings.size(), 8u);
}

TEST_F(DiscoverTest, NonDirectoryNamedLikeARankIsIgnored) {
  file("rank_5", "not a dir");
  fs::create_symlink(root_ / "missing", root_ / "rank_6");
  file("rank_7/a.ckpt");
  const Discovery d = discover(root_);
  EXPECT_THAT(d.files, ElementsAre(Pair(7, root_ / "rank_7/a.ckpt")));
  EXPECT_TRUE(warned(d, "rank_5: ignored, not a directory: a regular file"));
  EXPECT_TRUE(warned(d, "rank_6: ignored, not a directory: a dangling symlink to "));
  const Listing listing = list_sources(root_);
  EXPECT_EQ(listing.unusable.at(5), "rank_5 is not a directory: a regular file");
  EXPECT_THAT(listing.unusable.at(6), HasSubstr("rank_6 is not a directory: a dangling symlink"));
  EXPECT_FALSE(listing.unusable.contains(7));
}

// A FIFO or a device in a rank directory is never opened (opening a FIFO blocks), and the rank
// is reported with what its entry is; so is a rank directory that is a symlink loop.
TEST_F(DiscoverTest, SpecialFilesAreNamedWithTheirKind) {
  dir("rank_0");
  ASSERT_EQ(::mkfifo((root_ / "rank_0/checkpoint_0.ckpt").c_str(), 0644), 0);
  dir("rank_1");
  fs::create_symlink("/dev/zero", root_ / "rank_1/checkpoint_1.ckpt");
  fs::create_symlink(root_ / "rank_2.loop", root_ / "rank_2");
  fs::create_symlink(root_ / "rank_2", root_ / "rank_2.loop");
  const Listing listing = list_sources(root_);
  EXPECT_TRUE(listing.ranks.empty());
  EXPECT_EQ(listing.unusable.at(0),
            "rank_0/ holds no regular checkpoint file (checkpoint_0.ckpt: not a regular file: a "
            "FIFO (named pipe))");
  EXPECT_EQ(listing.unusable.at(1),
            "rank_1/ holds no regular checkpoint file (checkpoint_1.ckpt: not a regular file: a "
            "symlink to /dev/zero, a character device)");
  EXPECT_THAT(listing.unusable.at(2), HasSubstr("rank_2 is not a directory: a symlink loop"));
}

TEST_F(DiscoverTest, EmptyRankDirectoryIsIgnoredWithAWarning) {
  dir("rank_0");
  file("rank_1/notes.txt");
  const Discovery d = discover(root_);
  EXPECT_TRUE(d.files.empty());
  EXPECT_TRUE(warned(d, "rank_0: ignored, rank_0/ is empty"));
  EXPECT_TRUE(warned(d, "rank_1: ignored, rank_1/ holds no regular, non-hidden *.ckpt"));
  EXPECT_TRUE(warned(d, "notes.txt"));
  const Listing listing = list_sources(root_);
  EXPECT_EQ(listing.unusable.at(0), "rank_0/ is empty");
}

TEST_F(DiscoverTest, SymlinksAreFollowed) {
  const fs::path real = file("elsewhere/real.bin");
  const fs::path other = file("outside/rank_dir/x.ckpt");
  dir("rank_0");
  fs::create_symlink(real, root_ / "rank_0/z.ckpt");
  file("rank_0/a.ckpt");
  fs::create_symlink(other.parent_path(), root_ / "rank_1");
  const Discovery d = discover(root_);
  // The symlinked file is the last name; the path stays the link's, not its target's.
  EXPECT_EQ(d.files.at(0), root_ / "rank_0/z.ckpt");
  EXPECT_EQ(d.files.at(1), root_ / "rank_1/x.ckpt");
}

TEST_F(DiscoverTest, BrokenLinksAndDirectoriesAreNotCheckpoints) {
  file("rank_0/a.ckpt");
  dir("rank_0/y.ckpt");
  fs::create_symlink(root_ / "nowhere", root_ / "rank_0/z.ckpt");
  const Discovery d = discover(root_);
  EXPECT_EQ(d.files.at(0), root_ / "rank_0/a.ckpt");
  EXPECT_TRUE(warned(d, "y.ckpt: ignored, not a regular file"));
  EXPECT_TRUE(warned(d, "z.ckpt: ignored, not a regular file: a dangling symlink to "));
}

TEST_F(DiscoverTest, MissingSourceIsAnErrorNamingIt) {
  const fs::path missing = root_ / "nope";
  try {
    discover(missing);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(missing.string()));
    EXPECT_THAT(e.what(), HasSubstr("No such file"));
  }
}

TEST_F(DiscoverTest, SourceThatIsAFileIsAnError) {
  const fs::path path = file("plain.ckpt");
  EXPECT_THROW(
      {
        try {
          discover(path);
        } catch (const Error& e) {
          EXPECT_THAT(e.what(), HasSubstr(path.string() + ": source is not a directory"));
          throw;
        }
      },
      Error);
}

std::string discover_error(const fs::path& dir) {
  try {
    discover(dir);
    return "no error";
  } catch (const Error& e) {
    return e.what();
  }
}

TEST_F(DiscoverTest, UnreadableDirectoriesAreErrors) {
  file("rank_0/a.ckpt");
  fs::permissions(root_, fs::perms::owner_all | fs::perms::others_exec | fs::perms::others_read);
  fs::permissions(root_ / "rank_0", fs::perms::owner_all | fs::perms::others_exec);
  const fs::path locked = dir("locked");
  fs::permissions(locked, fs::perms::owner_all);
  const std::optional<std::string> out =
      unprivileged([&] { return discover_error(root_) + "\n" + discover_error(locked); });
  if (!out) GTEST_SKIP() << "cannot drop root privileges here";
  EXPECT_THAT(*out, HasSubstr((root_ / "rank_0").string() +
                              ": cannot read directory: Permission denied\n"));
  EXPECT_THAT(*out, HasSubstr(locked.string() + ": cannot read directory: Permission denied"));
}

}  // namespace
}  // namespace ckptfs::source
