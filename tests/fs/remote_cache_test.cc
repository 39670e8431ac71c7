#include "../../src/fs/remote_cache.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../../src/fs/remote_runs.h"
#include "ckptfs/remote/objects.h"

namespace ckptfs::fs {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kObjectSize = 16 * kMiB;
const char* const kEtag = "\"e1\"";

uint8_t byte_at(uint64_t offset) { return static_cast<uint8_t>(offset % 251); }

// A one-object store on loopback: answers each ranged GET with the bytes byte_at() gives, one
// connection per request; once silent, it takes connections and never answers (a stalled store).
class TinyStore {
 public:
  TinyStore() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    ::listen(fd_, 64);
    thread_ = std::thread([this] { serve(); });
  }
  ~TinyStore() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
    for (int c : held_) ::close(c);
  }
  int port() const { return port_; }
  void go_silent() { silent_ = true; }
  // The answer to a GET of bytes from `first` on is sent `delay` late (other GETs go on).
  void slow_down(uint64_t first, std::chrono::milliseconds delay) {
    slow_first_ = first;
    slow_delay_ = delay;
  }
  int gets() const { return gets_; }
  // The [first, end) byte ranges asked for so far, in the order they came.
  std::vector<std::pair<uint64_t, uint64_t>> asked() const {
    std::lock_guard lock(mutex_);
    return asked_;
  }

 private:
  void serve() {
    while (!stop_) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      if (silent_) {
        held_.push_back(c);
        continue;
      }
      std::string req;
      char buf[4096];
      while (req.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = ::read(c, buf, sizeof buf);
        if (n <= 0) break;
        req.append(buf, static_cast<size_t>(n));
      }
      ++gets_;
      unsigned long long first = 0, last = 0;
      const size_t at = req.find("ange: bytes=");
      if (at != std::string::npos) std::sscanf(req.c_str() + at + 12, "%llu-%llu", &first, &last);
      {
        std::lock_guard lock(mutex_);
        asked_.emplace_back(first, last + 1);
      }
      std::string body(last - first + 1, '\0');
      for (uint64_t i = 0; i < body.size(); ++i) body[i] = static_cast<char>(byte_at(first + i));
      std::string head = fmt::format(
          "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {}-{}/{}\r\nContent-Length: "
          "{}\r\nETag: {}\r\nConnection: close\r\n\r\n",
          first, last, kObjectSize, body.size(), kEtag);
      head += body;
      if (first == slow_first_) {
        late_.emplace_back([c, head = std::move(head), delay = slow_delay_] {
          std::this_thread::sleep_for(delay);
          answer(c, head);
        });
        continue;
      }
      answer(c, head);
    }
  }
  static void answer(int c, const std::string& head) {
    for (size_t sent = 0; sent < head.size();) {
      const ssize_t n = ::write(c, head.data() + sent, head.size() - sent);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    ::close(c);
  }
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false}, silent_{false};
  std::atomic<int> gets_{0};  // requests answered
  mutable std::mutex mutex_;
  std::vector<std::pair<uint64_t, uint64_t>> asked_;  // under mutex_
  std::vector<int> held_;  // the silent store's connections, closed at the end
  uint64_t slow_first_ = UINT64_MAX;
  std::chrono::milliseconds slow_delay_{0};
  std::vector<std::jthread> late_;  // slowed answers
  std::thread thread_;
};

class RemoteCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The client is registered with an object; every test's store listens on its own port,
    // so each test registers its own (and TearDown forgets it).
    placeholder_ = std::filesystem::temp_directory_path() /
                   fmt::format("remote_cache_test.{}.{}", ::getpid(),
                               ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::ofstream(placeholder_).put('x');
    const remote::S3Config config{std::string("k"),
                                  std::string("s"),
                                  std::string(),
                                  std::string("us-east-1"),
                                  fmt::format("http://127.0.0.1:{}", store_.port()),
                                  std::string("the test")};
    object_ = remote::ObjectRef{std::string("b"), {std::string("o"), kObjectSize, kEtag}};
    remote::register_object(placeholder_, object_,
                            std::make_shared<const remote::S3Client>(config, 2));
  }
  // The registry is the process's: leave no object behind for the tests after this one.
  void TearDown() override {
    remote::unregister_object(placeholder_);
    std::filesystem::remove(placeholder_);
  }

  bool holds(RemoteCache& cache, uint64_t offset, uint64_t length) {
    std::vector<uint8_t> out(length);
    if (cache.read(&object_, offset, out) != RemoteCache::Got::kCopied) return false;
    for (uint64_t i = 0; i < length; ++i)
      if (out[i] != byte_at(offset + i)) return false;
    return true;
  }

  TinyStore store_;
  std::filesystem::path placeholder_;
  remote::ObjectRef object_;
};

TEST_F(RemoteCacheTest, ARangeFetchedAheadIsReadBack) {
  RemoteCache cache(8 * kMiB, 1);
  ASSERT_TRUE(cache.want(&object_, kMiB, 2 * kMiB));
  cache.wait_idle();
  EXPECT_TRUE(holds(cache, kMiB + 5, 1000));
}

// A range that cannot fit even in an empty cache is refused without dropping the ranges held:
// they are still to be read.
TEST_F(RemoteCacheTest, ARangeLargerThanTheBoundDropsNothing) {
  RemoteCache cache(8 * kMiB, 1);
  ASSERT_TRUE(cache.want(&object_, kMiB, 2 * kMiB));
  cache.wait_idle();
  EXPECT_FALSE(cache.want(&object_, 4 * kMiB, 13 * kMiB));
  EXPECT_TRUE(holds(cache, kMiB, kMiB));
}

// A want refused for lack of room queues nothing (the header's contract): a part of it queued
// without waking a fetcher would leave the READ that waits for it waiting for good.
TEST_F(RemoteCacheTest, ARefusedWantLeavesNoReaderWaiting) {
  auto cache = std::make_unique<RemoteCache>(8 * kMiB, 1);
  ASSERT_TRUE(cache->want(&object_, kMiB, 2 * kMiB));
  cache->wait_idle();
  // Its gaps: [0, 1 MiB), which fits, and [2, 10 MiB), which does not.
  EXPECT_FALSE(cache->want(&object_, 0, 10 * kMiB));
  std::vector<uint8_t> out(kMiB);
  auto read = std::async(std::launch::async, [&] { return cache->read(&object_, 0, out); });
  const bool answered = read.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  if (!answered) cache.reset();  // wakes the waiting read, which then misses
  EXPECT_TRUE(answered) << "a READ waits for a range no fetcher was told of";
  read.get();
}

// A READ's run that two held ranges cover end to end (ranges asked for by two windows) is copied
// from both: no GET of its own.
TEST_F(RemoteCacheTest, ARunAcrossTwoRangesIsCopiedFromBoth) {
  RemoteCache cache(8 * kMiB, 1);
  ASSERT_TRUE(cache.want(&object_, 0, kMiB));
  ASSERT_TRUE(cache.want(&object_, kMiB, 2 * kMiB));
  cache.wait_idle();
  ASSERT_EQ(store_.gets(), 2);
  plan::Run run{};
  run.offset = kMiB - 100;
  run.length = 300;
  std::vector<char> out(run.length);
  char* const dest[] = {out.data()};
  const remote::ObjectRef* const objects[] = {&object_};
  std::vector<uint32_t> order = {0};
  use_remote_cache(&cache);
  const bool read = fetch_remote_runs(std::span(&run, 1), dest, order, objects);
  use_remote_cache(nullptr);
  ASSERT_TRUE(read);
  EXPECT_EQ(store_.gets(), 2) << "the run was fetched again";
  for (uint64_t i = 0; i < run.length; ++i)
    ASSERT_EQ(static_cast<uint8_t>(out[i]), byte_at(run.offset + i)) << i;
  EXPECT_EQ(cache.stats().misses, 0u);
}

