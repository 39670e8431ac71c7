// PushAhead over a hand-built tree with a store that records what it is handed: the bytes
// pushed equal the expected file at their offsets, stay within the window past the latest READ
// and the file's end, skip the tripwire pages, and stop for good when a source changes (the
// failed gather pushes nothing) or the file is forgotten.
#include "../../src/fs/push_ahead.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "test_data.h"

namespace ckptfs::fs {
namespace {

using testing::ino_of;
using testing::TempDir;
using testing::TestData;

constexpr size_t kTarget = 2;  // rank 5: a little over 3 MiB
constexpr uint64_t kKiB = 1024, kMiB = 1024 * 1024;

class Recorder {
 public:
  PushAhead::Store store() {
    return [this](uint64_t ino, uint64_t off, std::span<const char> bytes) {
      std::lock_guard lock(mutex_);
      EXPECT_EQ(ino, ino_of(kTarget));
      pushed_[off] = std::string(bytes.data(), bytes.size());
      return 0;
    };
  }
  std::map<uint64_t, std::string> pushed() {
    std::lock_guard lock(mutex_);
    return pushed_;
  }

 private:
  std::mutex mutex_;
  std::map<uint64_t, std::string> pushed_;
};

// Waits until `p` has pushed nothing new for 20 ms.
void settle(const PushAhead& p) {
  uint64_t seen = p.pushed_bytes();
  for (int quiet = 0, i = 0; quiet < 20 && i < 3000; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const uint64_t now = p.pushed_bytes() + p.failed();
    quiet = now == seen ? quiet + 1 : 0;
    seen = now;
  }
}

class PushAheadTest : public ::testing::Test {
 protected:
  PushAheadTest() : data_(dir_.path()), tree_(data_.make_plan()) {}
  const std::string& want() const { return data_.expected(kTarget); }
  TempDir dir_;
  TestData data_;
  Tree tree_;
  Recorder recorder_;
};

TEST_F(PushAheadTest, PushesTheExpectedBytesWithinTheWindow) {
  PushAhead p(tree_, recorder_.store(),
              {.window = kMiB, .chunk = 256 * kKiB, .tripwire = 0, .helpers = 2});
  p.paged(ino_of(kTarget), 0, 4096);
  settle(p);
  const auto pushed = recorder_.pushed();
  ASSERT_FALSE(pushed.empty());
  uint64_t at = 4096;  // contiguous from the READ's end to the window's
  for (const auto& [off, bytes] : pushed) {
    EXPECT_EQ(off, at);
    EXPECT_EQ(bytes, want().substr(off, bytes.size())) << "at " << off;
    at = off + bytes.size();
  }
  EXPECT_EQ(at, 4096 + kMiB);
}

TEST_F(PushAheadTest, StopsAtTheFileEndAndLeavesTripwires) {
  PushAhead p(tree_, recorder_.store(),
              {.window = 8 * kMiB, .chunk = 256 * kKiB, .tripwire = kMiB, .helpers = 1});
  p.paged(ino_of(kTarget), 0, 4096);
  settle(p);
  uint64_t end = 0, total = 0;
  for (const auto& [off, bytes] : recorder_.pushed()) {
    EXPECT_EQ(bytes, want().substr(off, bytes.size())) << "at " << off;
    EXPECT_NE(off % kMiB, 0u) << "the tripwire page at " << off << " was pushed";
    end = std::max<uint64_t>(end, off + bytes.size());
    total += bytes.size();
  }
  EXPECT_EQ(end, want().size());
  // Everything past the READ but the tripwire pages at 1, 2 and 3 MiB.
  EXPECT_EQ(total, want().size() - 4096 - 3 * 4096);
}

TEST_F(PushAheadTest, AChangedSourceStopsPushing) {
  PushAhead p(tree_, recorder_.store(),
              {.window = 512 * kKiB, .chunk = 256 * kKiB, .tripwire = 0, .helpers = 1});
  p.paged(ino_of(kTarget), 0, 4096);
  settle(p);
  const auto before = recorder_.pushed();
  ASSERT_FALSE(before.empty());
  data_.change_source(2);
  p.paged(ino_of(kTarget), kMiB, 4096);  // the READ itself fails; the push after it too
  settle(p);
  EXPECT_EQ(p.failed(), 1u);
  p.paged(ino_of(kTarget), 2 * kMiB, 4096);  // and no more is tried
  settle(p);
  EXPECT_EQ(p.failed(), 1u);
  EXPECT_EQ(recorder_.pushed(), before);
}

TEST_F(PushAheadTest, ForgottenFilesAreNotPushed) {
  PushAhead p(tree_, recorder_.store(),
              {.window = 512 * kKiB, .chunk = 256 * kKiB, .tripwire = 0, .helpers = 1});
  p.forget(ino_of(kTarget));  // nothing to forget: harmless
  p.paged(ino_of(kTarget), 0, 4096);
  settle(p);
  p.forget(ino_of(kTarget));
  const auto before = recorder_.pushed();
  p.paged(ino_of(0) + 1000, 0, 4096);  // not a file: ignored
  settle(p);
  EXPECT_EQ(recorder_.pushed(), before);
}

}  // namespace
}  // namespace ckptfs::fs
