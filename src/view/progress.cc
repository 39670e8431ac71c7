#include "ckptfs/view/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace ckptfs::view {

std::string human_bytes(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  size_t unit = 0;
  while (bytes >= 1024 && unit + 1 < std::size(kUnits)) {
    bytes /= 1024;
    ++unit;
  }
  return unit == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.1f} {}", bytes, kUnits[unit]);
}

namespace {

std::string duration_text(double seconds) {
  if (seconds < 60) return fmt::format("{:.0f}s", seconds);
  const auto s = static_cast<uint64_t>(seconds);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m", s / 3600, s / 60 % 60);
}

std::string rate_text(double per_second) {
  return per_second >= 100 ? fmt::format("{:.0f}", per_second) : fmt::format("{:.1f}", per_second);
}

// kIntervalVariable, if set to a positive number of milliseconds.
std::chrono::milliseconds interval_override() {
  const char* value = std::getenv(Progress::kIntervalVariable);
  if (value == nullptr) return std::chrono::milliseconds(0);
  char* end = nullptr;
  const long ms = std::strtol(value, &end, 10);
  return *end == '\0' && ms > 0 ? std::chrono::milliseconds(ms) : std::chrono::milliseconds(0);
}

}  // namespace

Progress::Mode Progress::mode_for(bool quiet) {
  if (quiet) return Mode::kQuiet;
  return ::isatty(STDERR_FILENO) ? Mode::kBar : Mode::kPlain;
}

Progress::Progress(std::string what, std::string unit, Mode mode,
                   std::chrono::milliseconds plain_every)
    : what_(std::move(what)), unit_(std::move(unit)), mode_(mode), plain_every_(plain_every) {
  if (const auto every = interval_override(); every.count() > 0) plain_every_ = every;
}

Progress::~Progress() { finish(); }

void Progress::start(uint64_t total_bytes, uint64_t total_items) {
  total_bytes_ = total_bytes;
  total_items_ = total_items;
  started_ = std::chrono::steady_clock::now();
  started_flag_ = true;
  const auto override = interval_override();
  first_after_ = mode_ == Mode::kBar ? std::chrono::milliseconds(200) : plain_every_;
  if (only_if_slow_) first_after_ = override.count() > 0 ? override : std::chrono::seconds(1);
  if (mode_ != Mode::kQuiet) thread_ = std::thread([this] { run(); });
}

void Progress::start_items(uint64_t total_items) {
  with_bytes_ = false;
  start(0, total_items);
}

std::string Progress::counts(double fraction, double seconds) const {
  const uint64_t items = done_items_.load(std::memory_order_relaxed);
  const auto per_second = [&](double n) { return seconds > 0 ? n / seconds : 0.0; };
  std::string out;
  if (with_bytes_) {
    const uint64_t bytes = done_bytes_.load(std::memory_order_relaxed);
    out = fmt::format("{} of {} ({:.0f}%), {} of {} {}, {}/s",
                      human_bytes(static_cast<double>(bytes)),
                      human_bytes(static_cast<double>(total_bytes_)), fraction * 100, items,
                      total_items_, unit_, human_bytes(per_second(static_cast<double>(bytes))));
  } else {
    out = fmt::format("{} of {} {} ({:.0f}%)", items, total_items_, unit_, fraction * 100);
    if (also_unit_.empty())
      out += fmt::format(", {} {}/s", rate_text(per_second(static_cast<double>(items))), unit_);
  }
  if (!also_unit_.empty()) {
    const uint64_t also = done_also_.load(std::memory_order_relaxed);
    out += fmt::format(", {} {}, {} {}/s", also, also_unit_,
                       rate_text(per_second(static_cast<double>(also))), also_unit_);
  }
  return out;
}

std::string Progress::line(bool final) const {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  const double done = static_cast<double>(with_bytes_ ? done_bytes_.load() : done_items_.load());
  const double total = static_cast<double>(with_bytes_ ? total_bytes_ : total_items_);
  const double fraction = total == 0 ? 1.0 : std::min(1.0, done / total);
  std::string out;
  if (mode_ == Mode::kBar && !final) {
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(fraction * kWidth);
    out = fmt::format("{}: [{}{}] ", what_, std::string(static_cast<size_t>(filled), '#'),
                      std::string(static_cast<size_t>(kWidth - filled), '.'));
  } else {
    out = fmt::format("{}: ", what_);
  }
  out += counts(fraction, seconds);
  if (final) {
    out += fmt::format(", {:.1f}s", seconds);
  } else if (done > 0 && done < total) {
    out += fmt::format(", ETA {}", duration_text(seconds * (total - done) / done));
  }
  return out;
}

void Progress::run() {
  const auto every = mode_ == Mode::kBar ? std::chrono::milliseconds(200) : plain_every_;
  std::unique_lock lock(mu_);
  if (wake_.wait_for(lock, first_after_, [this] { return stop_; })) return;
  do {
    const std::string text = line(false);
    if (mode_ == Mode::kBar) {
      const size_t pad = last_width_ > text.size() ? last_width_ - text.size() : 0;
      std::fprintf(stderr, "\r%s%s", text.c_str(), std::string(pad, ' ').c_str());
      last_width_ = text.size();
    } else {
      std::fprintf(stderr, "%s\n", text.c_str());
    }
    std::fflush(stderr);
    shown_ = true;
  } while (!wake_.wait_for(lock, every, [this] { return stop_; }));
}

void Progress::finish(const std::string& note) {
  {
    std::lock_guard lock(mu_);
    if (finished_) return;
    finished_ = true;
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (mode_ == Mode::kQuiet || !started_flag_ || (only_if_slow_ && !shown_)) return;
  std::string text = line(true);
  if (!note.empty()) text += "; " + note;
  if (mode_ == Mode::kBar) {
    const size_t pad = last_width_ > text.size() ? last_width_ - text.size() : 0;
    std::fprintf(stderr, "\r%s%s\n", text.c_str(), std::string(pad, ' ').c_str());
  } else {
    std::fprintf(stderr, "%s\n", text.c_str());
  }
  std::fflush(stderr);
}

}  // namespace ckptfs::view
