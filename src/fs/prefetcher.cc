#include "prefetcher.h"

#include <pthread.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <exception>
#include <list>
#include <optional>
#include <span>
#include <utility>

#include "scratch.h"

namespace ckptfs::fs {

namespace {

// One block of the file read ahead.
struct Slot {
  enum class State { kFree, kQueued, kRunning, kReady, kFailed };
  State state = State::kFree;
  // Bumped whenever the slot is given another block or taken back, so a queued job for the
  // old one finds it is no longer wanted.
  uint64_t generation = 0;
  uint64_t off = 0;
  size_t got = 0;                 // the block's length (clipped at end of file)
  ReplyBuffer data;               // at least `got` bytes once filled; the filler's while kRunning
  std::vector<uint32_t> sources;  // the sources `data` was read from, once filled
  // Counted against the budget: from when the slot is queued until its buffer is freed. A free
  // slot may stay charged, holding the buffer of a reply it was swapped with for the next block.
  bool charged = false;
  uint64_t end() const { return off + got; }
};

}  // namespace

class Prefetcher::Budget {
 public:
  explicit Budget(size_t max_blocks) : max_(max_blocks) {}

  size_t max() const { return max_; }
  size_t held() const {
    std::lock_guard lock(mutex_);
    return held_;
  }
  // Charges one more block to `s` (under its lock); false if all are held.
  bool take(Stream& s);
  // Gives `n` of the blocks charged to `s` back (under its lock, or as it goes).
  void give(Stream& s, size_t n);
  // Gives every block of `s` back, as it goes.
  void leave(Stream& s);
  // Marks `s` (under its lock) as the stream that planned last, so it is taken back from last.
  void touch(Stream& s);
  // The stream holding blocks that planned least recently, other than `self`; null if none.
  // Moved to the back, so a caller that cannot take its blocks (all being filled) moves on.
  std::shared_ptr<Stream> least_recent(const Stream& self);

