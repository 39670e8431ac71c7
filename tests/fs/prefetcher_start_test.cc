// A read-ahead helper that cannot start (pthread_create fails: a pids cgroup or RLIMIT_NPROC)
// makes the Prefetcher constructor throw with no helper left running, so the mount can go on
// without read-ahead.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <cerrno>
#include <string>
#include <system_error>

#include "../../src/fs/prefetcher.h"
#include "test_data.h"

namespace {

using ckptfs::fs::testing::prefetch_read;
// Threads that may still start before pthread_create fails with EAGAIN; negative: no limit.
std::atomic<int> threads_left{-1};
}  // namespace

// Interposed for the whole test binary; without a limit it is the real one.
extern "C" int pthread_create(pthread_t* thread, const pthread_attr_t* attr, void* (*start)(void*),
                              void* arg) {
  using Create = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  static const Create real = reinterpret_cast<Create>(::dlsym(RTLD_NEXT, "pthread_create"));
  for (int left = threads_left.load(); left >= 0;) {
    if (left == 0) return EAGAIN;
    if (threads_left.compare_exchange_weak(left, left - 1)) break;
  }
  return real(thread, attr, start, arg);
}

namespace ckptfs::fs {
namespace {

TEST(PrefetcherStart, HelperThatCannotStartLeavesNoneRunning) {
  testing::TempDir dir;
  testing::TestData data(dir.path());
  const Tree tree(data.make_plan());
  for (int started : {0, 1, 2}) {
    threads_left = started;  // this many helpers start, the next one does not
    EXPECT_THROW(Prefetcher(tree, 4), std::system_error) << started;
    threads_left = -1;
  }
  // Nothing was left behind: a prefetcher now starts and serves.
  Prefetcher prefetcher(tree, 2);
  const auto stream = prefetcher.open(3);
  ASSERT_NE(stream, nullptr);
  ReplyBuffer buf;
  size_t got = 0;
  ASSERT_EQ(prefetch_read(prefetcher, *stream, 0, 4096, buf, got), 0);
  EXPECT_EQ(std::string(buf.data(), got), data.expected(0).substr(0, 4096));
}

}  // namespace
}  // namespace ckptfs::fs
