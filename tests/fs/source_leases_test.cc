// SourceLeases on real files (needs CAP_LEASE or owning the file: skipped where no lease can be
// had): who gets a lease, that a writer's open or truncate waits for the READs holding the
// source and leaves it changing (gathered) for good, and that a rename over the file changes
// nothing.
#include "../../src/fs/source_leases.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "ckptfs/util/fd.h"
#include "support/test_support.h"

namespace ckptfs::fs {
namespace {

using State = SourceLeases::State;
using testsupport::TempDir;

class SourceLeasesTest : public ::testing::Test {
 protected:
  SourceLeasesTest() {
    for (int i = 0; i < 2; ++i) {
      paths_.push_back(dir_.path() / ("source" + std::to_string(i)));
      testsupport::write_file(paths_.back(), std::string(8192, static_cast<char>('a' + i)));
      fds_.emplace_back(::open(paths_.back().c_str(), O_RDONLY | O_CLOEXEC));
    }
  }
  std::vector<SourceLeases::Source> sources() const {
    std::vector<SourceLeases::Source> out;
    for (size_t i = 0; i < fds_.size(); ++i) out.push_back({fds_[i].get(), paths_[i].string()});
    return out;
  }
  // Runs `change` on another thread while source 0 is held, and checks that it waits until the
  // hold goes, and that the source is changing (never leased again) afterwards.
  void expect_waits_for_hold(const std::function<void()>& change) {
    SourceLeases leases(sources());
    if (leases.leased() == 0) GTEST_SKIP() << "no lease here (not root, or no CAP_LEASE)";
    ASSERT_EQ(leases.leased(), 2u);
    std::atomic<bool> done{false};
    std::thread writer;
    {
      SourceLeases::Hold hold(&leases);
      const uint32_t first[] = {0};
      ASSERT_EQ(hold.take(first), State::kLeased);
      writer = std::thread([&] {
        change();
        done = true;
      });
      // The writer's change breaks the lease: once that is noticed no new READ may hold the
      // source (polled, as a loaded machine may take a while to run the writer), but the one
      // holding it keeps it, and the writer still waits.
      State seen = State::kLeased;
      for (int i = 0; i < 2000 && seen == State::kLeased; ++i) {
        SourceLeases::Hold probe(&leases);
        seen = probe.take(first);
        if (seen == State::kLeased) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      EXPECT_EQ(seen, State::kChanging);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      EXPECT_FALSE(done.load()) << "the writer did not wait for the READ holding the source";
    }
    writer.join();
    EXPECT_TRUE(done.load());
    EXPECT_EQ(leases.broken(), 1u);
    EXPECT_EQ(leases.leased(), 1u);
    SourceLeases::Hold later(&leases);
    const uint32_t both[] = {1, 0};
    EXPECT_EQ(later.take(both), State::kChanging);
    const uint32_t second[] = {1};
    EXPECT_EQ(later.take(second), State::kLeased);  // the other source is untouched
  }

  TempDir dir_;
  std::vector<std::filesystem::path> paths_;
  std::vector<UniqueFd> fds_;
};

TEST_F(SourceLeasesTest, OpenForWritingWaitsForTheHold) {
  expect_waits_for_hold([&] {
    UniqueFd fd(::open(paths_[0].c_str(), O_WRONLY | O_CLOEXEC));
    EXPECT_TRUE(fd);
  });
}

TEST_F(SourceLeasesTest, OpenWithTruncWaitsForTheHold) {
  expect_waits_for_hold([&] {
    UniqueFd fd(::open(paths_[0].c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC));
    EXPECT_TRUE(fd);
  });
}

TEST_F(SourceLeasesTest, TruncateWaitsForTheHold) {
  expect_waits_for_hold([&] { EXPECT_EQ(::truncate(paths_[0].c_str(), 100), 0); });
}

TEST_F(SourceLeasesTest, AFileOpenForWritingIsNotLeased) {
  UniqueFd writer(::open(paths_[1].c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(writer);
  SourceLeases leases(sources());
  if (leases.leased() == 0) GTEST_SKIP() << "no lease here (not root, or no CAP_LEASE)";
  EXPECT_EQ(leases.leased(), 1u);
  SourceLeases::Hold hold(&leases);
  const uint32_t both[] = {0, 1};
  EXPECT_EQ(hold.take(both), State::kUnleased);
  const uint32_t first[] = {0};
  EXPECT_EQ(hold.take(first), State::kLeased);
}

TEST_F(SourceLeasesTest, RenameOverTheFileKeepsTheLease) {
  SourceLeases leases(sources());
  if (leases.leased() == 0) GTEST_SKIP() << "no lease here (not root, or no CAP_LEASE)";
  const std::filesystem::path other = dir_.path() / "new";
  testsupport::write_file(other, "new bytes");
  ASSERT_EQ(std::rename(other.c_str(), paths_[0].c_str()), 0);
  ASSERT_EQ(::unlink(paths_[1].c_str()), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // The open files are unchanged: no notice, both still leased.
  EXPECT_EQ(leases.broken(), 0u);
  EXPECT_EQ(leases.leased(), 2u);
}

TEST(SourceLeasesNone, WithoutSourcesOrLeasesNothingIsHeld) {
  SourceLeases leases({{-1, "remote"}});
  EXPECT_EQ(leases.leased(), 0u);
  SourceLeases::Hold hold(&leases);
  const uint32_t first[] = {0};
  EXPECT_EQ(hold.take(first), State::kUnleased);
  const uint32_t beyond[] = {7};
  EXPECT_EQ(hold.take(beyond), State::kUnleased);
  SourceLeases::Hold none(nullptr);
  EXPECT_EQ(none.take(first), State::kUnleased);
}

}  // namespace
}  // namespace ckptfs::fs