 private:
  const size_t max_;
  mutable std::mutex mutex_;
  size_t held_ = 0;
  // The streams holding blocks, least recently planned first. Weak: a stream that goes gives
  // its blocks back and leaves the list in its destructor.
  std::list<std::weak_ptr<Stream>> lru_;
};

class Prefetcher::Stream : public std::enable_shared_from_this<Stream> {
 public:
  Stream(uint64_t inode, uint64_t file_size, std::shared_ptr<Budget> blocks)
      : ino(inode), size(file_size), budget(std::move(blocks)) {}
  ~Stream() { budget->leave(*this); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  const uint64_t ino;
  const uint64_t size;
  std::mutex mutex;
  std::condition_variable done;  // a running slot became ready or failed
  uint64_t next = 0;             // where the previous read ended
  // The block holding the reader's position and the two after it. A third block ahead (against
  // two) measured +9-11% for one reader, contiguous and strided: a deeper queue rides out a
  // helper that is scheduled late.
  std::array<Slot, 3> slots;
  // Slots queued by the last read, handed to the helpers by start(): (slot, generation).
  std::vector<std::pair<size_t, uint64_t>> planned;
  // Gathers of this stream that helpers are running (guarded by the prefetcher's mutex_).
  unsigned gathering = 0;
  // Reads left before the stream counts as keeping up again; set when a read found its block
  // still being gathered. While it is above zero, helpers gather its blocks in parallel.
  std::atomic<unsigned> lagging{0};
  // The last read planned fewer blocks than it wanted, as the budget was spent.
  bool short_of_blocks = false;

  const std::shared_ptr<Budget> budget;
  // Guarded by the budget's mutex: the blocks charged to this stream, and its place in the
  // budget's list while that is above zero.
  size_t charged = 0;
  std::list<std::weak_ptr<Stream>>::iterator lru_at;
};

bool Prefetcher::Budget::take(Stream& s) {
  std::lock_guard lock(mutex_);
  if (held_ >= max_) return false;
  ++held_;
  if (s.charged++ == 0) s.lru_at = lru_.insert(lru_.end(), s.weak_from_this());
  return true;
}

void Prefetcher::Budget::give(Stream& s, size_t n) {
  if (n == 0) return;
  std::lock_guard lock(mutex_);
  held_ -= n;
  s.charged -= n;
  if (s.charged == 0) lru_.erase(s.lru_at);
}

void Prefetcher::Budget::leave(Stream& s) {
  std::lock_guard lock(mutex_);
  if (s.charged == 0) return;
  held_ -= s.charged;
  s.charged = 0;
  lru_.erase(s.lru_at);
}

void Prefetcher::Budget::touch(Stream& s) {
  std::lock_guard lock(mutex_);
  if (s.charged != 0) lru_.splice(lru_.end(), lru_, s.lru_at);
}

std::shared_ptr<Prefetcher::Stream> Prefetcher::Budget::least_recent(const Stream& self) {
  std::lock_guard lock(mutex_);
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    // Null: going, and its destructor gives its blocks back. Only `self` (whose caller holds
    // it) is let go here, never a last reference: its destructor would take this mutex.
    std::shared_ptr<Stream> s = it->lock();
    if (s == nullptr || s.get() == &self) continue;
    lru_.splice(lru_.end(), lru_, it);
    return s;
  }
  return nullptr;
}

namespace {

// The queued, running or ready slot whose block holds byte `pos`, or null. Under the lock.
Slot* holding(Prefetcher::Stream& s, uint64_t pos) {
  for (Slot& slot : s.slots)
    if (slot.state != Slot::State::kFree && slot.state != Slot::State::kFailed && slot.off <= pos &&
        pos < slot.end())
      return &slot;
  return nullptr;
}

}  // namespace

Prefetcher::Prefetcher(const Tree& tree, unsigned helpers, size_t block_bytes,
                       const SpliceStage* splice, size_t max_bytes)
    : tree_(tree),
      block_bytes_(std::max<size_t>(block_bytes, 4096)),
      splice_(splice),
      budget_(std::make_shared<Budget>(max_bytes / block_bytes_)) {
  helpers = std::max(helpers, 1u);
  helpers_.reserve(helpers);
  try {
    for (unsigned i = 0; i < helpers; ++i) {
      helpers_.emplace_back([this] { helper_loop(); });
      // Named so that top -H and perf tell them from the FUSE worker threads.
      pthread_setname_np(helpers_.back().native_handle(), "ckptfs-ahead");
    }
  } catch (...) {
    stop();  // the helpers already running use this object: join them before it unwinds
    throw;
  }
}

Prefetcher::~Prefetcher() { stop(); }

size_t Prefetcher::max_blocks() const { return budget_->max(); }
size_t Prefetcher::blocks_held() const { return budget_->held(); }

void Prefetcher::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    jobs_.clear();
  }
  wake_.notify_all();
  for (std::thread& t : helpers_) t.join();
  helpers_.clear();
}

std::shared_ptr<Prefetcher::Stream> Prefetcher::open(uint64_t ino) const {
  const plan::VirtualFile* file = tree_.file(ino);
  if (file == nullptr) return nullptr;
  return std::make_shared<Stream>(ino, file->size(), budget_);
}

namespace {

// The slots holding [off, off + want): one, or two that follow each other. Under the lock.
struct Covering {
  std::array<Slot*, 2> parts{};
  size_t n = 0;
  std::span<Slot* const> slots() const { return {parts.data(), n}; }
};

std::optional<Covering> covering(Prefetcher::Stream& s, uint64_t off, uint64_t want) {
  Covering c;
  for (uint64_t pos = off; pos < off + want && c.n < c.parts.size();) {
    Slot* slot = holding(s, pos);
    if (slot == nullptr) break;
    c.parts[c.n++] = slot;
    pos = slot->end();
  }
  if (c.n == 0 || c.parts[c.n - 1]->end() < off + want) return std::nullopt;
  return c;
}

// Serves [off, off + want) from the ready blocks of `c` into `buf`, and frees the blocks read
// to their end. Under the lock.
void copy_out(const Covering& c, uint64_t off, uint64_t want, ReplyBuffer& buf) {
  Slot& first = *c.parts[0];
  if (c.n == 1 && first.off == off && first.got == want) {
    buf.swap(first.data);  // the whole block: hand it over instead of copying
    first.state = Slot::State::kFree;
    return;
  }
  buf.resize(want);
  for (Slot* slot : c.slots()) {
    const uint64_t from = std::max(off, slot->off);
    const uint64_t to = std::min(off + want, slot->end());
    std::memcpy(buf.data() + (from - off), slot->data.data() + (from - slot->off), to - from);
    if (to == slot->end()) slot->state = Slot::State::kFree;  // read to its end
  }
}

}  // namespace

