#include "splice_stage.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <vector>

#include "ckptfs/util/eintr.h"
#include "scratch.h"

namespace ckptfs::fs {

namespace {

const uint64_t kPage = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));

// Pipe slots a run can take: a spliced run one per page it touches (one per folio, at most),
// written bytes one per page they fill.
uint64_t slots_of(const plan::Run& run) {
  if (run.mem != nullptr) return (run.length + kPage - 1) / kPage;
  return (run.offset + run.length - 1) / kPage - run.offset / kPage + 1;
}

// Slots of the pipe libfuse uses for a reply of `bytes` from one pipe buffer: it asks for
// (iov + bufs + 1) pages plus the reply, header included, and the kernel rounds a pipe up to a
// power of two pages. A pipe grown before for a larger reply has more.
uint64_t reply_pipe_slots(uint64_t bytes) {
  constexpr uint64_t kHeader = 16;  // struct fuse_out_header
  return std::bit_ceil((3 * kPage + kHeader + bytes + kPage - 1) / kPage);
}

}  // namespace

size_t StagePipe::max_slots() {
  for (size_t slots : {512, 256})
    if (StagePipe(slots).error() == 0) return slots;
  return 0;
}

StagePipe::StagePipe(size_t slots) noexcept : slots_(slots) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    error_ = errno;
    return;
  }
  read_ = UniqueFd(fds[0]);
  write_ = UniqueFd(fds[1]);
  if (::fcntl(write_.get(), F_SETPIPE_SZ, static_cast<int>(slots * kPage)) < 0) error_ = errno;
}

size_t StagePipe::pending() const {
  int bytes = 0;
  if (::ioctl(read_.get(), FIONREAD, &bytes) != 0) return 1;  // unknown: treat as not empty
  return static_cast<size_t>(bytes);
}

bool SpliceStage::worth_it(std::span<const plan::Run> runs, uint64_t bytes, size_t slots) {
  if (runs.empty() || runs.size() > kMaxRuns || bytes < kMinRunBytes ||
      bytes / runs.size() < kMinRunBytes)
    return false;
  uint64_t used = 1;  // libfuse's reply header goes first
  for (const plan::Run& run : runs) used += slots_of(run);
  return used <= slots && used <= reply_pipe_slots(bytes);
}

bool SpliceStage::would_stage(uint64_t ino, uint64_t off, size_t len) const {
  const plan::VirtualFile* file = tree_.file(ino);
  if (file == nullptr) return false;
  std::vector<plan::Run>& runs = detail::scratch().splice_runs;
  runs.clear();
  // A READ of more runs than kMaxRuns is not spliced: no need to map them all (a READ of a
  // row-parallel tensor's short rows has thousands).
  const uint64_t covered = file->map(off, len, runs, kMaxRuns);
  return worth_it(runs, covered, slots_);
}

ReadResult SpliceStage::stage(uint64_t ino, uint64_t off, size_t len, const StagePipe& pipe,
                              SourceLeases::Hold& hold, bool unleased_ok) const {
  const plan::VirtualFile* file = tree_.file(ino);
  if (file == nullptr) return ReadResult::declined();
  detail::Scratch& scratch = detail::scratch();
  std::vector<plan::Run>& runs = scratch.splice_runs;
  runs.clear();
  const uint64_t covered = file->map(off, len, runs, kMaxRuns);
  if (!worth_it(runs, covered, std::min(slots_, pipe.slots()))) return ReadResult::declined();
  // Held before the first page goes into the pipe: no writer gets a source until the reply is
  // copied out of it.
  std::vector<uint32_t>& read = scratch.splice_sources;
  read.clear();
  for (const plan::Run& run : runs)
    if (run.mem == nullptr && std::find(read.begin(), read.end(), run.source) == read.end())
      read.push_back(run.source);
  const SourceLeases::State held = hold.take(read);
  if (held == SourceLeases::State::kChanging ||
      (held == SourceLeases::State::kUnleased && !unleased_ok))
    return ReadResult::declined();
  const auto& sources = tree_.plan().sources;
  for (const plan::Run& run : runs) {
    uint64_t done = 0;
    while (done < run.length) {
      ssize_t n;
      if (run.mem != nullptr) {
        n = retry_eintr(
            [&] { return ::write(pipe.write_end(), run.mem + done, run.length - done); });
      } else {
        if (run.source >= sources.size()) {
          spdlog::error("read mapped to source #{}, but the plan has {} sources", run.source,
                        sources.size());
          return ReadResult::failed(EIO);
        }
        loff_t at = static_cast<loff_t>(run.offset + done);
        // Never blocks: a full pipe answers EAGAIN (the slot count above was not enough).
        n = retry_eintr([&] {
          return ::splice(sources[run.source].file.fd.get(), &at, pipe.write_end(), nullptr,
                          run.length - done, SPLICE_F_NONBLOCK);
        });
      }
      // A full pipe, or a source file system that cannot splice: gather instead.
      if (n < 0 && (errno == EAGAIN || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP))
        return ReadResult::declined();
      if (n <= 0) {
        // The file ends before the run does (it shrank), or cannot be read: its fingerprint
        // check names it.
        const int err = n < 0 ? errno : 0;
        if (tree_.check_sources(runs) == 0)
          spdlog::error("source #{} ends or fails before byte {} ({})", run.source,
                        run.offset + run.length, err != 0 ? std::strerror(err) : "end of file");
        return ReadResult::failed(EIO);
      }
      done += static_cast<uint64_t>(n);
    }
  }
  // After the splice, as after a copy: a source found unchanged now was not written before its
  // pages went into the pipe (nor before its lease was taken). From now until the kernel copies
  // the reply out, the held leases keep writers out; only an unleased source (-o splice=always)
  // could be written in place meanwhile, and that would show: the pipe holds the cached pages,
  // not a copy of them.
  if (tree_.check_sources(runs) != 0) return ReadResult::failed(EIO);
  return ReadResult::done(covered);
}

}  // namespace ckptfs::fs
