#include "fuse_ops.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "scratch.h"

namespace ckptfs::fs::detail {

namespace {

Server& server(fuse_req_t req) { return *static_cast<Server*>(fuse_req_userdata(req)); }

// No exception may unwind into libfuse's C frames: every callback runs its body through this,
// and a throw becomes EIO plus a log line. Bodies reply as their last step, or call only
// noexcept functions after it, so a throw always happens before any reply was sent.
template <typename Body>
void guarded(fuse_req_t req, const char* op, Body&& body) noexcept {
  try {
    body();
    return;
  } catch (const std::exception& e) {
    spdlog::error("{}: {}", op, e.what());
  } catch (...) {
    spdlog::error("{}: unknown exception", op);
  }
  fuse_reply_err(req, EIO);
}

// At most this many read-ahead helpers, however many CPUs: each one only runs while a reader
// waits on a READ.
constexpr unsigned kMaxHelpers = 4;
// The largest READ when replies may be spliced.
constexpr unsigned kSpliceReadBytes = 512 << 10;
// A pipe slot holds a page.
const size_t kPageKiB = static_cast<size_t>(::sysconf(_SC_PAGESIZE)) / 1024;

// Stages a READ in this worker thread's pipe and replies from it. False if it was declined
// (nothing replied: gather it instead). `got` is set for a sent reply; a failed source is
// answered with EIO.
bool reply_spliced(fuse_req_t req, Server& s, fuse_ino_t ino, uint64_t off, size_t size,
                   size_t& got) {
  std::unique_ptr<StagePipe>& pipe = scratch().splice_pipe;
  bool& no_pipe = scratch().splice_unavailable;
  if (no_pipe) return false;
  if (!pipe) {
    pipe = std::make_unique<StagePipe>(s.stage->slots());
    if (int err = pipe->error()) {
      spdlog::warn("splice off for this thread: cannot make a pipe of {} slots: {}",
                   s.stage->slots(), std::strerror(err));
      pipe.reset();
      no_pipe = true;
      return false;
    }
  }
  const ReadResult staged = s.stage->stage(ino, off, size, *pipe);
  got = staged.bytes();
  if (staged.ok()) {
    // Counted (and a failure logged) before the reply: a reader who sees it also sees them.
    s.status->served(ino, got);
    fuse_bufvec data = FUSE_BUFVEC_INIT(got);
    data.buf[0].flags = FUSE_BUF_IS_FD;
    data.buf[0].fd = pipe->read_end();
    fuse_reply_data(req, &data, static_cast<fuse_buf_copy_flags>(0));
  } else if (!staged.is_declined()) {
    s.reads_failed.fetch_add(1, std::memory_order_relaxed);
    s.status->failed(ino, off, size, staged.error());
    fuse_reply_err(req, staged.error());
  }
  // A reply that failed, or staging cut short, can leave bytes behind; the next READ must
  // start on an empty pipe.
  if (pipe->pending() != 0) pipe.reset();
  if (!staged.ok()) return !staged.is_declined();
  s.reads_served.fetch_add(1, std::memory_order_relaxed);
  s.reads_spliced.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// What an open file handle (fi->fh) points to in direct_io mode.
struct StreamHandle {
  std::shared_ptr<Prefetcher::Stream> stream;
};

StreamHandle* stream_of(const fuse_file_info* fi) {
  return fi == nullptr ? nullptr : reinterpret_cast<StreamHandle*>(fi->fh);
}

// What an open status file's handle points to: its bytes as of the open.
struct StatusHandle {
  std::string bytes;
};

// The tree and the status inodes side by side.
bool stat_any(const Server& s, fuse_ino_t ino, struct stat& st) {
  return Status::owns(ino) ? s.status->stat(ino, st) : s.tree->stat(ino, st);
}

uint64_t lookup_any(const Server& s, fuse_ino_t parent, const char* name) {
  if (const uint64_t ino = s.status->lookup(parent, name)) return ino;
  return Status::owns(parent) ? 0 : s.tree->lookup(parent, name);
}

// Why an inode cannot be opened or read: not there, a directory, or a file whose rank could
// not be planned (lazily planned ranks).
int not_a_file(const Server& s, fuse_ino_t ino) {
  struct stat st;
  if (!stat_any(s, ino, st)) return ENOENT;
  return S_ISDIR(st.st_mode) ? EISDIR : EIO;
}

ReadTotals read_totals(const Server& s) {
  ReadTotals t;
  t.spliced = s.reads_spliced.load(std::memory_order_relaxed);
  if (s.prefetcher) {
    t.read_ahead_hits = s.prefetcher->hits();
    t.read_ahead_blocks = s.prefetcher->gathered_ahead();
  }
  return t;
}

// A reply to getxattr/listxattr: the size when asked for it (`size` 0), else the value if it
// fits.
void reply_xattr_value(fuse_req_t req, const std::string& value, size_t size) {
  if (size == 0)
    fuse_reply_xattr(req, value.size());
  else if (size < value.size())
    fuse_reply_err(req, ERANGE);
  else
    fuse_reply_buf(req, value.data(), value.size());
}

// In page-cache mode the kernel turns a reader's 1 MiB read() into READs of the mount's
// readahead, 128 KiB by default; 1 MiB READs make first reads about 1.5x faster. Best effort:
// without permission nothing changes.
void raise_readahead(const Server& s) {
  std::ofstream knob(s.readahead_knob);
  knob << 1024;
  knob.flush();
  if (knob)
    spdlog::info("{} set to 1024", s.readahead_knob);
  else
    spdlog::debug("cannot write {}", s.readahead_knob);
}

void op_init(void* userdata, fuse_conn_info* conn) {
  Server& s = *static_cast<Server*>(userdata);
  // Here, in the serving process, once the logger it logs to is set up (--log-file replaces the
  // one mount() hooked it to).
  auto& sinks = spdlog::default_logger()->sinks();
  if (std::find(sinks.begin(), sinks.end(), s.status->log_sink()) == sinks.end())
    sinks.push_back(s.status->log_sink());
  conn->want &= ~(FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE | FUSE_CAP_SPLICE_READ);
  using Splice = Server::Splice;
  if (s.splice != Splice::kOff && (conn->capable & FUSE_CAP_SPLICE_WRITE) != 0) {
    // A spliced reply must fit one pipe, header included, and a pipe holds at most
    // fs.pipe-max-size (1 MiB by default) without CAP_SYS_RESOURCE: the 257+ pages of a 1 MiB
    // READ need 2 MiB pipes. With 1 MiB ones READs are cut to 512 KiB, which leaves room for
    // the misaligned ends of their runs, but costs a lone reader 10-25% (docs/PERFORMANCE.md):
    // only -o splice=always does that.
    const size_t slots = StagePipe::max_slots();
    if (slots >= 512 || (slots != 0 && s.splice == Splice::kAlways)) {
      conn->want |= FUSE_CAP_SPLICE_WRITE;
      if (slots < 512) conn->max_write = std::min<unsigned>(conn->max_write, kSpliceReadBytes);
      s.stage = std::make_unique<SpliceStage>(*s.tree, slots);
    } else {
      spdlog::warn("splice off: pipes of {} are needed, fs.pipe-max-size allows {} KiB",
                   s.splice == Splice::kAlways ? "1 MiB" : "2 MiB", slots * kPageKiB);
    }
  }
  // Otherwise libfuse's max_write (1 MiB, its buffer size) sets the largest READ, and every
  // reply is written from memory.
  if (s.max_read != 0) conn->max_read = s.max_read;
  const size_t block = std::min<size_t>(conn->max_write, s.max_read != 0 ? s.max_read : ~0u);
  if (s.read_ahead) {
    try {
      s.prefetcher = std::make_unique<Prefetcher>(
          *s.tree, std::clamp(std::thread::hardware_concurrency(), 1u, kMaxHelpers),
          // Only when every READ it takes is spliced: with -o splice a lone reader's READs are
          // gathered, ahead.
          block, s.splice == Splice::kAlways ? s.stage.get() : nullptr);
    } catch (const std::exception& e) {
      // Read-ahead only speeds sequential readers up; the mount serves the same bytes without.
      spdlog::warn("read-ahead off: {}", e.what());
    }
  }
  spdlog::info("fuse: protocol 7.{}, max_write {}, max_read {}, max_readahead {}, {} mode{}{}",
               conn->proto_minor, conn->max_write, conn->max_read, conn->max_readahead,
               s.cache ? "page-cache" : "direct_io",
               s.cache                    ? ""
               : s.direct_io_mmap.offered ? ", direct_io files may be mapped"
                                          : ", mapped files need the page cache",
               !s.stage ? ""
               : s.splice == Splice::kAlways
                   ? fmt::format(", splice ({} KiB pipes)", s.stage->slots() * kPageKiB)
                   : fmt::format(", splice when busy ({} KiB pipes)", s.stage->slots() * kPageKiB));
}

void op_destroy(void* userdata) {
  Server& s = *static_cast<Server*>(userdata);
  std::erase(spdlog::default_logger()->sinks(), s.status->log_sink());
  uint64_t ahead = 0, hits = 0;
  if (s.prefetcher) {
    ahead = s.prefetcher->gathered_ahead();
    hits = s.prefetcher->hits();
    s.prefetcher.reset();
  }
  spdlog::info(
      "fuse: served {} reads ({} from {} blocks read ahead), {} spliced, {} failed; {} through "
      "the page cache",
      s.reads_served.load(), hits, ahead, s.reads_spliced.load(), s.reads_failed.load(),
      s.reads_paged.load());
}

void op_lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  guarded(req, "lookup", [&] {
    const Server& s = server(req);
    fuse_entry_param e{};
    e.attr_timeout = kTimeout;
    // Names in /steps come and go while mounted: the kernel asks again every time.
    e.entry_timeout = parent == Tree::kStepsIno ? 0 : kTimeout;
    e.ino = lookup_any(s, parent, name);
    if (e.ino == 0) {
      struct stat st;
      if (!stat_any(s, parent, st)) {
        fuse_reply_err(req, ENOENT);
        return;
      }
      if (!S_ISDIR(st.st_mode)) {
        fuse_reply_err(req, ENOTDIR);
        return;
      }
      // ino 0 is a negative entry the kernel caches for entry_timeout: the tree is fixed
      // (but for /steps, whose timeout is 0).
      fuse_reply_entry(req, &e);
      return;
    }
    stat_any(s, e.ino, e.attr);
    fuse_reply_entry(req, &e);
  });
}

void op_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  guarded(req, "getattr", [&] {
    struct stat st;
    if (!stat_any(server(req), ino, st)) {
      fuse_reply_err(req, ENOENT);
      return;
    }
    fuse_reply_attr(req, &st, ino == Tree::kStepsIno ? 0 : kTimeout);
  });
}

void op_opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  guarded(req, "opendir", [&] {
    struct stat st;
    if (!stat_any(server(req), ino, st)) {
      fuse_reply_err(req, ENOENT);
      return;
    }
    if (!S_ISDIR(st.st_mode)) {
      fuse_reply_err(req, ENOTDIR);
      return;
    }
    if ((fi->flags & O_ACCMODE) != O_RDONLY) {
      fuse_reply_err(req, EROFS);
      return;
    }
    // Listings never change, but /steps: let the kernel cache the others across opens.
    fi->cache_readdir = ino == Tree::kStepsIno ? 0 : 1;
    fi->keep_cache = ino == Tree::kStepsIno ? 0 : 1;
    fuse_reply_open(req, fi);
  });
}