ReadResult Prefetcher::read(Stream& s, uint64_t off, size_t len, ReplyBuffer& buf) {
  // The sources of the blocks a hit is served from.
  std::vector<uint32_t>& served_from = detail::scratch().served_from;
  const Taken taken = take_ready(s, off, len, buf, served_from);
  ReadResult result = ReadResult::done(taken.bytes);
  if (taken.hit) {
    // The blocks were gathered a moment ago: the sources they were read from must still be
    // what was mounted, or they may hold a mix of old and new bytes.
    if (int err = tree_.check_sources(s.ino, std::span<const uint32_t>(served_from)))
      return ReadResult::failed(err);
    hits_.fetch_add(1, std::memory_order_relaxed);
  } else {
    buf.resize(len);
    result = tree_.read_into(s.ino, off, std::span<char>(buf.data(), len));
    if (!result.ok()) return result;
  }
  note_read(s, off, result.bytes(), taken.sequential);
  return result;
}

Prefetcher::Taken Prefetcher::take_ready(Stream& s, uint64_t off, size_t len, ReplyBuffer& buf,
                                         std::vector<uint32_t>& served_from) {
  using State = Slot::State;
  served_from.clear();
  Taken taken;
  for (;;) {
    std::unique_lock lock(s.mutex);
    taken.sequential = off == s.next;
    const uint64_t want = std::min<uint64_t>(len, s.size > off ? s.size - off : 0);
    if (want == 0) return taken;
    const std::optional<Covering> c = covering(s, off, want);
    if (!c) return taken;
    const std::span<Slot* const> parts = c->slots();
    if (auto queued = std::find_if(parts.begin(), parts.end(),
                                   [](const Slot* p) { return p->state == State::kQueued; });
        queued != parts.end()) {
      // No helper has started it: gathering it here is sooner than waiting for one.
      s.lagging.store(kLagReads, std::memory_order_relaxed);
      const size_t index = static_cast<size_t>(*queued - s.slots.data());
      const uint64_t generation = (*queued)->generation;
      lock.unlock();
      fill(s, index, generation);
      continue;
    }
    if (std::any_of(parts.begin(), parts.end(),
                    [](const Slot* p) { return p->state == State::kRunning; })) {
      s.lagging.store(kLagReads, std::memory_order_relaxed);
      s.done.wait(lock);
      continue;  // look again: the slots may have changed meanwhile
    }
    for (const Slot* slot : parts)
      served_from.insert(served_from.end(), slot->sources.begin(), slot->sources.end());
    copy_out(*c, off, want, buf);
    if (unsigned lag = s.lagging.load(std::memory_order_relaxed); lag > 0)
      s.lagging.store(lag - 1, std::memory_order_relaxed);
    taken.hit = true;
    taken.bytes = want;
    return taken;
  }
}

void Prefetcher::note_read(Stream& s, uint64_t off, size_t bytes, bool sequential) {
  std::lock_guard lock(s.mutex);
  s.next = off + bytes;
  if (sequential && !others_reading(s)) plan_ahead(s, off + bytes, s.planned);
}