// A READ's runs read at once: each answered as read() would one by one, whichever range holds
// it (the same range again after another, two end to end), a run no range covers a miss.
TEST_F(RemoteCacheTest, ManyRunsAreReadUnderOneCall) {
  RemoteCache cache(8 * kMiB, 1);
  ASSERT_TRUE(cache.want(&object_, 0, kMiB));
  ASSERT_TRUE(cache.want(&object_, kMiB, 2 * kMiB));
  cache.wait_idle();
  const std::vector<std::pair<uint64_t, uint64_t>> runs = {
      {10, 500},         {kMiB + 7, 600},      {4000, 300},
      {kMiB - 100, 300}, {2 * kMiB - 50, 100}, {5 * kMiB, 10},
      {1000, 0},         {2 * kMiB - 500, 500}};
  const std::vector<RemoteCache::Got> want = {RemoteCache::Got::kCopied, RemoteCache::Got::kCopied,
                                              RemoteCache::Got::kCopied, RemoteCache::Got::kCopied,
                                              RemoteCache::Got::kMiss,   RemoteCache::Got::kMiss,
                                              RemoteCache::Got::kCopied, RemoteCache::Got::kCopied};
  std::vector<std::vector<uint8_t>> out;
  std::vector<remote::Get> gets;
  for (const auto& [offset, length] : runs) out.emplace_back(length, 0);
  for (size_t i = 0; i < runs.size(); ++i) gets.push_back({&object_, runs[i].first, out[i]});
  std::vector<RemoteCache::Got> got(gets.size());
  cache.read(gets, got);
  EXPECT_EQ(got, want);
  for (size_t i = 0; i < runs.size(); ++i) {
    if (got[i] != RemoteCache::Got::kCopied) continue;
    for (uint64_t k = 0; k < runs[i].second; ++k)
      ASSERT_EQ(out[i][k], byte_at(runs[i].first + k)) << "run " << i << " byte " << k;
  }
  EXPECT_EQ(cache.stats().hits, 5u);  // the empty run is copied without a look
  EXPECT_EQ(cache.stats().misses, 2u);
  EXPECT_EQ(store_.gets(), 2);
}

// A READ's runs alternating among objects (a resharded target's rows, each from another
// source) are each read from their own object's ranges, also among more objects than read()
// keeps its place in at once: a run of one object inside another's held range is a miss.
TEST_F(RemoteCacheTest, RunsAlternatingAmongManyObjectsAreReadFromTheirOwn) {
  constexpr uint64_t kSpan = 64 << 10;
  constexpr size_t kObjects = 21;  // more than read() keeps a place in
  std::vector<remote::ObjectRef> objects;
  for (size_t k = 0; k < kObjects; ++k)
    objects.push_back(
        remote::ObjectRef{std::string("b"), {fmt::format("o{}", k), kObjectSize, kEtag}});
  RemoteCache cache(8 * kMiB, 1);
  // Object k holds [k * kSpan, (k + 1) * kSpan) only.
  for (size_t k = 0; k < kObjects; ++k)
    ASSERT_TRUE(cache.want(&objects[k], k * kSpan, (k + 1) * kSpan));
  cache.wait_idle();
  struct Want {
    size_t object;
    uint64_t offset, length;
    RemoteCache::Got got;
  };
  std::vector<Want> wants;
  for (uint64_t round = 0; round < 4; ++round)
    for (size_t k = 0; k < kObjects; ++k) {
      const uint64_t at = k * kSpan + round * 1000 + k;
      wants.push_back({k, at, 300, RemoteCache::Got::kCopied});
      // The same offset in the next object, whose range lies elsewhere.
      wants.push_back({(k + 1) % kObjects, at, 300, RemoteCache::Got::kMiss});
    }
  // Across the end of object 0's range: a miss.
  wants.push_back({0, kSpan - 100, 200, RemoteCache::Got::kMiss});
  std::vector<std::vector<uint8_t>> out;
  std::vector<remote::Get> gets;
  for (const Want& w : wants) out.emplace_back(w.length, 0);
  for (size_t i = 0; i < wants.size(); ++i)
    gets.push_back({&objects[wants[i].object], wants[i].offset, out[i]});
  std::vector<RemoteCache::Got> got(gets.size());
  cache.read(gets, got);
  size_t copied = 0;
  for (size_t i = 0; i < wants.size(); ++i) {
    ASSERT_EQ(got[i], wants[i].got) << "run " << i;
    if (got[i] != RemoteCache::Got::kCopied) continue;
    ++copied;
    for (uint64_t b = 0; b < wants[i].length; ++b)
      ASSERT_EQ(out[i][b], byte_at(wants[i].offset + b)) << "run " << i << " byte " << b;
  }
  EXPECT_EQ(cache.stats().hits, copied);
  EXPECT_EQ(cache.stats().misses, wants.size() - copied);
  EXPECT_EQ(store_.gets(), static_cast<int>(kObjects));
}

