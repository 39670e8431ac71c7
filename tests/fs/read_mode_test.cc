// The per-READ choice between gathering and splicing (read_mode.h): a pure function of what the
// mount allows and whether other readers' READs are served at once, and the counter that feeds
// it.
#include "../../src/fs/read_mode.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace ckptfs::fs {
namespace {

using Policy = ReadModeInputs::Policy;

ReadMode choose(Policy policy, bool other_now, int64_t since_us) {
  return choose_read_mode({policy, other_now, since_us});
}

TEST(ReadModeTest, LoneReaderIsGathered) {
  // No other reader's READ lately: the read-ahead gathers on the other CPU.
  EXPECT_EQ(choose(Policy::kAuto, false, INT64_MAX), ReadMode::kGather);
  EXPECT_EQ(choose(Policy::kAuto, false, kOverlapWindowUs), ReadMode::kGather);
  EXPECT_EQ(choose(Policy::kAuto, false, 60'000'000), ReadMode::kGather);
}

TEST(ReadModeTest, ConcurrentReadersAreSpliced) {
  // Another reader's READ served now, whatever file or handle it names.
  EXPECT_EQ(choose(Policy::kAuto, true, 0), ReadMode::kSplice);
  // Or a moment ago: the other reader is between two READs.
  EXPECT_EQ(choose(Policy::kAuto, false, 0), ReadMode::kSplice);
  EXPECT_EQ(choose(Policy::kAuto, false, kOverlapWindowUs - 1), ReadMode::kSplice);
  // Clocks read on two CPUs can put the overlap a little after this READ.
  EXPECT_EQ(choose(Policy::kAuto, false, -5), ReadMode::kSplice);
}

TEST(ReadModeTest, PolicyOverridesTheChoice) {
  for (bool other_now : {false, true})
    for (int64_t since : {int64_t{0}, int64_t{INT64_MAX}}) {
      EXPECT_EQ(choose(Policy::kNever, other_now, since), ReadMode::kGather);
      EXPECT_EQ(choose(Policy::kAlways, other_now, since), ReadMode::kSplice);
    }
}

ReadMode choose(const ReadsInFlight::Guard& g) {
  return choose_read_mode({Policy::kAuto, g.other_reader_now(), g.since_other_reader_us()});
}

TEST(ReadModeTest, TwoCallersAtOnceAreTwoReaders) {
  ReadsInFlight reads;
  {
    const ReadsInFlight::Guard first(reads, 101);
    EXPECT_FALSE(first.other_reader_now());
    EXPECT_EQ(choose(first), ReadMode::kGather);
    // Two threads of one loader on one file handle: two callers.
    const ReadsInFlight::Guard second(reads, 102);
    EXPECT_TRUE(second.other_reader_now());
    EXPECT_EQ(choose(second), ReadMode::kSplice);
  }
  // Both done: the first reader's next READ comes within the window.
  const ReadsInFlight::Guard next(reads, 101);
  EXPECT_FALSE(next.other_reader_now());
  EXPECT_EQ(choose(next), ReadMode::kSplice);
}

TEST(ReadModeTest, LoneReadersNextReadIsNotASecondReader) {
  // The reply to a lone reader's READ wakes the reader, whose next READ can reach another
  // worker before the first one has returned: two READs in flight, one reader.
  ReadsInFlight reads;
  const ReadsInFlight::Guard replying(reads, 7);
  const ReadsInFlight::Guard next(reads, 7);
  EXPECT_FALSE(next.other_reader_now());
  EXPECT_EQ(choose(next), ReadMode::kGather);
}

TEST(ReadModeTest, SerialReadersAreNotConcurrent) {
  // Two processes reading one after the other: never two READs in flight.
  ReadsInFlight reads;
  { const ReadsInFlight::Guard a(reads, 1); }
  { const ReadsInFlight::Guard b(reads, 2); }
  const ReadsInFlight::Guard c(reads, 1);
  EXPECT_EQ(choose(c), ReadMode::kGather);
}

TEST(ReadModeTest, OverlapIsForgottenAfterTheWindow) {
  ReadsInFlight reads;
  {
    const ReadsInFlight::Guard a(reads, 1);
    const ReadsInFlight::Guard b(reads, 2);
  }
  std::this_thread::sleep_for(std::chrono::microseconds(3 * kOverlapWindowUs));
  const ReadsInFlight::Guard lone(reads, 1);
  EXPECT_GE(lone.since_other_reader_us(), kOverlapWindowUs);
  EXPECT_EQ(choose(lone), ReadMode::kGather);
}

}  // namespace
}  // namespace ckptfs::fs