void Prefetcher::start(Stream& s) noexcept {
  std::vector<std::pair<size_t, uint64_t>>& planned = detail::scratch().planned;
  size_t short_by = 0;
  {
    std::lock_guard lock(s.mutex);
    if (std::exchange(s.short_of_blocks, false))
      short_by = static_cast<size_t>(std::count_if(s.slots.begin(), s.slots.end(),
                                                   [](const Slot& slot) { return !slot.charged; }));
    planned.swap(s.planned);
  }
  if (short_by != 0) {
    // Past the budget: the blocks of the streams read least recently (files left open
    // half-read) go to this one, which plans again from where its reader is.
    take_back(s, short_by);
    std::lock_guard lock(s.mutex);
    try {
      plan_ahead(s, s.next, planned);
    } catch (const std::exception& e) {
      spdlog::warn("read-ahead of inode {}: {}", s.ino, e.what());
    }
    s.short_of_blocks = false;  // once per read: the next read may try again
  }
  if (planned.empty()) return;
  const std::shared_ptr<Stream> self = s.shared_from_this();
  try {
    std::lock_guard lock(mutex_);
    if (!stopping_)
      for (const auto& [slot, generation] : planned) jobs_.push_back({self, slot, generation});
  } catch (const std::exception& e) {
    // Out of memory: the blocks without a job stay queued, and their READs gather for
    // themselves.
    spdlog::warn("read-ahead of inode {}: {}", s.ino, e.what());
  }
  if (planned.size() == 1)
    wake_.notify_one();
  else
    wake_.notify_all();
  planned.clear();
}

void Prefetcher::take_back(const Stream& s, size_t want) {
  using State = Slot::State;
  if (budget_->max() == 0) return;
  size_t freed = 0;
  // Bounded: a stream whose blocks are all being filled is passed over (it moves to the back).
  for (size_t tries = 0; freed < want && tries < 4; ++tries) {
    const std::shared_ptr<Stream> other = budget_->least_recent(s);
    if (other == nullptr) break;
    std::lock_guard lock(other->mutex);
    size_t n = 0;
    for (Slot& slot : other->slots) {
      if (!slot.charged || slot.state == State::kRunning) continue;
      // A job or a READ still holding this slot's generation finds it is no longer wanted; the
      // other stream's next READ gathers for itself.
      slot.state = State::kFree;
      ++slot.generation;
      ReplyBuffer().swap(slot.data);
      slot.charged = false;
      ++n;
    }
    budget_->give(*other, n);
    freed += n;
  }
  taken_back_.fetch_add(freed, std::memory_order_relaxed);
}

void Prefetcher::passed(Stream& s, uint64_t off, size_t got, bool plan) noexcept {
  std::lock_guard lock(s.mutex);
  const bool sequential = off == s.next;
  s.next = off + got;
  try {
    // Called whether or not it plans: a READ spliced for another reader must still count as
    // that reader's, or a gathered READ of this one would think it reads alone.
    const bool alone = !others_reading(s);
    if (plan && sequential && alone) plan_ahead(s, off + got, s.planned);
  } catch (const std::exception& e) {
    spdlog::warn("read-ahead of inode {}: {}", s.ino, e.what());
  }
}