// A fetcher sends the next range as soon as a slot is free: a range queued after one whose GET
// is slow is read at once (with batches, it waited for the slow GET to end).
TEST_F(RemoteCacheTest, ARangeIsNotHeldBackByASlowGetSentBeforeIt) {
  const auto delay = std::chrono::milliseconds(1500);  // under the client's 2 s stall limit
  store_.slow_down(0, delay);
  RemoteCache cache(8 * kMiB, 1);
  ASSERT_TRUE(cache.want(&object_, 0, kMiB));
  ASSERT_TRUE(cache.want(&object_, kMiB, 2 * kMiB));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(holds(cache, kMiB + 10, 1000));
  EXPECT_LT(std::chrono::steady_clock::now() - start, delay / 2)
      << "the range waited for the slow GET sent before it";
  EXPECT_TRUE(holds(cache, 10, 1000));  // and the slow one arrives
}

// A want that overlaps a held range (the next file's window over a range an earlier file read)
// keeps it: room for new ranges is made from the ones no window asked for since.
TEST_F(RemoteCacheTest, AWantedRangeIsNotTheFirstFreed) {
  RemoteCache cache(8 * kMiB, 1);
  for (uint64_t at = 0; at < 6 * kMiB; at += 2 * kMiB)
    ASSERT_TRUE(cache.want(&object_, at, at + 2 * kMiB));
  cache.wait_idle();
  ASSERT_TRUE(cache.want(&object_, 0, kMiB));  // held: nothing to fetch
  ASSERT_TRUE(cache.want(&object_, 6 * kMiB, 9 * kMiB));
  cache.wait_idle();
  EXPECT_EQ(store_.gets(), 4);
  EXPECT_TRUE(holds(cache, 0, 2 * kMiB)) << "the range just wanted was freed";
  EXPECT_FALSE(holds(cache, 2 * kMiB, 2 * kMiB));  // the least recently used instead
}

