#include "service.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <fstream>
#include <thread>
#include <utility>

#include "ckptfs/remote/objects.h"
#include "memory_limit.h"
#include "scratch.h"

namespace ckptfs::fs {

namespace {

// At most this many read-ahead helpers, however many CPUs: each one only runs while a reader
// waits on a READ.
constexpr unsigned kMaxHelpers = 4;
// The largest READ when replies may be spliced.
constexpr unsigned kSpliceReadBytes = 512 << 10;
// A pipe slot holds a page.
const size_t kPageKiB = static_cast<size_t>(::sysconf(_SC_PAGESIZE)) / 1024;

bool read_only(int flags) { return (flags & O_ACCMODE) == O_RDONLY && (flags & O_TRUNC) == 0; }

}  // namespace

void MappedFiles::note(uint64_t ino) {
  std::lock_guard lock(mutex_);
  if (inos_.insert(ino).second)
    spdlog::debug("inode {} is mapped: opened with keep_cache from now on", ino);
}

bool MappedFiles::has(uint64_t ino) const {
  std::lock_guard lock(mutex_);
  return inos_.count(ino) != 0;
}

ReplyBuffer BufferPool::take() {
  std::lock_guard lock(mutex_);
  if (spare_.empty()) return make_reply_buffer();
  ReplyBuffer buffer = std::move(spare_.back());
  spare_.pop_back();
  return buffer;
}

void BufferPool::give(ReplyBuffer buffer) noexcept {
  std::lock_guard lock(mutex_);
  if (spare_.size() < kSpare) spare_.push_back(std::move(buffer));
}

Service::Service(const Tree& tree, std::string chosen, Options options)
    : tree_(tree), options_(options), status_(std::make_unique<Status>(tree, std::move(chosen))) {}

Service::Settled Service::start(const Offer& offer) {
  // Here, in the serving process, once the logger it logs to is set up (--log-file replaces the
  // one mount() hooked it to).
  auto& sinks = spdlog::default_logger()->sinks();
  if (std::find(sinks.begin(), sinks.end(), status_->log_sink()) == sinks.end())
    sinks.push_back(status_->log_sink());
  Settled settled;
  settled.max_write = offer.max_write;
  if (options_.splice != Splice::kOff && offer.can_splice) {
    // A spliced reply must fit one pipe, header included, and a pipe holds at most
    // fs.pipe-max-size (1 MiB by default) without CAP_SYS_RESOURCE: the 257+ pages of a 1 MiB
    // READ need 2 MiB pipes. With 1 MiB ones READs are cut to 512 KiB, which leaves room for
    // the misaligned ends of their runs, but costs a lone reader 10-25% (docs/PERFORMANCE.md):
    // only -o splice=always does that.
    const size_t slots = StagePipe::max_slots();
    if (slots >= 512 || (slots != 0 && options_.splice == Splice::kAlways)) {
      settled.splice = true;
      if (slots < 512) settled.max_write = std::min(settled.max_write, kSpliceReadBytes);
      stage_ = std::make_unique<SpliceStage>(tree_, slots);
      start_leases();
    } else {
      spdlog::log(options_.splice == Splice::kAlways ? spdlog::level::warn : spdlog::level::info,
                  "splice off: pipes of {} are needed, fs.pipe-max-size allows {} KiB",
                  options_.splice == Splice::kAlways ? "1 MiB" : "2 MiB", slots * kPageKiB);
    }
  }
  // Otherwise libfuse's max_write (1 MiB, its buffer size) sets the largest READ, and every
  // reply is written from memory.
  settled.max_read = options_.max_read;
  const size_t block =
      std::min<size_t>(settled.max_write, options_.max_read != 0 ? options_.max_read : ~0u);
  // With S3 sources -o readahead_max bounds the files' read-ahead and the S3 path together.
  const size_t files_max = remote::any_registered()
                               ? files_read_ahead_share(options_.read_ahead_max, block)
                               : options_.read_ahead_max;
  if (options_.read_ahead && !options_.cache && files_max < block) {
    spdlog::info("read-ahead off: -o readahead_max={} holds no block of {} bytes",
                 options_.read_ahead_max, block);
  } else if (options_.read_ahead && !options_.cache) {
    try {
      prefetcher_ = std::make_unique<Prefetcher>(
          tree_, std::clamp(std::thread::hardware_concurrency(), 1u, kMaxHelpers),
          // Only when every READ it takes is spliced: with -o splice a lone reader's READs are
          // gathered, ahead.
          block, options_.splice == Splice::kAlways ? stage_.get() : nullptr, files_max);
    } catch (const std::exception& e) {
      // Read-ahead only speeds sequential readers up; the mount serves the same bytes without.
      spdlog::warn("read-ahead off: {}", e.what());
    }
  }
  start_source_prefetch(options_.read_ahead_max - (prefetcher_ ? files_max : 0));
  return settled;
}

size_t Service::default_s3_read_ahead_max() {
  constexpr size_t kMost = size_t{1} << 30;
  const uint64_t memory = memory_limit();
  if (memory == 0) return Prefetcher::kDefaultMaxBytes;
  const auto eighth = static_cast<size_t>(memory / 8 / 4096 * 4096);
  return std::max(Prefetcher::kDefaultMaxBytes, std::min(kMost, eighth));
}

size_t Service::files_read_ahead_share(size_t max_bytes, size_t block) {
  return std::max(max_bytes / 8, std::min(max_bytes / 2, 4 * block));
}

void Service::start_leases() {
  std::vector<SourceLeases::Source> sources;
  for (const index::IndexedSource& source : tree_.plan().sources) {
    const source::SourceFile& file = source.file;
    // An object's placeholder is not what is read (splice is off for those mounts anyway).
    const bool local = file.fd && file.fingerprint.dev != remote::kIdentityDev;
    sources.push_back({local ? file.fd.get() : -1, file.path.string()});
  }
  leases_ = std::make_unique<SourceLeases>(std::move(sources));
}

void Service::start_source_prefetch(size_t s3_bytes) noexcept {
  if (options_.read_ahead_max == 0) return;
  try {
    if (!SourcePrefetch::any_remote(tree_)) return;
    SourcePrefetch::Options o;
    o.max_bytes = options_.read_ahead_max;
    if (remote::any_registered()) {
      // A reader's window and a GET take a small part of the bound, so that the ranges a reader
      // waits for never crowd out the next window (then READs would fetch their runs alone).
      const uint64_t max_range = std::min<uint64_t>(kS3MaxRange, s3_bytes / 16);
      remote_cache_ = std::make_unique<RemoteCache>(
          s3_bytes, RemoteCache::kFetchers,
          WholeBlocks{.size = max_range, .amplify = options_.s3_amplify}, options_.s3_spool);
      o.ahead = std::min<uint64_t>(kS3AheadBytes, s3_bytes / 4);
      o.cache = remote_cache_.get();
      o.merge = MergePolicy{.gap = kS3GapBytes,
                            .slack = kMergeSlack,
                            .extra = std::max(0.0, options_.s3_amplify - 1),
                            .max_range = max_range};
      use_remote_cache(remote_cache_.get());
      const std::string held =
          options_.s3_spool
              ? fmt::format(
                    "ranges held in a spool in {} up to {} MiB (-o s3_spool_max), READs' "
                    "own GETs up to {} MiB",
                    options_.s3_spool->dir().string(), options_.s3_spool->capacity() >> 20,
                    s3_bytes >> 20)
              : fmt::format("fetching ahead up to {} MiB", s3_bytes >> 20);
      spdlog::info(
          "S3 sources: {} (of -o readahead_max={} MiB), {} GETs in flight, at most {:g}x the "
          "bytes needed (-o s3_amplify)",
          held, options_.read_ahead_max >> 20, RemoteCache::kFetchers * RemoteCache::kInFlight,
          options_.s3_amplify);
    } else {
      spdlog::info("sources on a remote filesystem: reading ahead up to {} MiB of them in parallel",
                   options_.read_ahead_max >> 20);
    }
    source_prefetch_ = std::make_unique<SourcePrefetch>(tree_, o);
  } catch (const std::exception& e) {
    spdlog::warn("source read-ahead off: {}", e.what());
  }
}

std::string Service::mode(bool direct_io_mmap_offered) const {
  std::string out = options_.cache ? "page-cache mode" : "direct_io mode";
  if (!options_.cache)
    out += direct_io_mmap_offered ? ", direct_io files may be mapped"
                                  : ", mapped files need the page cache";
  if (stage_)
    out += fmt::format(", splice{} ({} KiB pipes, {} sources leased)",
                       options_.splice == Splice::kAlways ? "" : " when busy",
                       stage_->slots() * kPageKiB, leases_ ? leases_->leased() : 0);
  return out;
}

void Service::stop() noexcept {
  if (std::exchange(stopped_, true)) return;
  std::erase(spdlog::default_logger()->sinks(), status_->log_sink());
  const Counters c = counters();
  source_prefetch_.reset();
  prefetcher_.reset();
  leases_.reset();
  if (remote_cache_) {
    const RemoteCache::Stats rc = remote_cache_->stats();
    spdlog::info(
        "S3 read-ahead: {} ranges, {} MiB fetched; {} reads from them, {} fetched alone; {} MiB "
        "freed for room, {} MiB of them still to be read; {} ranges not kept (no room in the "
        "spool)",
        rc.ranges, rc.fetched >> 20, rc.hits, rc.misses, rc.evicted >> 20, rc.evicted_needed >> 20,
        rc.gone);
    use_remote_cache(nullptr);
    remote_cache_.reset();
  }
  size_t left = 0;
  {
    std::lock_guard lock(handles_mutex_);
    left = handles_.size();
    handles_.clear();
  }
  if (left != 0) spdlog::debug("fuse: {} handles left open at unmount, freed", left);
  spdlog::info(
      "fuse: served {} reads ({} from {} blocks read ahead), {} spliced, {} failed; {} through "
      "the page cache",
      c.served, c.read_ahead_hits, c.read_ahead_blocks, c.spliced, c.failed, c.paged);
}

Service::Counters Service::counters() const {
  Counters c;
  c.served = served_.load(std::memory_order_relaxed);
  c.failed = failed_.load(std::memory_order_relaxed);
  c.spliced = spliced_.load(std::memory_order_relaxed);
  c.paged = paged_.load(std::memory_order_relaxed);
  if (prefetcher_) {
    c.read_ahead_hits = prefetcher_->hits();
    c.read_ahead_blocks = prefetcher_->gathered_ahead();
  }
  return c;
}

size_t Service::open_handles() const {
  std::lock_guard lock(handles_mutex_);
  return handles_.size();
}

bool Service::stat_any(uint64_t ino, struct stat& st) const {
  return Status::owns(ino) ? status_->stat(ino, st) : tree_.stat(ino, st);
}

int Service::not_a_file(uint64_t ino) const {
  struct stat st;
  if (!stat_any(ino, st)) return ENOENT;
  return S_ISDIR(st.st_mode) ? EISDIR : EIO;
}

int Service::not_a_dir(uint64_t ino) const {
  struct stat st;
  if (!stat_any(ino, st)) return ENOENT;
  return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
}

Service::Entry Service::lookup(uint64_t parent, const char* name) const {
  Entry e;
  // Names in /steps come and go while mounted: the kernel asks again every time.
  e.entry_timeout = parent == Tree::kStepsIno ? 0 : kTimeout;
  e.ino = status_->lookup(parent, name);
  if (e.ino == 0 && !Status::owns(parent)) e.ino = tree_.lookup(parent, name);
  if (e.ino != 0) {
    stat_any(e.ino, e.attr);
    if (status_->attributes_change(e.ino)) e.attr_timeout = 0;
    return e;
  }
  e.err = not_a_dir(parent);
  // Without an error, ino 0: a negative entry the kernel caches for entry_timeout, as the tree is
  // fixed (but for /steps, whose timeout is 0).
  return e;
}

Service::Attr Service::getattr(uint64_t ino) const {
  Attr a;
  if (!stat_any(ino, a.st)) a.err = ENOENT;
  a.timeout = ino == Tree::kStepsIno || status_->attributes_change(ino) ? 0 : kTimeout;
  return a;
}

Service::Opened Service::opendir(uint64_t ino, int flags) const {
  Opened o;
  o.err = not_a_dir(ino);
  if (o.err == 0 && (flags & O_ACCMODE) != O_RDONLY) o.err = EROFS;
  // Listings never change, but /steps: let the kernel cache the others across opens.
  o.cache_readdir = o.keep_cache = ino != Tree::kStepsIno;
  return o;
}

Service::Listing Service::list(uint64_t ino) const {
  Listing l;
  l.entries = Status::owns(ino) ? status_->list(ino) : tree_.list(ino);
  if (l.entries.empty()) l.err = not_a_file(ino) == ENOENT ? ENOENT : ENOTDIR;
  return l;
}

uint64_t Service::keep(std::unique_ptr<Handle> handle) {
  const auto fh = reinterpret_cast<uint64_t>(handle.get());
  std::lock_guard lock(handles_mutex_);
  handles_.emplace(fh, std::move(handle));
  return fh;
}

void Service::release(uint64_t fh) noexcept {
  if (fh == 0) return;
  std::unique_ptr<Handle> gone;  // freed outside the lock
  std::lock_guard lock(handles_mutex_);
  if (auto it = handles_.find(fh); it != handles_.end()) {
    gone = std::move(it->second);
    handles_.erase(it);
  }
}

Service::Opened Service::open_status(uint64_t ino, int flags) {
  Opened o;
  if (!read_only(flags)) {
    o.err = EROFS;
    return o;
  }
  // Made now, whole: its size is known only now (stat shows 0), so direct I/O.
  auto handle = std::make_unique<Handle>();
  const Counters c = counters();
  handle->status_bytes = std::make_shared<const std::string>(
      status_->content(ino, ReadTotals{c.spliced, c.read_ahead_hits, c.read_ahead_blocks}));
  o.direct_io = true;
  o.noflush = true;
  o.fh = keep(std::move(handle));
  return o;
}

Service::Opened Service::open(uint64_t ino, int flags, bool mappable) {
  if (Status::owns(ino) && status_->is_file(ino)) return open_status(ino, flags);
  Opened o;
  const plan::TargetFile* target = tree_.target(ino);
  if (target == nullptr)
    o.err = not_a_file(ino);
  else if (!read_only(flags))
    o.err = EROFS;
  else
    o.err = tree_.check_file(ino);
  if (o.err != 0) {
    status_->open_failed(ino, o.err);
    return o;
  }
  status_->opened(ino);
  // Per file. Where the kernel lets direct_io files be mapped shared, every file is opened
  // with direct_io (read() at full speed) until it has been mapped, and with keep_cache from
  // then on (MappedFiles says why). Elsewhere a file its readers map (the .safetensors view)
  // gets the page cache, as shared mmap of a direct_io file fails with ENODEV.
  const bool cached = options_.cache || (mappable ? mapped_.has(ino) : target->page_cache);
  // Faults on a mapping read through the page cache too.
  if ((cached || mappable) && !readahead_knob_.empty())
    std::call_once(readahead_once_, [&] { raise_readahead(); });
  o.direct_io = !cached;
  // keep_cache in direct_io too: opening must not drop the pages a mapping uses.
  o.keep_cache = cached || mappable;
  o.noflush = true;  // nothing to flush on close
  // The kernel reads ahead for page-cache files itself. A step's runs index its own sources:
  // no read-ahead there (nor splicing, in read()).
  if (prefetcher_ && !cached && !Tree::in_steps(ino))
    o.fh = keep(std::make_unique<Handle>(Handle{prefetcher_->open(ino), {}}));
  return o;
}

// In page-cache mode the kernel turns a reader's 1 MiB read() into READs of the mount's
// readahead, 128 KiB by default; 1 MiB READs make first reads about 1.5x faster. Best effort:
// without permission nothing changes.
void Service::raise_readahead() const {
  std::ofstream knob(readahead_knob_);
  knob << 1024;
  knob.flush();
  if (knob)
    spdlog::info("{} set to 1024", readahead_knob_);
  else
    spdlog::debug("cannot write {}", readahead_knob_);
}

void Service::read(uint64_t ino, uint64_t fh, int64_t off, size_t size, bool paged, bool mappable,
                   ReadSink& sink, uint64_t caller) {
  if (Status::owns(ino) && fh != 0) {
    read_status(*handle_of(fh), off, size, sink);
    return;
  }
  const plan::TargetFile* target = tree_.target(ino);
  if (target == nullptr) {
    sink.error(not_a_file(ino));
    return;
  }
  if (off < 0) {
    sink.error(EINVAL);
    return;
  }
  if (paged) {
    paged_.fetch_add(1, std::memory_order_relaxed);
    // In a direct_io file, these come from the faults of a mapping (a read() names its owner).
    if (mappable && !options_.cache) mapped_.note(ino);
  }
  const auto at = static_cast<uint64_t>(off);
  if (size == 0 || at >= target->file.size()) {
    sink.bytes({});
    return;
  }
  if (source_prefetch_) source_prefetch_->note(ino, at, size);
  // Our own reference: once the reply is out, the reader may close the file and its RELEASE
  // may free the handle on another thread before the read-ahead is started.
  std::shared_ptr<Prefetcher::Stream> stream;
  if (fh != 0 && prefetcher_) stream = handle_of(fh)->stream;
  const ReadsInFlight::Guard reading(reads_, caller);
  if (splice_wanted(ino, reading)) {
    const ReadResult spliced = reply_spliced(ino, at, size, sink);
    if (!spliced.is_declined()) {
      if (stream && spliced.ok() && spliced.bytes() > 0) {
        // Spliced because the CPUs are busy: no read-ahead (but with splice=always, which
        // reads ahead what it would not splice).
        prefetcher_->passed(*stream, at, spliced.bytes(), options_.splice == Splice::kAlways);
        prefetcher_->start(*stream);
      }
      return;
    }
  }
  reply_gathered(ino, at, size, stream, sink);
}

void Service::read_status(const Handle& handle, int64_t off, size_t size, ReadSink& sink) const {
  const std::shared_ptr<const std::string> held = handle.status_bytes;
  const std::string& bytes = *held;
  const size_t from = std::min<uint64_t>(std::max<int64_t>(off, 0), bytes.size());
  sink.bytes(std::span<const char>(bytes.data() + from, std::min(size, bytes.size() - from)));
}

// Spliced while other READs are served too (read_mode.h says why); a step's runs index its own
// sources, and are gathered.
bool Service::splice_wanted(uint64_t ino, const ReadsInFlight::Guard& reading) const {
  if (!stage_ || !tree_.own_runs(ino)) return false;
  ReadModeInputs in;
  in.policy = options_.splice == Splice::kAlways ? ReadModeInputs::Policy::kAlways
                                                 : ReadModeInputs::Policy::kAuto;
  in.other_reader_now = reading.other_reader_now();
  in.since_other_reader_us = reading.since_other_reader_us();
  return choose_read_mode(in) == ReadMode::kSplice;
}

ReadResult Service::reply_spliced(uint64_t ino, uint64_t off, size_t size, ReadSink& sink) {
  detail::Scratch& scratch = detail::scratch();
  std::unique_ptr<StagePipe>& pipe = scratch.splice_pipe;
  if (scratch.splice_unavailable) return ReadResult::declined();
  if (!pipe) {
    pipe = std::make_unique<StagePipe>(stage_->slots());
    if (int err = pipe->error()) {
      spdlog::warn("splice off for this thread: cannot make a pipe of {} slots: {}",
                   stage_->slots(), std::strerror(err));
      pipe.reset();
      scratch.splice_unavailable = true;
      return ReadResult::declined();
    }
  }
  // Kept until the reply is written: the sources' leases are not let go while the pipe holds
  // their pages.
  SourceLeases::Hold hold(leases_.get());
  const ReadResult staged =
      stage_->stage(ino, off, size, *pipe, hold, options_.splice == Splice::kAlways);
  if (staged.ok()) {
    // Counted (and a failure logged) before the reply: a reader who sees it also sees them.
    served_.fetch_add(1, std::memory_order_relaxed);
    spliced_.fetch_add(1, std::memory_order_relaxed);
    status_->served(ino, staged.bytes());
    sink.pipe(pipe->read_end(), staged.bytes());
  } else if (!staged.is_declined()) {
    failed_.fetch_add(1, std::memory_order_relaxed);
    status_->failed(ino, off, size, staged.error());
    sink.error(staged.error());
  }
  // A reply that failed, or staging cut short, can leave bytes behind; the next READ must
  // start on an empty pipe.
  if (pipe->pending() != 0) pipe.reset();
  return staged;
}

void Service::reply_gathered(uint64_t ino, uint64_t off, size_t size,
                             const std::shared_ptr<Prefetcher::Stream>& stream, ReadSink& sink) {
  ReplyBuffer buf = buffers_.take();
  ReadResult r = ReadResult::failed(EIO);
  if (stream) {
    // May swap `buf` with a block it read ahead.
    r = prefetcher_->read(*stream, off, size, buf);
  } else {
    buf.resize(size);
    r = tree_.read_into(ino, off, std::span<char>(buf.data(), size));
  }
  // Counted (and a failure logged) before the reply: a reader who sees it also sees them.
  if (r.ok()) {
    served_.fetch_add(1, std::memory_order_relaxed);
    status_->served(ino, r.bytes());
    sink.bytes(std::span<const char>(buf.data(), r.bytes()));
  } else {
    failed_.fetch_add(1, std::memory_order_relaxed);
    status_->failed(ino, off, size, r.error());
    sink.error(r.error());
  }
  buffers_.give(std::move(buf));
  if (stream && r.ok()) prefetcher_->start(*stream);
}

struct statvfs Service::statfs() const {
  struct statvfs st {};
  st.f_bsize = Tree::kBlockSize;
  st.f_frsize = 4096;
  st.f_blocks = (tree_.total_bytes() + st.f_frsize - 1) / st.f_frsize;
  st.f_files = tree_.inode_count();
  st.f_namemax = 255;
  st.f_flag = ST_RDONLY;
  return st;
}

Service::Xattr Service::getxattr(uint64_t ino, const char* name) const {
  Xattr x;
  std::optional<std::string> value = Status::owns(ino) ? std::nullopt : status_->xattr(ino, name);
  if (value) {
    x.value = std::move(*value);
    return x;
  }
  struct stat st;
  x.err = stat_any(ino, st) ? ENODATA : ENOENT;
  return x;
}

Service::Xattr Service::listxattr(uint64_t ino) const {
  Xattr x;
  struct stat st;
  if (!stat_any(ino, st))
    x.err = ENOENT;
  else if (!Status::owns(ino))
    x.value = status_->xattr_names(ino);
  return x;
}

int Service::access(uint64_t ino, int mask) const {
  struct stat st;
  if (!stat_any(ino, st)) return ENOENT;
  return (mask & W_OK) != 0 ? EROFS : 0;
}

}  // namespace ckptfs::fs