void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  guarded(req, "readdir", [&] {
    const Server& s = server(req);
    const std::vector<Tree::DirEntry> entries =
        Status::owns(ino) ? s.status->list(ino) : s.tree->list(ino);
    if (entries.empty()) {
      fuse_reply_err(req, not_a_file(s, ino) == ENOENT ? ENOENT : ENOTDIR);
      return;
    }
    std::vector<char> buf(size);
    size_t used = 0;
    // The offset handed back with each entry is the index of the next one.
    for (size_t i = off < 0 ? entries.size() : static_cast<size_t>(off); i < entries.size(); ++i) {
      struct stat st {};
      st.st_ino = entries[i].ino;
      st.st_mode = entries[i].is_dir ? S_IFDIR : S_IFREG;
      const std::string name(entries[i].name);
      const size_t need = fuse_add_direntry(req, buf.data() + used, size - used, name.c_str(), &st,
                                            static_cast<off_t>(i + 1));
      if (need > size - used) break;
      used += need;
    }
    fuse_reply_buf(req, buf.data(), used);
  });
}

void op_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  guarded(req, "open", [&] {
    const Server& s = server(req);
    if (Status::owns(ino) && s.status->is_file(ino)) {
      if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC) != 0) {
        fuse_reply_err(req, EROFS);
        return;
      }
      // Made now, whole: its size is known only now (stat shows 0), so direct I/O.
      auto handle = std::make_unique<StatusHandle>();
      handle->bytes = s.status->content(ino, read_totals(s));
      fi->direct_io = 1;
      fi->keep_cache = 0;
      fi->noflush = 1;
      fi->fh = reinterpret_cast<uint64_t>(handle.get());
      if (fuse_reply_open(req, fi) == 0) static_cast<void>(handle.release());
      return;
    }
    const plan::TargetFile* target = s.tree->target(ino);
    if (target == nullptr) {
      fuse_reply_err(req, not_a_file(s, ino));
      return;
    }
    if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC) != 0) {
      fuse_reply_err(req, EROFS);
      return;
    }
    if (int err = s.tree->check_file(ino)) {
      fuse_reply_err(req, err);
      return;
    }
    s.status->opened(ino);
    // Per file. Where the kernel lets direct_io files be mapped shared, every file is opened
    // with direct_io (read() at full speed) until it has been mapped, and with keep_cache from
    // then on (MappedFiles says why). Elsewhere a file its readers map (the .safetensors view)
    // gets the page cache, as shared mmap of a direct_io file fails with ENODEV.
    const bool mappable = s.direct_io_mmap.granted;
    const bool cached = s.cache || (mappable ? s.mapped.has(ino) : target->page_cache);
    // Faults on a mapping read through the page cache too.
    if ((cached || mappable) && !s.readahead_knob.empty())
      std::call_once(server(req).readahead_once, [&] { raise_readahead(s); });
    fi->direct_io = cached ? 0 : 1;
    // keep_cache in direct_io too: opening must not drop the pages a mapping uses.
    fi->keep_cache = cached || mappable ? 1 : 0;
    fi->noflush = 1;  // nothing to flush on close
    fi->fh = 0;
    // The kernel reads ahead for page-cache files itself. A step's runs index its own
    // sources: no read-ahead there (nor splicing, below).
    if (s.prefetcher && !cached && !Tree::in_steps(ino))
      fi->fh = reinterpret_cast<uint64_t>(new StreamHandle{s.prefetcher->open(ino)});
    if (fuse_reply_open(req, fi) != 0) delete stream_of(fi);  // interrupted: no release follows
  });
}

