// Real mounts under a temp dir: served in the foreground on a thread of this process, or
// detached in the background. Every test leaves no mount behind, even when it fails.
#include "ckptfs/fs/mount.h"

#include <dirent.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "../../src/fs/splice_stage.h"
#include "ckptfs/error.h"
#include "ckptfs/util/fd.h"
#include "test_data.h"

namespace ckptfs::fs {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::TempDir;
using testing::TestData;
using ::testing::UnorderedElementsAre;
using namespace std::chrono_literals;

struct MountLine {
  std::string device;
  std::string fstype;
  std::string options;
};

std::optional<MountLine> mount_line(const std::filesystem::path& where) {
  std::ifstream in("/proc/self/mounts");
  std::string line;
  std::optional<MountLine> found;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    MountLine m;
    std::string path;
    fields >> m.device >> path >> m.fstype >> m.options;
    if (path == where.native()) found = m;
  }
  return found;
}

template <typename Pred>
bool wait_until(Pred pred, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

// Reads all of `path` with read() in `chunk`-sized calls.
std::string read_file(const std::filesystem::path& path, size_t chunk, int* err = nullptr) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY));
  if (!fd) {
    if (err) *err = errno;
    return {};
  }
  std::string out, buf(chunk, '\0');
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf.data(), buf.size());
    if (n < 0) {
      if (err) *err = errno;
      return out;
    }
    if (n == 0) break;
    out.append(buf.data(), static_cast<size_t>(n));
  }
  if (err) *err = 0;
  return out;
}

// pread until `len` bytes or end of file.
std::string pread_full(int fd, uint64_t off, size_t len, int* err = nullptr) {
  std::string buf(len, '\0');
  size_t done = 0;
  while (done < len) {
    const ssize_t n = ::pread(fd, buf.data() + done, len - done, static_cast<off_t>(off + done));
    if (n < 0) {
      if (err) *err = errno;
      buf.resize(done);
      return buf;
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  if (err) *err = 0;
  buf.resize(done);
  return buf;
}

// Threads of this process named `name` (the foreground server runs in it).
int threads_named(std::string_view name) {
  int n = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::string comm;
    std::getline(std::ifstream(task.path() / "comm"), comm);
    if (comm == name) ++n;
  }
  return n;
}

class MountTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::access("/dev/fuse", R_OK | W_OK) != 0) GTEST_SKIP() << "/dev/fuse is not usable";
    data_.emplace(dir_.path());
    mnt_ = dir_.path() / "mnt";
    std::filesystem::create_directory(mnt_);
  }

  void TearDown() override {
    if (mount_line(mnt_)) {
      try {
        unmount(mnt_);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "unmount in TearDown: " << e.what();
        force_unmount();
      }
    }
    if (server_.joinable()) {
      if (wait_until([&] { return done_.load(); }, 20s)) {
        server_.join();
      } else {
        ADD_FAILURE() << "the foreground server did not return after unmount";
        server_.detach();
      }
    }
    EXPECT_FALSE(mount_line(mnt_)) << "a mount was left at " << mnt_;
  }

  // Aborts the FUSE connection (through a private fusectl mount, as the system may not have
  // one) so a server thread stuck behind an open file returns, then lazy-detaches the mount.
  void force_unmount() {
    std::string minor;
    std::ifstream in("/proc/self/mountinfo");
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string id, parent, dev, root, path;
      fields >> id >> parent >> dev >> root >> path;
      if (path == mnt_.native()) minor = dev.substr(dev.find(':') + 1);
    }
    const std::filesystem::path ctl = dir_.path() / "fusectl";
    std::error_code ec;
    std::filesystem::create_directory(ctl, ec);
    if (!minor.empty() && ::mount("fusectl", ctl.c_str(), "fusectl", 0, nullptr) == 0) {
      std::ofstream(ctl / minor / "abort") << "1";
      ::umount2(ctl.c_str(), MNT_DETACH);
    }
    ::umount2(mnt_.c_str(), MNT_DETACH);
  }

  // Serves in the foreground on a thread and waits until the kernel mount exists.
  void start_foreground(MountOptions options = {}) {
    start_foreground(std::move(options), data_->make_plan());
  }
  void start_foreground(MountOptions options, plan::Plan plan) {
    options.foreground = true;
    server_ = std::thread([this, options, plan = std::move(plan)]() mutable {
      try {
        rc_ = mount(mnt_, Tree(std::move(plan)), options);
      } catch (const std::exception& e) {
        error_ = e.what();
      }
      done_ = true;
    });
    ASSERT_TRUE(wait_until([&] { return mount_line(mnt_).has_value() || done_.load(); }, 10s))
        << "no mount after 10 s";
    ASSERT_FALSE(done_.load()) << "mount returned early: " << error_;
  }

  // Unmounts and checks the foreground server returned 0.
  void stop_foreground() {
    ASSERT_NO_THROW(unmount(mnt_));
    ASSERT_TRUE(wait_until([&] { return done_.load(); }, 20s));
    server_.join();
    EXPECT_EQ(rc_, 0);
    EXPECT_EQ(error_, "");
    EXPECT_FALSE(mount_line(mnt_));
  }

  std::filesystem::path file(size_t target) const {
    const int64_t rank = data_->specs()[target].rank;
    return mnt_ / ("rank_" + std::to_string(rank)) /
           ("checkpoint_" + std::to_string(rank) + ".ckpt");
  }

  void expect_contents_match() {
    for (size_t t = 0; t < data_->targets(); ++t) {
      for (size_t chunk : {size_t{4096}, size_t{1} << 20, size_t{3} << 20}) {
        int err = -1;
        const std::string got = read_file(file(t), chunk, &err);
        EXPECT_EQ(err, 0) << file(t);
        EXPECT_TRUE(got == data_->expected(t))
            << file(t) << " read in " << chunk << "-byte chunks: " << got.size() << " bytes";
      }
    }
  }

  TempDir dir_;
  std::optional<TestData> data_;
  std::filesystem::path mnt_;
  std::thread server_;
  std::atomic<bool> done_{false};
  int rc_ = -1;
  std::string error_;
};