// With the plan's expectations, a range all of whose expected bytes were copied out goes before
// one still to be read, even one read less recently: files read one after another need the
// ranges the last file read first, and read-least-recently freed exactly those (1.47x the bytes
// of the resharded view fetched from S3).
TEST_F(RemoteCacheTest, ASpentRangeIsFreedBeforeOneStillExpected) {
  RemoteCache cache(8 * kMiB, 1);
  cache.expect(&object_, 0, 4 * kMiB);  // two files read [0, 4 MiB)
  cache.expect(&object_, 0, 4 * kMiB);
  cache.expect(&object_, 4 * kMiB, 4 * kMiB);  // one file reads [4, 8 MiB)
  cache.expect(&object_, 8 * kMiB, 4 * kMiB);
  ASSERT_TRUE(cache.want(&object_, 0, 4 * kMiB));
  ASSERT_TRUE(cache.want(&object_, 4 * kMiB, 8 * kMiB));
  cache.wait_idle();
  ASSERT_TRUE(holds(cache, 0, 4 * kMiB));         // the first file: the second is still to come
  ASSERT_TRUE(holds(cache, 4 * kMiB, 4 * kMiB));  // its only reader: spent
  ASSERT_TRUE(cache.want(&object_, 8 * kMiB, 12 * kMiB));
  cache.wait_idle();
  EXPECT_EQ(store_.gets(), 3);
  EXPECT_TRUE(holds(cache, 0, 4 * kMiB)) << "a range the second file needs was freed";
  EXPECT_FALSE(holds(cache, 4 * kMiB, kMiB));  // the spent one instead
  const RemoteCache::Stats stats = cache.stats();
  EXPECT_EQ(stats.evicted, 4 * kMiB);
  EXPECT_EQ(stats.evicted_needed, 0u);
}

// The plan reads a quarter of every 4 KiB of the object: a block of kBlock bytes holds four
// times what READs copy out of it.
void expect_a_quarter(RemoteCache& cache, const remote::ObjectRef* object) {
  std::vector<std::pair<uint64_t, uint64_t>> runs;
  for (uint64_t at = 0; at < kObjectSize; at += 4096) runs.emplace_back(at, 1024);
  cache.expect(object, runs);
}
constexpr uint64_t kBlock = 4 * kMiB;

// With room for every block the plan reads, a want is widened to the whole aligned blocks it
// meets and cut where they begin: a store serves a few aligned GETs for much less CPU than many
// small ones.
TEST_F(RemoteCacheTest, WantsAreWholeAlignedBlocksWhenThePlanFits) {
  RemoteCache cache(kObjectSize, 1, WholeBlocks{.size = kBlock, .amplify = 8});
  expect_a_quarter(cache, &object_);
  EXPECT_TRUE(cache.fetches_whole_blocks());
  ASSERT_TRUE(cache.want(&object_, 5 * kMiB, 5 * kMiB + 100));
  ASSERT_TRUE(cache.want(&object_, 11 * kMiB, 13 * kMiB));  // across a block boundary
  cache.wait_idle();
  auto asked = store_.asked();
  std::sort(asked.begin(), asked.end());
  const std::vector<std::pair<uint64_t, uint64_t>> blocks = {
      {kBlock, 2 * kBlock}, {2 * kBlock, 3 * kBlock}, {3 * kBlock, 4 * kBlock}};
  EXPECT_EQ(asked, blocks);
  EXPECT_TRUE(holds(cache, kBlock, kBlock));
  EXPECT_TRUE(holds(cache, 2 * kBlock - 10, 20));  // one read across two blocks
  EXPECT_EQ(store_.gets(), 3);
}

// When the plan's blocks do not all fit the bound, wants are fetched as asked: blocks fetched
// whole would push out each other's bytes that later files read.
TEST_F(RemoteCacheTest, WantsAreFetchedAsAskedWhenThePlansBlocksDoNotFit) {
  RemoteCache cache(kObjectSize - 1, 1, WholeBlocks{.size = kBlock, .amplify = 8});
  expect_a_quarter(cache, &object_);
  EXPECT_FALSE(cache.fetches_whole_blocks());
  ASSERT_TRUE(cache.want(&object_, 5 * kMiB, 5 * kMiB + 100));
  ASSERT_TRUE(cache.want(&object_, 11 * kMiB, 13 * kMiB));
  cache.wait_idle();
  auto asked = store_.asked();
  std::sort(asked.begin(), asked.end());
  const std::vector<std::pair<uint64_t, uint64_t>> as_asked = {{5 * kMiB, 5 * kMiB + 100},
                                                               {11 * kMiB, 13 * kMiB}};
  EXPECT_EQ(asked, as_asked);
}

