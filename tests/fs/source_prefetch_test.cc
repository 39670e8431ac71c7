// SourcePrefetch over a hand-built tree: a read of a file queues its sources' stretches (the
// runs each target is built from, joined where close), each byte once, within the bound; local
// sources are left to the kernel. Expected ranges come from the targets' specs in test_data.h.
#include "../../src/fs/source_prefetch.h"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "test_data.h"

namespace ckptfs::fs {
namespace {

using testing::ino_of;
using testing::TempDir;
using testing::TestData;
using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;

class SourcePrefetchTest : public ::testing::Test {
 protected:
  SourcePrefetchTest() : data_(dir_.path()), tree_(data_.make_plan()) {}
  Ranges covered(const SourcePrefetch& p, size_t source) const {
    return p.covered_ranges(data_.source_path(source).string());
  }

  TempDir dir_;
  TestData data_;
  Tree tree_;
};

TEST_F(SourcePrefetchTest, FetchesEachSourceStretchOfTheFileAheadOnce) {
  SourcePrefetch p(tree_, {.max_bytes = 256u << 20, .helpers = 2, .local_too = true});
  p.note(ino_of(0), 0, 10);
  p.wait_idle();
  // Target 0 reads source 0 at [100, 5100) and [9000, 10000), 3,900 bytes apart: one stretch.
  EXPECT_EQ(covered(p, 0), (Ranges{{100, 10000}}));
  EXPECT_EQ(covered(p, 1), (Ranges{{0, 65536}}));
  EXPECT_EQ(covered(p, 2), Ranges{});
  EXPECT_EQ(p.fetched_bytes(), 9900u + 65536u);

  // Read on inside what is planned: nothing new. Target 5 shares source 0 from byte 0: only
  // the bytes not fetched yet are.
  p.note(ino_of(0), 4096, 4096);
  p.note(ino_of(2), 0, 10);
  p.wait_idle();
  EXPECT_EQ(covered(p, 0), (Ranges{{0, 10000}}));
  EXPECT_EQ(covered(p, 2), (Ranges{{0, 3u << 20}}));
  EXPECT_EQ(p.fetched_bytes(), 10000u + 65536u + (3u << 20));
}

TEST_F(SourcePrefetchTest, QueuesNoMoreThanTheBound) {
  SourcePrefetch p(tree_, {.max_bytes = 1u << 20, .helpers = 1, .local_too = true});
  p.note(ino_of(2), 0, 10);
  p.wait_idle();
  // Source 0's [0, 10000) first, then source 2 up to the bound; the rest is left to the reader.
  EXPECT_EQ(covered(p, 0), (Ranges{{0, 10000}}));
  EXPECT_EQ(covered(p, 2), (Ranges{{0, (1u << 20) - 10000}}));
  EXPECT_EQ(p.fetched_bytes(), 1u << 20);
}

TEST_F(SourcePrefetchTest, LeavesLocalSourcesAndAZeroBoundAlone) {
  EXPECT_FALSE(SourcePrefetch::any_remote(tree_));  // the test's temp folder is local
  SourcePrefetch local(tree_, {.max_bytes = 256u << 20});
  local.note(ino_of(0), 0, 10);
  local.wait_idle();
  EXPECT_EQ(covered(local, 0), Ranges{});
  EXPECT_EQ(local.fetched_bytes(), 0u);

  SourcePrefetch off(tree_, {.max_bytes = 0, .local_too = true});
  off.note(ino_of(0), 0, 10);
  off.wait_idle();
  EXPECT_EQ(off.fetched_bytes(), 0u);
}

}  // namespace
}  // namespace ckptfs::fs