TEST_F(MountTest, ServesTreeInForeground) {
  start_foreground();

  const std::optional<MountLine> line = mount_line(mnt_);
  ASSERT_TRUE(line);
  EXPECT_EQ(line->fstype, "fuse.ckptfs");
  EXPECT_EQ(line->device, "ckptfs:" + (dir_.path() / "src").string());
  EXPECT_THAT(line->options, ::testing::StartsWith("ro,"));

  std::vector<std::string> names;
  {
    DIR* d = ::opendir(mnt_.c_str());
    ASSERT_NE(d, nullptr);
    while (const dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
    ::closedir(d);
  }
  EXPECT_THAT(names, UnorderedElementsAre(".", "..", "rank_0", "rank_1", "rank_5", "rank_7"));
  names.clear();
  {
    DIR* d = ::opendir((mnt_ / "rank_5").c_str());
    ASSERT_NE(d, nullptr);
    while (const dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
    ::closedir(d);
  }
  EXPECT_THAT(names, UnorderedElementsAre(".", "..", "checkpoint_5.ckpt"));

  struct stat first, again;
  for (size_t t = 0; t < data_->targets(); ++t) {
    ASSERT_EQ(::stat(file(t).c_str(), &first), 0) << file(t);
    EXPECT_TRUE(S_ISREG(first.st_mode));
    EXPECT_EQ(first.st_mode & 07777, 0400u);  // sources in a 0700 mkdtemp directory
    EXPECT_EQ(static_cast<uint64_t>(first.st_size), data_->expected(t).size());
    ASSERT_EQ(::stat(file(t).c_str(), &again), 0);
    EXPECT_EQ(first.st_mtim.tv_sec, again.st_mtim.tv_sec);
    EXPECT_EQ(first.st_mtim.tv_nsec, again.st_mtim.tv_nsec);
  }
  ASSERT_EQ(::stat((mnt_ / "rank_1").c_str(), &first), 0);
  EXPECT_TRUE(S_ISDIR(first.st_mode));
  EXPECT_EQ(first.st_mode & 07777, 0555u);
  EXPECT_EQ(::stat((mnt_ / "rank_2").c_str(), &first), -1);
  EXPECT_EQ(errno, ENOENT);

  struct statvfs vfs;
  ASSERT_EQ(::statvfs(mnt_.c_str(), &vfs), 0);
  EXPECT_NE(vfs.f_flag & ST_RDONLY, 0u);

  char value[16];
  EXPECT_EQ(::getxattr(file(0).c_str(), "user.x", value, sizeof value), -1);
  EXPECT_EQ(errno, ENODATA);

  expect_contents_match();
  stop_foreground();
}

TEST_F(MountTest, RandomWindowsAndConcurrentReaders) {
  start_foreground();
  // Four threads, each with its own descriptor, reading random windows of every file.
  std::vector<std::thread> readers;
  std::atomic<int> mismatches{0};
  for (int r = 0; r < 4; ++r) {
    readers.emplace_back([&, r] {
      std::mt19937_64 rng(100 + r);
      for (size_t t = 0; t < data_->targets(); ++t) {
        UniqueFd fd(::open(file(t).c_str(), O_RDONLY));
        if (!fd) {
          ++mismatches;
          continue;
        }
        const std::string& want = data_->expected(t);
        std::uniform_int_distribution<uint64_t> off_of(0, want.size());
        std::uniform_int_distribution<size_t> len_of(1, 2u << 20);
        for (int i = 0; i < 40; ++i) {
          const uint64_t off = off_of(rng);
          const size_t len = i % 4 == 0 ? 4096 : len_of(rng);
          int err = -1;
          const std::string got = pread_full(fd.get(), off, len, &err);
          const std::string expect = off < want.size() ? want.substr(off, len) : std::string();
          if (err != 0 || got != expect) ++mismatches;
        }
      }
    });
  }
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(mismatches.load(), 0);
  stop_foreground();
}

TEST_F(MountTest, EverythingIsReadOnly) {
  start_foreground();
  errno = 0;
  EXPECT_EQ(::open(file(0).c_str(), O_WRONLY), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(::open(file(0).c_str(), O_RDWR), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(::open(file(0).c_str(), O_RDONLY | O_TRUNC), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(::creat((mnt_ / "rank_0" / "new.ckpt").c_str(), 0644), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(::mkdir((mnt_ / "rank_9").c_str(), 0755), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(::unlink(file(0).c_str()), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(::truncate(file(0).c_str(), 0), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(::rename(file(0).c_str(), (mnt_ / "rank_0" / "x").c_str()), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(::chmod(file(0).c_str(), 0644), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(::access(file(0).c_str(), W_OK), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(::access(file(0).c_str(), R_OK), 0);
  // Nothing changed.
  EXPECT_EQ(read_file(file(0), 1 << 20), data_->expected(0));
  stop_foreground();
}

TEST_F(MountTest, ChangedSourceGivesEio) {
  start_foreground();
  UniqueFd fd(::open(file(0).c_str(), O_RDONLY));
  ASSERT_TRUE(fd);
  int err = -1;
  EXPECT_EQ(pread_full(fd.get(), 0, 100, &err), data_->expected(0).substr(0, 100));
  EXPECT_EQ(err, 0);

  data_->change_source(1);
  char buf[100];
  EXPECT_EQ(::pread(fd.get(), buf, sizeof buf, 5000), -1);
  EXPECT_EQ(errno, EIO);
  // The header and source 0 are still fine.
  EXPECT_EQ(pread_full(fd.get(), 0, 9, &err), "HEADER-0:");
  EXPECT_EQ(err, 0);
  // Opening checks every source the file reads.
  EXPECT_EQ(::open(file(0).c_str(), O_RDONLY), -1);
  EXPECT_EQ(errno, EIO);
  // A file that does not read source 1 still opens and reads.
  EXPECT_EQ(read_file(file(2), 1 << 20), data_->expected(2));
  fd.reset();
  stop_foreground();
}

TEST_F(MountTest, ReadAheadHelpersLiveAsLongAsTheMount) {
  start_foreground();
  expect_contents_match();  // after a read the server has answered INIT and started helpers
  EXPECT_GE(threads_named("ckptfs-ahead"), 1);
  stop_foreground();
  EXPECT_EQ(threads_named("ckptfs-ahead"), 0);
}

TEST_F(MountTest, ServesTheSameBytesWithoutReadAhead) {
  MountOptions options;
  options.fuse_options = {"noreadahead,max_threads=2"};
  start_foreground(options);
  expect_contents_match();
  EXPECT_EQ(threads_named("ckptfs-ahead"), 0);
  stop_foreground();
}

// What a foreground server (a thread of this process) logs while it lives.
// What the daemon's threads log while a test reads it: the text is copied under the sink's own
// lock (an ostream sink's stream was read without it while FUSE workers wrote to it: a data
// race TSan reported).
class CaptureSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::string text() {
    std::lock_guard lock(mutex_);
    return out_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t line;
    formatter_->format(msg, line);
    out_.append(line.data(), line.size());
  }
  void flush_() override {}

 private:
  std::string out_;
};

class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<CaptureSink>()) {
    spdlog::default_logger()->sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  std::string text() { return sink_->text(); }
  // READs spliced, from the server's closing line; -1 if there is none.
  int64_t spliced() {
    const std::string all = text();
    std::smatch m;
    if (!std::regex_search(all, m, std::regex(R"((\d+) spliced, \d+ failed)"))) return -1;
    return std::stoll(m[1]);
  }

 private:
  std::shared_ptr<CaptureSink> sink_;
};

TEST_F(MountTest, ServesTheSameBytesSplicingEveryLongRead) {
  LogCapture log;
  MountOptions options;
  options.fuse_options = {"splice=always"};
  start_foreground(options);
  expect_contents_match();
  stop_foreground();
  EXPECT_GT(log.spliced(), 0) << log.text();
}

TEST_F(MountTest, SpliceWhileSeveralReadNeedsRoomyPipes) {
  LogCapture log;
  MountOptions options;
  options.fuse_options = {"splice"};
  start_foreground(options);
  expect_contents_match();
  stop_foreground();
  if (StagePipe::max_slots() < 512) {
    // 1 MiB pipes: a warning, and every READ gathered.
    EXPECT_THAT(log.text(), HasSubstr("splice off: pipes of 2 MiB are needed"));
    EXPECT_EQ(log.spliced(), 0) << log.text();
  } else {
    // One reader at a time here: the READs that may be spliced are the first of a file, just
    // after the last of the one before (tests/integration has the two-reader case).
    EXPECT_THAT(log.text(), HasSubstr("splice when busy"));
    EXPECT_GE(log.spliced(), 0) << log.text();
  }
}

TEST_F(MountTest, DefaultChoosesPerReadFromLeasedSources) {
  // No option: as -o splice, from the sources that hold a read lease (source_leases.h), where
  // pipes may hold a 1 MiB READ; else every READ gathered, said at info level.
  LogCapture log;
  start_foreground(MountOptions{});
  expect_contents_match();
  stop_foreground();
  if (StagePipe::max_slots() < 512) {
    EXPECT_THAT(log.text(), HasSubstr("splice off: pipes of 2 MiB are needed"));
    EXPECT_EQ(log.spliced(), 0) << log.text();
  } else {
    EXPECT_THAT(log.text(), HasSubstr("splice when busy"));
    EXPECT_THAT(log.text(), HasSubstr("sources leased"));
  }
}

TEST_F(MountTest, SpliceNeverGathersEveryRead) {
  LogCapture log;
  MountOptions options;
  options.fuse_options = {"splice=never"};
  start_foreground(options);
  expect_contents_match();
  stop_foreground();
  EXPECT_THAT(log.text(), Not(HasSubstr("splice when busy")));
  EXPECT_THAT(log.text(), Not(HasSubstr("sources leased")));
  EXPECT_EQ(log.spliced(), 0) << log.text();
}

TEST_F(MountTest, NospliceGathersEveryRead) {
  LogCapture log;
  MountOptions options;
  options.fuse_options = {"nosplice"};
  start_foreground(options);
  expect_contents_match();
  stop_foreground();
  EXPECT_THAT(log.text(), Not(HasSubstr("splice when busy")));
  EXPECT_EQ(log.spliced(), 0) << log.text();
}

TEST_F(MountTest, MaxReadSetsTheLargestRead) {
  // libfuse takes max_read too, and stops the session at INIT unless init asks for the same.
  MountOptions options;
  options.fuse_options = {"max_read=131072"};
  start_foreground(options);
  expect_contents_match();
  stop_foreground();
}

TEST_F(MountTest, MaxReadOutOfRangeIsRefused) {
  MountOptions options;
  options.fuse_options = {"max_read=100"};
  EXPECT_THROW(mount(mnt_, Tree(data_->make_plan()), options), Error);
  EXPECT_FALSE(mount_line(mnt_));
}

TEST_F(MountTest, CacheModeAllowsSharedMmap) {
  MountOptions options;
  options.fuse_options = {"cache"};  // the -o spelling of options.cache
  start_foreground(options);
  expect_contents_match();
  const std::string& want = data_->expected(2);
  UniqueFd fd(::open(file(2).c_str(), O_RDONLY));
  ASSERT_TRUE(fd);
  void* map = ::mmap(nullptr, want.size(), PROT_READ, MAP_SHARED, fd.get(), 0);
  ASSERT_NE(map, MAP_FAILED) << std::strerror(errno);
  EXPECT_TRUE(std::string_view(static_cast<const char*>(map), want.size()) == want);
  ::munmap(map, want.size());
  fd.reset();
  stop_foreground();
}

// The READ counts of the server's closing line: {served, through the page cache}.
std::optional<std::pair<int64_t, int64_t>> served_and_paged(const std::string& log) {
  std::smatch m;
  if (!std::regex_search(log, m,
                         std::regex(R"(served (\d+) reads .* (\d+) through the page cache)")))
    return std::nullopt;
  return std::make_pair(std::stoll(m[1]), std::stoll(m[2]));
}

// Reads all of `path` through a shared read-only mapping; empty and ADD_FAILURE if refused.
std::string read_mapped(const std::filesystem::path& path, size_t size) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY));
  if (!fd) {
    ADD_FAILURE() << path << ": " << std::strerror(errno);
    return {};
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (map == MAP_FAILED) {
    ADD_FAILURE() << "shared mmap of " << path << ": " << std::strerror(errno);
    return {};
  }
  std::string out(static_cast<const char*>(map), size);
  ::munmap(map, size);
  return out;
}

// All of `path` by pread() of 1 MiB into a page-aligned buffer, up to its `size`: in direct
// I/O exactly one READ per call (a buffer across one more page would be cut in two READs).
std::string pread_aligned(const std::filesystem::path& path, size_t size) {
  constexpr size_t kChunk = 1u << 20;
  UniqueFd fd(::open(path.c_str(), O_RDONLY));
  void* p = nullptr;
  if (!fd || posix_memalign(&p, 4096, kChunk) != 0) return {};
  std::unique_ptr<char, decltype(&std::free)> buf(static_cast<char*>(p), &std::free);
  std::string out;
  while (out.size() < size) {
    const ssize_t n = ::pread(fd.get(), buf.get(), std::min(kChunk, size - out.size()),
                              static_cast<off_t>(out.size()));
    if (n <= 0) break;
    out.append(buf.get(), static_cast<size_t>(n));
  }
  return out;
}

// A file its readers map (as the .safetensors view): read, then mapped shared, then read
// again, each byte-exact. Where the kernel takes FUSE_DIRECT_IO_ALLOW_MMAP the reads before the
// mapping are direct I/O (one READ per pread, each naming the reader's lock owner) and the
// ones after it come from the page cache the mapping filled (no READ at all); elsewhere the file
// is in the page cache throughout.
TEST_F(MountTest, MappedFileIsDirectUntilMappedThenCached) {
  plan::Plan plan = data_->make_plan();
  plan.targets[2].page_cache = true;
  const std::string& want = data_->expected(2);
  ASSERT_GT(want.size(), 3u << 20);
  const size_t reads_per_pass = (want.size() + (1u << 20) - 1) >> 20;
  LogCapture log;
  start_foreground({}, std::move(plan));
  for (int pass = 0; pass < 2; ++pass)
    EXPECT_TRUE(pread_aligned(file(2), want.size()) == want) << "before mapping, pass " << pass;
  EXPECT_TRUE(read_mapped(file(2), want.size()) == want);
  for (int pass = 0; pass < 2; ++pass) {
    EXPECT_TRUE(pread_aligned(file(2), want.size()) == want) << "after mapping, pass " << pass;
    EXPECT_TRUE(read_file(file(2), 4096) == want) << "after mapping, pass " << pass;
  }
  EXPECT_TRUE(read_mapped(file(2), want.size()) == want) << "second mapping";
  stop_foreground();
  const std::string text = log.text();
  const auto counts = served_and_paged(text);
  ASSERT_TRUE(counts) << text;
  const auto [served, paged] = *counts;
  EXPECT_GT(paged, 0) << text;  // the mapping faulted its pages in
  if (text.find("direct_io files may be mapped") != std::string::npos) {
    EXPECT_EQ(served - paged, static_cast<int64_t>(2 * reads_per_pass)) << text;
  } else {
    EXPECT_EQ(served, paged) << text;
  }
}

// Where the kernel takes FUSE_DIRECT_IO_ALLOW_MMAP, any file of the default mode maps shared.
TEST_F(MountTest, DirectIoFileMapsSharedWhereTheKernelAllows) {
  LogCapture log;
  start_foreground();
  const std::string& want = data_->expected(0);
  UniqueFd fd(::open(file(0).c_str(), O_RDONLY));
  ASSERT_TRUE(fd);
  void* map = ::mmap(nullptr, want.size(), PROT_READ, MAP_SHARED, fd.get(), 0);
  const int err = errno;
  if (log.text().find("direct_io files may be mapped") != std::string::npos) {
    ASSERT_NE(map, MAP_FAILED) << std::strerror(err);
    EXPECT_TRUE(std::string_view(static_cast<const char*>(map), want.size()) == want);
    ::munmap(map, want.size());
  } else {
    EXPECT_EQ(map, MAP_FAILED);
    EXPECT_EQ(err, ENODEV);
  }
  fd.reset();
  expect_contents_match();
  stop_foreground();
}

TEST_F(MountTest, BackgroundMountServesFromDetachedProcess) {
  MountOptions options;
  options.log_file = (dir_.path() / "ckptfs.log").string();
  ASSERT_EQ(mount(mnt_, Tree(data_->make_plan()), options), 0);
  // mount returned: the kernel mount exists and is served by another process.
  ASSERT_TRUE(mount_line(mnt_));
  expect_contents_match();
  EXPECT_EQ(::open(file(0).c_str(), O_WRONLY), -1);
  EXPECT_EQ(errno, EROFS);
  ASSERT_NO_THROW(unmount(mnt_));
  EXPECT_FALSE(mount_line(mnt_));
  EXPECT_TRUE(std::filesystem::exists(options.log_file));
}

TEST_F(MountTest, UnmountBusyMountFailsAndLeavesItServing) {
  start_foreground();
  {
    UniqueFd fd(::open(file(0).c_str(), O_RDONLY));
    ASSERT_TRUE(fd);
    try {
      unmount(mnt_);
      ADD_FAILURE() << "unmount of a busy mount succeeded";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(mnt_.string()));
    }
    EXPECT_TRUE(mount_line(mnt_));
    EXPECT_EQ(pread_full(fd.get(), 0, 9), "HEADER-0:");
  }
  stop_foreground();
}

TEST_F(MountTest, MountErrorsLeaveNoMount) {
  // A missing mountpoint is created, but not under a regular file.
  const std::filesystem::path file = dir_.path() / "a_file";
  std::ofstream(file) << "x";
  const std::filesystem::path missing = file / "mnt";
  try {
    mount(missing, Tree(data_->make_plan()), {});
    ADD_FAILURE() << "mount under a regular file succeeded";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot mount at " + missing.string()));
  }

  MountOptions bad;
  bad.fuse_options = {"no_such_fuse_option"};
  for (bool foreground : {true, false}) {
    bad.foreground = foreground;
    try {
      mount(mnt_, Tree(data_->make_plan()), bad);
      ADD_FAILURE() << "mount with a bad option succeeded";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("cannot mount at " + mnt_.string()));
      EXPECT_THAT(e.what(), HasSubstr("no_such_fuse_option"));
    }
    EXPECT_FALSE(mount_line(mnt_));
  }

  for (const char* count : {"max_threads=abc", "max_threads=0", "max_idle_threads=99999"}) {
    MountOptions bad_count;
    bad_count.fuse_options = {std::string("cache,") + count};
    try {
      mount(mnt_, Tree(data_->make_plan()), bad_count);
      ADD_FAILURE() << "mount with " << count << " succeeded";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(count));
    }
    EXPECT_FALSE(mount_line(mnt_));
  }

  MountOptions rw;
  rw.fuse_options = {"allow_other,rw"};
  EXPECT_THROW(mount(mnt_, Tree(data_->make_plan()), rw), Error);
  EXPECT_FALSE(mount_line(mnt_));

  // A background server that cannot start reports why, and the mount is undone.
  MountOptions no_log;
  no_log.log_file = dir_.path().string();  // a directory: the server cannot open it
  try {
    mount(mnt_, Tree(data_->make_plan()), no_log);
    ADD_FAILURE() << "mount with an unwritable log file succeeded";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot mount at " + mnt_.string()));
  }
  EXPECT_FALSE(mount_line(mnt_));
}

TEST_F(MountTest, UnmountNamesWhatIsWrong) {
  try {
    unmount(mnt_);
    ADD_FAILURE() << "unmount of a plain directory succeeded";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(mnt_.string()));
    EXPECT_THAT(e.what(), HasSubstr("not mounted"));
  }
  try {
    unmount("/proc");
    ADD_FAILURE() << "unmount of /proc succeeded";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("not a ckptfs mount"));
  }
}

}  // namespace
}  // namespace ckptfs::fs