// A block fetched whole may cost at most `amplify` times the bytes the plan reads of it: at
// 1.1, a block the plan reads a quarter of is fetched as asked, one it reads whole is widened.
TEST_F(RemoteCacheTest, ABlockThePlanReadsLittleOfIsNotFetchedWhole) {
  RemoteCache cache(kObjectSize, 1, WholeBlocks{.size = kBlock, .amplify = 1.1});
  expect_a_quarter(cache, &object_);
  cache.expect(&object_, 0, kBlock);  // block 0: read whole (and a quarter of it again)
  EXPECT_FALSE(cache.fetches_whole_blocks()) << "not every block pays: wants must name runs";
  ASSERT_TRUE(cache.want(&object_, kMiB, kMiB + 100));
  ASSERT_TRUE(cache.want(&object_, 5 * kMiB, 5 * kMiB + 100));
  cache.wait_idle();
  auto asked = store_.asked();
  std::sort(asked.begin(), asked.end());
  const std::vector<std::pair<uint64_t, uint64_t>> want = {{0, kBlock}, {5 * kMiB, 5 * kMiB + 100}};
  EXPECT_EQ(asked, want);
}

// Blocks under WholeBlocks::kMinWholeBlock (a tiny -o readahead_max) are never fetched whole:
// the fit check would walk an object byte by byte, under the lock every READ takes.
TEST_F(RemoteCacheTest, TinyBlocksAreNotFetchedWhole) {
  constexpr uint64_t kTiny = WholeBlocks::kMinWholeBlock / 2;
  RemoteCache cache(kObjectSize, 1, WholeBlocks{.size = kTiny, .amplify = 8});
  expect_a_quarter(cache, &object_);
  EXPECT_FALSE(cache.fetches_whole_blocks());
  ASSERT_TRUE(cache.want(&object_, kTiny + 5, kTiny + 105));
  cache.wait_idle();
  const std::vector<std::pair<uint64_t, uint64_t>> as_asked = {{kTiny + 5, kTiny + 105}};
  EXPECT_EQ(store_.asked(), as_asked);
}

// With a spool the ranges are held in its file: the plan's blocks need only fit the spool, not
// the memory bound, and the bytes read back are the store's.
std::shared_ptr<Spool> spool_in_var_tmp(uint64_t capacity) {
  return std::make_shared<Spool>("/var/tmp", capacity);
}

TEST_F(RemoteCacheTest, WithASpoolWholeBlocksNeedFitOnlyTheSpool) {
  const std::shared_ptr<Spool> spool = spool_in_var_tmp(kObjectSize);
  RemoteCache cache(kMiB, 1, WholeBlocks{.size = kBlock, .amplify = 8}, spool);
  expect_a_quarter(cache, &object_);
  EXPECT_TRUE(cache.fetches_whole_blocks());
  ASSERT_TRUE(cache.want(&object_, 0, kObjectSize));
  cache.wait_idle();
  EXPECT_EQ(spool->used(), kObjectSize);
  EXPECT_TRUE(holds(cache, 0, kObjectSize));
  EXPECT_EQ(store_.gets(), 4);
  // READs' own buffers have the memory bound to themselves.
  EXPECT_TRUE(cache.reserve(kMiB));
  EXPECT_FALSE(cache.reserve(kMiB + 1));
  cache.release(kMiB);
}

