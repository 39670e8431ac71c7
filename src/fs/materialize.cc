#include "ckptfs/fs/materialize.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <exception>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <system_error>
#include <thread>

#include "ckptfs/error.h"
#include "ckptfs/util/eintr.h"
#include "ckptfs/util/fd.h"
#include "ckptfs/util/open_path.h"

namespace ckptfs::fs {

namespace {

namespace stdfs = std::filesystem;

// One target file being written. Its segments are handed out in order, so only about `jobs`
// files are open at a time.
struct Job {
  uint64_t ino = 0;
  uint64_t size = 0;
  stdfs::path final_path, temp_path;
  struct timespec mtime {};
  // 0600 for the decrypted copy of an encrypted source: the copy is its owner's, as the view is.
  mode_t mode = 0644;
  std::mutex mu;
  UniqueFd fd;  // opened by the first segment to start
  std::atomic<uint64_t> segments_left{0};
};

struct Segment {
  Job* job;
  uint64_t begin, end;
};

bool is_complete(const Job& job) {
  struct stat st;
  if (::stat(job.final_path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  return static_cast<uint64_t>(st.st_size) == job.size && st.st_mtim.tv_sec == job.mtime.tv_sec &&
         st.st_mtim.tv_nsec == job.mtime.tv_nsec;
}

int open_temp(Job& job) {
  std::lock_guard lock(job.mu);
  if (!job.fd) {
    // A new file, never one already there: a FIFO would block the open, a symlink would send
    // the bytes elsewhere. The name is ours (a stopped run's leftover), so it is removed first.
    ::unlink(job.temp_path.c_str());
    job.fd = UniqueFd(::open(job.temp_path.c_str(),
                             O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, job.mode));
    if (!job.fd) fail("{}: cannot create: {}", job.temp_path.string(), errno_text(errno));
  }
  return job.fd.get();
}

void write_at(int fd, const Job& job, const char* data, size_t length, uint64_t offset) {
  while (length > 0) {
    const ssize_t n =
        retry_eintr([&] { return ::pwrite(fd, data, length, static_cast<off_t>(offset)); });
    if (n <= 0)
      fail("{}: cannot write at byte {}: {}", job.temp_path.string(), offset,
           n < 0 ? errno_text(errno) : std::string("no progress"));
    data += n;
    length -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

// The last segment of a file: make it durable, give it the view's mtime, then its name.
void complete(Job& job) {
  std::lock_guard lock(job.mu);
  const int fd = job.fd.get();
  if (::ftruncate(fd, static_cast<off_t>(job.size)) != 0 || ::fdatasync(fd) != 0)
    fail("{}: cannot write: {}", job.temp_path.string(), errno_text(errno));
  const struct timespec times[2] = {job.mtime, job.mtime};
  if (::futimens(fd, times) != 0)
    fail("{}: cannot set its mtime: {}", job.temp_path.string(), errno_text(errno));
  job.fd.reset();
  if (::rename(job.temp_path.c_str(), job.final_path.c_str()) != 0)
    fail("cannot rename {} to {}: {}", job.temp_path.string(), job.final_path.string(),
         errno_text(errno));
}

}  // namespace

MaterializeResult materialize(const Tree& tree, const stdfs::path& out,
                              const MaterializeOptions& options) {
  const plan::Plan& plan = tree.plan();
  std::set<int64_t> wanted(options.ranks.begin(), options.ranks.end());
  for (int64_t rank : wanted) {
    const bool found = std::any_of(plan.targets.begin(), plan.targets.end(),
                                   [&](const plan::TargetFile& t) { return t.rank == rank; });
    if (!found)
      fail("--ranks: the view has no rank {} (its ranks are 0 to {})", rank,
           plan.targets.empty() ? 0 : plan.targets.back().rank);
  }

  MaterializeResult result;
  std::vector<std::unique_ptr<Job>> jobs;
  std::vector<Segment> segments;
  for (size_t i = 0; i < plan.targets.size(); ++i) {
    const plan::TargetFile& target = plan.targets[i];
    if (!wanted.empty() && !wanted.contains(target.rank)) continue;
    auto job = std::make_unique<Job>();
    if (tree.encrypted()) job->mode = 0600;
    job->ino = tree.target_ino(i);
    job->size = target.file.size();
    job->mtime = tree.mtime(job->ino);
    const stdfs::path dir = out / target.dir_name();
    // What is there already must be what this writes (a FIFO or a device is not replaced).
    util::directory_if_present(dir, "output directory");
    job->final_path = dir / target.file_name();
    if (auto kind = util::wrong_kind(job->final_path, S_IFREG))
      util::refuse_kind(job->final_path, "output file", *kind, S_IFREG);
    job->temp_path = dir / fmt::format(".{}.partial", target.file_name());
    if (is_complete(*job)) {
      ++result.skipped;
      result.bytes_skipped += job->size;
      spdlog::info("{}: complete, kept", job->final_path.string());
      ::unlink(job->temp_path.c_str());  // left by a run stopped while rewriting it
      continue;
    }
    std::error_code ec;
    stdfs::create_directories(dir, ec);
    if (ec) fail("{}: cannot create the directory: {}", dir.string(), ec.message());
    const uint64_t count = std::max<uint64_t>(
        1, (job->size + kMaterializeSegmentBytes - 1) / kMaterializeSegmentBytes);
    job->segments_left = count;
    for (uint64_t k = 0; k < count; ++k)
      segments.push_back({job.get(), k * kMaterializeSegmentBytes,
                          std::min(job->size, (k + 1) * kMaterializeSegmentBytes)});
    result.bytes_written += job->size;
    jobs.push_back(std::move(job));
  }
  result.written = jobs.size();
  if (options.on_start) options.on_start(result.bytes_written, jobs.size());

  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mu;
  const auto worker = [&] {
    std::unique_ptr<char[]> buffer(new char[kMaterializeBufferBytes]);
    for (size_t k; !failed.load() && (k = next.fetch_add(1)) < segments.size();) {
      const Segment& segment = segments[k];
      Job& job = *segment.job;
      try {
        const int fd = open_temp(job);
        for (uint64_t off = segment.begin; off < segment.end && !failed.load();) {
          const size_t want =
              static_cast<size_t>(std::min<uint64_t>(kMaterializeBufferBytes, segment.end - off));
          const ReadResult r = tree.read_into(job.ino, off, std::span<char>(buffer.get(), want));
          if (!r.ok())
            fail("{}: reading byte {} of the view failed: {} (see the line above)",
                 job.final_path.string(), off, errno_text(r.error()));
          const size_t got = r.bytes();
          if (got != want)
            fail("{}: the view ended at byte {}, before its size {}", job.final_path.string(),
                 off + got, job.size);
          write_at(fd, job, buffer.get(), got, off);
          off += got;
          if (options.on_bytes) options.on_bytes(got);
        }
        if (failed.load()) break;
        if (job.segments_left.fetch_sub(1) == 1) {
          complete(job);
          if (options.on_file) options.on_file();
        }
      } catch (...) {
        std::lock_guard lock(error_mu);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  {
    std::vector<std::jthread> helpers;
    const size_t threads = std::min<size_t>(std::max(1u, options.jobs), segments.size());
    for (size_t i = 1; i < threads; ++i) helpers.emplace_back(worker);
    if (!segments.empty()) worker();
  }
  if (error) {
    // A half-written temporary file is only clutter: the next run truncates it anyway.
    for (const auto& job : jobs) {
      if (job->fd) ::unlink(job->temp_path.c_str());
    }
    std::rethrow_exception(error);
  }
  return result;
}

}  // namespace ckptfs::fs
