#include "source_leases.h"

#include <fcntl.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <ctime>
#include <fstream>

namespace ckptfs::fs {

namespace {

// Seconds a writer waits for a lease to be let go, or -1 if unknown.
int lease_break_seconds() {
  std::ifstream knob("/proc/sys/fs/lease-break-time");
  int seconds = -1;
  knob >> seconds;
  return knob ? seconds : -1;
}

sigset_t notice_signals(int signo) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, signo);
  // The kernel falls back to SIGIO (no si_fd) when the realtime signal queue is full.
  sigaddset(&set, SIGIO);
  return set;
}

}  // namespace

SourceLeases::SourceLeases(std::vector<Source> sources)
    : sources_(std::move(sources)), words_(new std::atomic<uint32_t>[sources_.size()]) {
  for (size_t i = 0; i < sources_.size(); ++i) words_[i].store(0, std::memory_order_relaxed);
  const int seconds = lease_break_seconds();
  if (seconds < kMinBreakSeconds) {
    spdlog::info(
        "no source leased (their READs are gathered): fs.lease-break-time is {} s, below {}",
        seconds, kMinBreakSeconds);
    return;
  }
  const int signo = signo_ = SIGRTMIN + 4;
  std::future<pid_t> tid = started_.get_future();
  try {
    thread_ = std::thread([this, signo] {
      const sigset_t set = notice_signals(signo);
      ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
      started_.set_value(static_cast<pid_t>(::syscall(SYS_gettid)));
      listen(signo);
    });
  } catch (const std::exception& e) {
    spdlog::warn("no source leased (their READs are gathered): {}", e.what());
    return;
  }
  take_leases(signo, tid.get());
}

void SourceLeases::take_leases(int signo, pid_t tid) {
  size_t taken = 0, local = 0;
  std::vector<std::string> refused;
  for (size_t i = 0; i < sources_.size(); ++i) {
    const int fd = sources_[i].fd;
    if (fd < 0) continue;
    ++local;
    // Leased before the lease is taken: a notice may come at once.
    words_[i].store(kLeased, std::memory_order_release);
    const f_owner_ex owner{F_OWNER_TID, tid};
    if (::fcntl(fd, F_SETSIG, signo) != 0 || ::fcntl(fd, F_SETOWN_EX, &owner) != 0 ||
        ::fcntl(fd, F_SETLEASE, F_RDLCK) != 0) {
      const int err = errno;
      words_[i].store(0, std::memory_order_release);
      // EAGAIN: someone holds it open for writing; EACCES: another user's file; EINVAL: the file
      // system has no leases.
      refused.push_back(fmt::format("{}: {}", sources_[i].name,
                                    err == EAGAIN ? "open for writing" : std::strerror(err)));
      spdlog::debug("source {} not leased: {}", sources_[i].name, std::strerror(err));
      continue;
    }
    ++taken;
  }
  if (refused.empty()) {
    spdlog::info("{} of {} sources leased: their READs may be spliced", taken, sources_.size());
    return;
  }
  constexpr size_t kNamed = 3;
  std::string names;
  for (size_t i = 0; i < std::min(kNamed, refused.size()); ++i)
    names += (i == 0 ? "" : "; ") + refused[i];
  if (refused.size() > kNamed) names += fmt::format("; and {} more", refused.size() - kNamed);
  spdlog::info("{} of {} sources leased, {} not (their READs are gathered): {}", taken,
               sources_.size(), local - taken, names);
}

SourceLeases::~SourceLeases() {
  stop_.store(true, std::memory_order_relaxed);
  if (thread_.joinable()) {
    // Wakes it now rather than at its next tick (it takes the signal as a notice: none found).
    ::pthread_kill(thread_.native_handle(), signo_);
    thread_.join();
  }
  for (size_t i = 0; i < sources_.size(); ++i)
    if (words_[i].load(std::memory_order_relaxed) & kLeased)
      ::fcntl(sources_[i].fd, F_SETLEASE, F_UNLCK);
}

