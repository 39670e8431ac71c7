// Progress of a long command on stderr: a bar redrawn in place (bytes, rate, ETA) when stderr is
// a terminal, a plain line every few seconds otherwise (logs, CI), nothing with --quiet. Both
// end with one summary line. advance() and item_done() are safe from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace ckptfs::cli {

class Progress {
 public:
  enum class Mode { kQuiet, kPlain, kBar };
  // kBar if stderr is a terminal, else kPlain; kQuiet if `quiet`.
  static Mode mode_for(bool quiet);

  // `what` starts every line ("materialize"); `unit` names the items ("files").
  Progress(std::string what, std::string unit, Mode mode,
           std::chrono::milliseconds plain_every = std::chrono::seconds(5));
  ~Progress();  // finish() if not done yet
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Sets the totals and starts the clock and the reporting thread.
  void start(uint64_t total_bytes, uint64_t total_items);
  void advance(uint64_t bytes) { done_bytes_.fetch_add(bytes, std::memory_order_relaxed); }
  void item_done() { done_items_.fetch_add(1, std::memory_order_relaxed); }
  // Stops reporting and prints the summary line (if started), with `note` appended.
  void finish(const std::string& note = {});

 private:
  std::string line(bool final) const;
  void run();

  std::string what_, unit_;
  Mode mode_;
  std::chrono::milliseconds plain_every_;
  uint64_t total_bytes_ = 0, total_items_ = 0;
  std::atomic<uint64_t> done_bytes_{0}, done_items_{0};
  std::chrono::steady_clock::time_point started_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false, finished_ = false, started_flag_ = false;
  size_t last_width_ = 0;
  std::thread thread_;
};

// "1.5 GiB", "380 KiB", "12 B".
std::string human_bytes(double bytes);

}  // namespace ckptfs::cli
