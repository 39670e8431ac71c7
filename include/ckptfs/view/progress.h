// Progress of a long command on stderr: a bar redrawn in place when stderr is a terminal, a
// plain line every few seconds otherwise (logs, CI), nothing with --quiet. Both end with one
// summary line. Counted in bytes and items (materialize, verify) or in items alone (scanning,
// planning), optionally with a second count ("tensors"). advance(), item_done() and add_also()
// are safe from any thread; the rest is for the thread that owns the Progress.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace ckptfs::view {

class Progress {
 public:
  enum class Mode { kQuiet, kPlain, kBar };
  // kBar if stderr is a terminal, else kPlain; kQuiet if `quiet`.
  static Mode mode_for(bool quiet);
  // The environment variable that, set to a number of milliseconds, replaces every plain-line
  // interval (and the one-second wait of a step that may be quick): tests see lines without a
  // slow input.
  static constexpr char kIntervalVariable[] = "CKPTFS_PROGRESS_MS";

  // `what` starts every line ("materialize"); `unit` names the items ("files").
  Progress(std::string what, std::string unit, Mode mode,
           std::chrono::milliseconds plain_every = std::chrono::seconds(5));
  ~Progress();  // finish() if not done yet
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // A second count shown after the items ("12000 tensors"), with its rate. Before start().
  void also_count(std::string unit) { also_unit_ = std::move(unit); }
  // For a step that is usually quick: nothing at all (not even the summary) unless it is still
  // running after one second (or the interval set by kIntervalVariable). Before start().
  void only_if_slow() { only_if_slow_ = true; }

  // Sets the totals and starts the clock and the reporting thread.
  void start(uint64_t total_bytes, uint64_t total_items);
  // The same for a count of items without bytes.
  void start_items(uint64_t total_items);
  void advance(uint64_t bytes) { done_bytes_.fetch_add(bytes, std::memory_order_relaxed); }
  void item_done() { done_items_.fetch_add(1, std::memory_order_relaxed); }
  void add_also(uint64_t n) { done_also_.fetch_add(n, std::memory_order_relaxed); }
  // Stops reporting and prints the summary line (if started and shown), with `note` appended.
  void finish(const std::string& note = {});

 private:
  std::string line(bool final) const;
  std::string counts(double fraction, double seconds) const;
  void run();

  std::string what_, unit_, also_unit_;
  Mode mode_;
  std::chrono::milliseconds plain_every_;
  std::chrono::milliseconds first_after_{0};
  bool only_if_slow_ = false, with_bytes_ = true;
  uint64_t total_bytes_ = 0, total_items_ = 0;
  std::atomic<uint64_t> done_bytes_{0}, done_items_{0}, done_also_{0};
  std::chrono::steady_clock::time_point started_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false, finished_ = false, started_flag_ = false, shown_ = false;
  size_t last_width_ = 0;
  std::thread thread_;
};

// "1.5 GiB", "380 KiB", "12 B".
std::string human_bytes(double bytes);

}  // namespace ckptfs::view