// A range evicted from the spool gives its blocks back to the disk: the file keeps about the
// range that took its room, not the 8 MiB freed (8 MiB without the punch). About: a store may
// dirty a large folio (up to 2 MiB) reaching past its range, which ext4 may give blocks when it
// writes the folio back, so the bound allows one. The test's first form (2 MiB freed, under 2
// MiB kept) failed once in a full run, its message lost; the likeliest cause is that slack, and
// the messages now say which figure moved.
TEST_F(RemoteCacheTest, ASpooledRangeFreedForRoomLeavesTheSpool) {
  const std::shared_ptr<Spool> spool = spool_in_var_tmp(8 * kMiB);
  RemoteCache cache(kMiB, 1, WholeBlocks{}, spool);
  ASSERT_TRUE(cache.want(&object_, 0, 8 * kMiB));
  cache.wait_idle();
  ASSERT_EQ(spool->used(), 8 * kMiB);
  ASSERT_TRUE(cache.want(&object_, 12 * kMiB, 13 * kMiB));  // frees [0, 8 MiB) for room
  cache.wait_idle();
  const RemoteCache::Stats stats = cache.stats();
  EXPECT_EQ(spool->used(), kMiB) << "ranges " << stats.ranges << ", gone " << stats.gone;
  EXPECT_LE(spool->disk_bytes(), 3 * kMiB) << "in use " << spool->used();
  EXPECT_TRUE(holds(cache, 12 * kMiB, kMiB))
      << "ranges " << stats.ranges << ", gone " << stats.gone << ", failed " << stats.failed;
}

// When the spool's disk has no room for a range, its readers fetch their runs themselves: a
// miss, never a failed READ, never a wait for good.
TEST_F(RemoteCacheTest, ASpoolWithNoRoomLeavesReadersToFetchThemselves) {
  const std::shared_ptr<Spool> spool = spool_in_var_tmp(kMiB);
  uint8_t* all = spool->allocate(2 * kMiB);  // the file's whole room, taken by someone else
  ASSERT_NE(all, nullptr);
  RemoteCache cache(kMiB, 1, WholeBlocks{}, spool);
  ASSERT_TRUE(cache.want(&object_, 0, kMiB));
  std::vector<uint8_t> out(100);
  EXPECT_EQ(cache.read(&object_, 10, out), RemoteCache::Got::kMiss);
  cache.wait_idle();
  EXPECT_EQ(cache.stats().gone, 1u);
  EXPECT_EQ(cache.stats().held, 0u);
  spool->free(all, 2 * kMiB);
}

// Bytes that could not be written to the spool (a full or failing disk; here past the file size
// limit) say nothing of the object: the READ waiting for them fetches for itself, never EIO.
TEST_F(RemoteCacheTest, ASpoolWriteErrorLeavesReadersToFetchThemselves) {
  const std::shared_ptr<Spool> spool = spool_in_var_tmp(4 * kMiB);
  uint8_t* first = spool->allocate(2 * kMiB);  // the range goes at 2 MiB, past the limit below
  ASSERT_NE(first, nullptr);
  RemoteCache cache(kMiB, 1, WholeBlocks{}, spool);
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit limit = old;
  limit.rlim_cur = kMiB;
  const auto xfsz = std::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  ASSERT_TRUE(cache.want(&object_, 0, kMiB));
  std::vector<uint8_t> out(100);
  const RemoteCache::Got got = cache.read(&object_, 10, out);
  cache.wait_idle();
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, xfsz);
  EXPECT_EQ(got, RemoteCache::Got::kMiss);
  EXPECT_EQ(cache.stats().failed, 0u);
  EXPECT_EQ(cache.stats().gone, 1u);
  spool->free(first, 2 * kMiB);
}

// Unmounting does not wait for GETs stalled on the store (each would take the stall limit, times
// the retries): the fetchers give them up.
TEST_F(RemoteCacheTest, StoppingGivesUpStalledGets) {
  store_.go_silent();
  auto cache = std::make_unique<RemoteCache>(8 * kMiB, 1);
  ASSERT_TRUE(cache->want(&object_, 0, kMiB));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the GET is in flight
  const auto start = std::chrono::steady_clock::now();
  cache.reset();
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took, std::chrono::seconds(1))
      << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
}

}  // namespace
}  // namespace ckptfs::fs