void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  guarded(req, "read", [&] {
    Server& s = server(req);
    const Tree& tree = *s.tree;
    if (Status::owns(ino) && fi != nullptr && fi->fh != 0) {
      const std::string& bytes = reinterpret_cast<const StatusHandle*>(fi->fh)->bytes;
      const size_t from = std::min<uint64_t>(std::max<off_t>(off, 0), bytes.size());
      fuse_reply_buf(req, bytes.data() + from, std::min(size, bytes.size() - from));
      return;
    }
    const plan::TargetFile* target = tree.target(ino);
    if (target == nullptr) {
      fuse_reply_err(req, not_a_file(s, ino));
      return;
    }
    const plan::VirtualFile* file = &target->file;
    if (off < 0) {
      fuse_reply_err(req, EINVAL);
      return;
    }
    // A READ without a lock owner comes from the page cache: in a direct_io file, from the
    // faults of a mapping (a read() of a direct_io file names its owner).
    if (fi != nullptr && fi->lock_owner == 0) {
      s.reads_paged.fetch_add(1, std::memory_order_relaxed);
      if (s.direct_io_mmap.granted && !s.cache) s.mapped.note(ino);
    }
    if (size == 0 || static_cast<uint64_t>(off) >= file->size()) {
      fuse_reply_buf(req, nullptr, 0);
      return;
    }
    size_t got = 0;
    int err = 0;
    // Our own reference: once the reply is out, the reader may close the file and its
    // RELEASE may free the handle on another thread before start() below runs.
    std::shared_ptr<Prefetcher::Stream> stream;
    if (const StreamHandle* h = stream_of(fi); h != nullptr && s.prefetcher) stream = h->stream;
    // With -o splice a READ is spliced while other readers read too: then the CPUs are busy, and
    // one copy per byte (splice) beats two (gather, then reply) although the kernel's copy out
    // of the page cache is slower. A lone reader is served faster by gathering ahead while its
    // previous reply is copied.
    if (s.stage && tree.own_runs(ino) &&
        (s.splice == Server::Splice::kAlways ||
         s.readers.note(fi != nullptr && fi->fh != 0 ? fi->fh : ino)) &&
        reply_spliced(req, s, ino, static_cast<uint64_t>(off), size, got)) {
      if (stream && got > 0) {
        // Spliced because the CPUs are busy: no read-ahead.
        s.prefetcher->passed(*stream, static_cast<uint64_t>(off), got,
                             s.splice == Server::Splice::kAlways);
        s.prefetcher->start(*stream);
      }
      return;
    }
    ReplyBuffer buf = s.buffers.take();
    ReadResult r = ReadResult::failed(EIO);
    if (stream) {
      // May swap `buf` with a block it read ahead.
      r = s.prefetcher->read(*stream, static_cast<uint64_t>(off), size, buf);
    } else {
      buf.resize(size);
      r = tree.read_into(ino, static_cast<uint64_t>(off), std::span<char>(buf.data(), size));
    }
    got = r.bytes();
    err = r.error();
    if (err != 0) {
      s.reads_failed.fetch_add(1, std::memory_order_relaxed);
      // Logged and counted before the reply: a reader who sees it also sees them.
      s.status->failed(ino, static_cast<uint64_t>(off), size, err);
      fuse_reply_err(req, err);
      s.buffers.give(std::move(buf));
      return;
    }
    s.reads_served.fetch_add(1, std::memory_order_relaxed);
    s.status->served(ino, got);
    fuse_reply_buf(req, buf.data(), got);
    s.buffers.give(std::move(buf));
    if (stream) s.prefetcher->start(*stream);
  });
}