size_t SourceLeases::leased() const {
  size_t n = 0;
  for (size_t i = 0; i < sources_.size(); ++i) {
    const uint32_t w = words_[i].load(std::memory_order_relaxed);
    n += (w & kLeased) != 0 && (w & kChanging) == 0;
  }
  return n;
}

void SourceLeases::listen(int signo) {
  const sigset_t set = notice_signals(signo);
  const timespec tick{0, 100'000'000};  // how soon stop_ is seen
  while (!stop_.load(std::memory_order_relaxed)) {
    siginfo_t info;
    const int got = ::sigtimedwait(&set, &info, &tick);
    // From the kernel (si_code POLL_MSG), not our own wake-up at stop (SI_TKILL, below 0).
    if (got == signo && info.si_code > 0) {
      for (size_t i = 0; i < sources_.size(); ++i)
        if (sources_[i].fd == info.si_fd) let_go(i);
    } else if (got == SIGIO) {
      // Which lease broke is not said: each one being broken reads as F_UNLCK.
      for (size_t i = 0; i < sources_.size(); ++i)
        if ((words_[i].load(std::memory_order_acquire) & kLeased) != 0 &&
            ::fcntl(sources_[i].fd, F_GETLEASE) != F_RDLCK)
          let_go(i);
    }
  }
}

void SourceLeases::let_go(size_t i) {
  std::atomic<uint32_t>& word = words_[i];
  // From here no splice of it starts (enter() sees the flag in the same word it counts in);
  // those counted before are waited for.
  uint32_t w = word.fetch_or(kChanging, std::memory_order_acq_rel);
  if ((w & kLeased) == 0 || (w & kChanging) != 0) return;
  const uint32_t in_flight = w & kCount;
  while (((w = word.load(std::memory_order_acquire)) & kCount) != 0)
    word.wait(w, std::memory_order_acquire);
  // Counted before the writer is let in, so whoever sees the write also sees the count.
  word.fetch_and(~kLeased, std::memory_order_acq_rel);
  broken_.fetch_add(1, std::memory_order_release);
  ::fcntl(sources_[i].fd, F_SETLEASE, F_UNLCK);
  spdlog::info(
      "source {} opened for writing or truncated: lease let go after {} spliced READs in flight "
      "finished; "
      "its READs are gathered (and checked) from now on",
      sources_[i].name, in_flight);
}

bool SourceLeases::enter(uint32_t source, State& state) {
  if (source >= sources_.size()) {
    state = State::kUnleased;
    return false;
  }
  std::atomic<uint32_t>& word = words_[source];
  uint32_t w = word.load(std::memory_order_acquire);
  do {
    // Changing first: a source let go stays gathered.
    if ((w & kChanging) != 0) {
      state = State::kChanging;
      return false;
    }
    if ((w & kLeased) == 0) {
      state = State::kUnleased;
      return false;
    }
  } while (
      !word.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel, std::memory_order_acquire));
  return true;
}

void SourceLeases::leave(uint32_t source) noexcept {
  std::atomic<uint32_t>& word = words_[source];
  const uint32_t w = word.fetch_sub(1, std::memory_order_acq_rel);
  if ((w & kChanging) != 0 && (w & kCount) == 1) word.notify_all();
}

SourceLeases::State SourceLeases::Hold::take(std::span<const uint32_t> sources) {
  if (leases_ == nullptr) return State::kUnleased;
  State result = State::kLeased;
  for (uint32_t s : sources) {
    if (std::find(held_.begin(), held_.end(), s) != held_.end()) continue;
    State state = State::kLeased;
    if (leases_->enter(s, state)) {
      held_.push_back(s);
    } else if (state == State::kChanging) {
      release();
      return State::kChanging;
    } else {
      result = State::kUnleased;
    }
  }
  return result;
}

void SourceLeases::Hold::release() noexcept {
  for (uint32_t s : held_) leases_->leave(s);
  held_.clear();
}

}  // namespace ckptfs::fs
