// /steps without FUSE: steps planned only when looked up, served through the main Tree's
// inodes, and dropped when their files go.
#include "ckptfs/fs/steps.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <vector>

#include "ckptfs/fs/tree.h"
#include "test_data.h"

namespace ckptfs::fs {
namespace {

using testing::tree_read;

namespace stdfs = std::filesystem;
using ::testing::ElementsAre;
using testing::TestData;

class StepsTest : public ::testing::Test {
 protected:
  StepsTest() : data_(dir_.path()) {
    for (const char* name : {"rank_0/net-1_2.ckpt", "rank_1/net-1_2.ckpt", "rank_0/net-2_2.ckpt",
                             "rank_1/net-2_2.ckpt", "rank_0/net-3_2.ckpt"})
      testsupport::write_file(train_ / name, "x");
    steps_ = std::make_shared<Steps>(train_, [this](const auto& files) {
      ++planned_;
      last_files_ = files;
      return data_.make_plan();
    });
    tree_.set_steps(steps_);
  }

  std::vector<std::string> names(uint64_t ino) const {
    std::vector<std::string> out;
    for (const Tree::DirEntry& e : tree_.list(ino)) out.emplace_back(e.name);
    return out;
  }

  testsupport::TempDir dir_{"ckptfs-steps"};
  stdfs::path train_ = dir_.path() / "train";
  TestData data_;
  Tree tree_{data_.make_plan()};
  std::shared_ptr<Steps> steps_;
  std::atomic<int> planned_{0};
  std::map<int64_t, stdfs::path> last_files_;
};

TEST_F(StepsTest, ListingPlansNothing) {
  // Reachable, not listed: a copy of the root (cp -r, rsync -a) copies the served step only.
  EXPECT_THAT(names(Tree::kRootIno),
              ElementsAre(".", "..", "rank_0", "rank_1", "rank_5", "rank_7"));
  EXPECT_EQ(tree_.lookup(Tree::kRootIno, "steps"), Tree::kStepsIno);
  struct stat root;
  ASSERT_TRUE(tree_.stat(Tree::kRootIno, root));
  EXPECT_EQ(root.st_nlink, 2u + 4u);  // the listed subdirectories only
  // Step 3 is on rank 0 only.
  EXPECT_THAT(names(Tree::kStepsIno), ElementsAre(".", "..", "1_2", "2_2"));
  struct stat st;
  ASSERT_TRUE(tree_.stat(Tree::kStepsIno, st));
  EXPECT_EQ(st.st_nlink, 4u);
  EXPECT_EQ(planned_, 0);
}

TEST_F(StepsTest, FirstLookupPlansThatStepOnce) {
  const uint64_t step = tree_.lookup(Tree::kStepsIno, "2_2");
  ASSERT_NE(step, 0u);
  EXPECT_TRUE(Tree::in_steps(step));
  EXPECT_EQ(planned_, 1);
  EXPECT_EQ(last_files_.at(1), train_ / "rank_1/net-2_2.ckpt");
  EXPECT_EQ(tree_.lookup(Tree::kStepsIno, "2_2"), step);
  EXPECT_EQ(planned_, 1);
  EXPECT_EQ(tree_.lookup(Tree::kStepsIno, "3_2"), 0u);

  const uint64_t dir = tree_.lookup(step, "rank_5");
  const uint64_t file = tree_.lookup(dir, "checkpoint_5.ckpt");
  ASSERT_NE(file, 0u);
  EXPECT_EQ(tree_.lookup(step, ".."), Tree::kStepsIno);
  struct stat st;
  ASSERT_TRUE(tree_.stat(file, st));
  EXPECT_EQ(st.st_ino, file);
  EXPECT_EQ(static_cast<size_t>(st.st_size), data_.expected(2).size());
  std::string buf(data_.expected(2).size(), '\0');
  size_t got = 0;
  ASSERT_EQ(tree_read(tree_, file, 0, std::span<char>(buf.data(), buf.size()), got), 0);
  EXPECT_EQ(got, buf.size());
  EXPECT_EQ(buf, data_.expected(2));
  EXPECT_EQ(tree_.check_file(file), 0);
  EXPECT_EQ(tree_.check_file(Tree::kStepsIno), EISDIR);
}

TEST_F(StepsTest, ANewStepAppearsAndADeletedOneGoes) {
  const uint64_t old_step = tree_.lookup(Tree::kStepsIno, "1_2");
  const uint64_t file = tree_.lookup(tree_.lookup(old_step, "rank_0"), "checkpoint_0.ckpt");
  ASSERT_NE(file, 0u);
  testsupport::write_file(train_ / "rank_1/net-3_2.ckpt", "x");
  stdfs::remove(train_ / "rank_0/net-1_2.ckpt");
  steps_->refresh();
  EXPECT_THAT(names(Tree::kStepsIno), ElementsAre(".", "..", "2_2", "3_2"));
  EXPECT_EQ(tree_.lookup(Tree::kStepsIno, "1_2"), 0u);
  // An open file of the dropped step keeps its bytes for the grace period.
  std::string buf(data_.expected(0).size(), '\0');
  size_t got = 0;
  ASSERT_EQ(tree_read(tree_, file, 0, std::span<char>(buf.data(), buf.size()), got), 0);
  EXPECT_EQ(buf, data_.expected(0));
}

TEST_F(StepsTest, WithoutStepsThereIsNoStepsDirectory) {
  Tree plain(data_.make_plan());
  EXPECT_EQ(plain.lookup(Tree::kRootIno, "steps"), 0u);
  struct stat st;
  EXPECT_FALSE(plain.stat(Tree::kStepsIno, st));
  EXPECT_TRUE(plain.list(Tree::kStepsIno).empty());
}

}  // namespace
}  // namespace ckptfs::fs