void op_release(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (Status::owns(ino))
    delete reinterpret_cast<StatusHandle*>(fi->fh);
  else
    delete stream_of(fi);
  fuse_reply_err(req, 0);
}

void op_statfs(fuse_req_t req, fuse_ino_t) {
  guarded(req, "statfs", [&] {
    const Tree& tree = *server(req).tree;
    struct statvfs st {};
    st.f_bsize = Tree::kBlockSize;
    st.f_frsize = 4096;
    st.f_blocks = (tree.total_bytes() + st.f_frsize - 1) / st.f_frsize;
    st.f_files = tree.inode_count();
    st.f_namemax = 255;
    st.f_flag = ST_RDONLY;
    fuse_reply_statfs(req, &st);
  });
}

void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  guarded(req, "getxattr", [&] {
    const Server& s = server(req);
    const std::optional<std::string> value =
        Status::owns(ino) ? std::nullopt : s.status->xattr(ino, name);
    if (value) {
      reply_xattr_value(req, *value, size);
      return;
    }
    struct stat st;
    fuse_reply_err(req, stat_any(s, ino, st) ? ENODATA : ENOENT);
  });
}

void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  guarded(req, "listxattr", [&] {
    const Server& s = server(req);
    struct stat st;
    if (!stat_any(s, ino, st)) {
      fuse_reply_err(req, ENOENT);
      return;
    }
    reply_xattr_value(req, Status::owns(ino) ? std::string() : s.status->xattr_names(ino), size);
  });
}