void Prefetcher::plan_ahead(Stream& s, uint64_t at,
                            std::vector<std::pair<size_t, uint64_t>>& queued) {
  using State = Slot::State;
  // The chain of blocks from the reader's position on: the one holding `at`, then the ones
  // right after it. Slots outside the chain hold what the reader has passed or jumped away
  // from; they are taken back, unless a filler is writing them. Then free slots extend the
  // chain until every slot is in it.
  std::array<bool, std::tuple_size_v<decltype(s.slots)>> in_chain{};
  uint64_t pos = at;
  size_t depth = 0;
  for (; depth < s.slots.size() && pos < s.size; ++depth) {
    Slot* slot = holding(s, pos);
    if (slot == nullptr) break;
    in_chain[static_cast<size_t>(slot - s.slots.data())] = true;
    pos = slot->end();
  }
  for (size_t i = 0; i < s.slots.size(); ++i) {
    Slot& slot = s.slots[i];
    if (in_chain[i] || slot.state == State::kRunning || slot.state == State::kFree) continue;
    slot.state = State::kFree;
    ++slot.generation;
  }
  for (; depth < s.slots.size() && pos < s.size; ++depth) {
    if (Slot* slot = holding(s, pos)) {  // a block still being written, kept above
      pos = slot->end();
      continue;
    }
    // A free slot that still holds a buffer first: it is charged already.
    Slot* free = nullptr;
    for (Slot& slot : s.slots)
      if (slot.state == State::kFree && (free == nullptr || (slot.charged && !free->charged)))
        free = &slot;
    if (free == nullptr) break;
    const size_t length = static_cast<size_t>(std::min<uint64_t>(block_bytes_, s.size - pos));
    if (splice_ != nullptr && splice_->would_stage(s.ino, pos, length)) break;
    if (!free->charged) {
      if (!s.budget->take(s)) {
        s.short_of_blocks = true;
        break;
      }
      free->charged = true;
    }
    free->state = State::kQueued;
    free->off = pos;
    free->got = length;
    queued.emplace_back(static_cast<size_t>(free - s.slots.data()), ++free->generation);
    pos = free->end();
  }
  // A slot left free now has no block before the end of the file: its buffer goes, so a file
  // read to its end and kept open holds no memory.
  size_t freed = 0;
  for (Slot& slot : s.slots) {
    if (slot.state != State::kFree) continue;
    ReplyBuffer().swap(slot.data);
    if (std::exchange(slot.charged, false)) ++freed;
  }
  s.budget->give(s, freed);
  s.budget->touch(s);
}

void Prefetcher::helper_loop() {
  // One gather at a time per stream while its reader finds blocks ready: a second helper would
  // only take CPU from the reader and the worker answering it (contiguous reads ran 6-13%
  // slower with two). A stream whose reader had to wait is gather-bound (short strided runs),
  // and then every helper may work on it.
  auto runnable = [&]() -> std::deque<Job>::iterator {
    return std::find_if(jobs_.begin(), jobs_.end(), [](const Job& job) {
      return job.stream->gathering == 0 || job.stream->lagging.load(std::memory_order_relaxed) > 0;
    });
  };
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mutex_);
      // The job is picked once, by the wait itself: asking again could find none, as a
      // stream's `lagging` counts down under the stream's lock, not this one.
      std::deque<Job>::iterator it;
      wake_.wait(lock, [&] { return stopping_ || (it = runnable()) != jobs_.end(); });
      if (stopping_) return;
      job = std::move(*it);
      jobs_.erase(it);
      ++job.stream->gathering;
    }
    fill(*job.stream, job.slot, job.generation);
    bool queued = false;
    {
      std::lock_guard lock(mutex_);
      --job.stream->gathering;
      queued = !jobs_.empty();
    }
    if (queued) wake_.notify_one();  // a job of this stream may have been waiting for this one
  }
}

void Prefetcher::fill(Stream& s, size_t index, uint64_t generation) {
  using State = Slot::State;
  Slot& slot = s.slots[index];
  uint64_t off = 0;
  size_t want = 0;
  {
    std::lock_guard lock(s.mutex);
    if (slot.state != State::kQueued || slot.generation != generation) return;
    slot.state = State::kRunning;
    off = slot.off;
    want = slot.got;
  }
  ReadResult result = ReadResult::failed(EIO);
  // Nothing may escape a helper thread (it would end the daemon): a failure (out of memory)
  // fails the block, and the READ of that block gathers for itself.
  try {
    // Allocated (and first touched) here, by the filler, not on a reader's path.
    if (slot.data.capacity() == 0) slot.data = make_reply_buffer();
    if (slot.data.size() < want) slot.data.resize(want);
    result = tree_.read_into(s.ino, off, std::span<char>(slot.data.data(), want), &slot.sources);
  } catch (const std::exception& e) {
    spdlog::error("read-ahead of inode {} at {}: {}", s.ino, off, e.what());
  }
  // The size is fixed for the mount: a short block cannot happen.
  const bool filled = result.ok() && result.bytes() == want;
  {
    std::lock_guard lock(s.mutex);
    slot.state = filled ? State::kReady : State::kFailed;
  }
  s.done.notify_all();
  gathered_ahead_.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace ckptfs::fs