// Attributes are facts about the mount, not the user's to change.
void op_setxattr(fuse_req_t req, fuse_ino_t, const char*, const char*, size_t, int) {
  fuse_reply_err(req, EROFS);
}

void op_removexattr(fuse_req_t req, fuse_ino_t, const char*) { fuse_reply_err(req, EROFS); }

void op_access(fuse_req_t req, fuse_ino_t ino, int mask) {
  guarded(req, "access", [&] {
    struct stat st;
    if (!stat_any(server(req), ino, st)) {
      fuse_reply_err(req, ENOENT);
      return;
    }
    fuse_reply_err(req, (mask & W_OK) != 0 ? EROFS : 0);
  });
}

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

namespace {

fuse_lowlevel_ops make_ops() {
  fuse_lowlevel_ops ops{};
  ops.init = op_init;
  ops.destroy = op_destroy;
  ops.lookup = op_lookup;
  ops.getattr = op_getattr;
  ops.opendir = op_opendir;
  ops.readdir = op_readdir;
  ops.open = op_open;
  ops.read = op_read;
  ops.release = op_release;
  ops.statfs = op_statfs;
  ops.getxattr = op_getxattr;
  ops.listxattr = op_listxattr;
  ops.setxattr = op_setxattr;
  ops.removexattr = op_removexattr;
  ops.access = op_access;
  // Everything that writes stays unset: the mount is "ro", so the kernel answers EROFS
  // before asking us, and libfuse answers ENOSYS otherwise.
  return ops;
}

}  // namespace

const fuse_lowlevel_ops& lowlevel_ops() {
  static const fuse_lowlevel_ops ops = make_ops();
  return ops;
}

}  // namespace ckptfs::fs::detail
