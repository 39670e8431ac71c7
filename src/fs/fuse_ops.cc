#include "fuse_ops.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <vector>

namespace ckptfs::fs::detail {

namespace {

Server& server(fuse_req_t req) { return *static_cast<Server*>(fuse_req_userdata(req)); }

// No exception may unwind into libfuse's C frames: every callback runs its body through this,
// and a throw becomes EIO plus a log line. Bodies reply as their last step, so a throw always
// happens before any reply was sent.
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

// Why a non-file inode cannot be opened or read.
int not_a_file(const Tree& tree, fuse_ino_t ino) {
  struct stat st;
  return tree.stat(ino, st) ? EISDIR : ENOENT;
}

size_t read_pipe_max() {
  std::ifstream in("/proc/sys/fs/pipe-max-size");
  size_t value = 0;
  if (in >> value && value >= 4096) return value;
  return 1 << 20;
}

// One per worker thread, allocated on its first gathered read and reused: a fresh allocation
// per request costs more than the copy (perf-limits.md).
struct GatherBuffer {
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> data;
  size_t capacity = 0;

  char* get(size_t size) {
    if (size > capacity) {
      const size_t want = std::max<size_t>(size, kMaxReply);
      void* p = nullptr;
      if (::posix_memalign(&p, 4096, want) != 0) throw std::bad_alloc();
      data.reset(static_cast<char*>(p));
      capacity = want;
    }
    return data.get();
  }
};

// A fuse_bufvec is a header followed by a C flexible array; this is one with room for
// kMaxSpliceRuns buffers, reused per thread.
struct SpliceVec {
  struct Free {
    void operator()(fuse_bufvec* p) const { std::free(p); }
  };
  std::unique_ptr<fuse_bufvec, Free> vec;

  fuse_bufvec* get() {
    if (!vec) {
      void* p = std::calloc(1, sizeof(fuse_bufvec) + (kMaxSpliceRuns - 1) * sizeof(fuse_buf));
      if (p == nullptr) throw std::bad_alloc();
      vec.reset(static_cast<fuse_bufvec*>(p));
    }
    return vec.get();
  }
};

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
  conn->max_write = std::min(conn->max_write, kMaxReply);
  const unsigned splice = FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE;
  conn->want |= conn->capable & splice;
  s.splice = (conn->want & FUSE_CAP_SPLICE_WRITE) != 0;
  s.splice_move = (conn->want & FUSE_CAP_SPLICE_MOVE) != 0;
  s.pipe_max = read_pipe_max();
  spdlog::info("fuse: protocol 7.{}, max_write {}, max_readahead {}, splice {}, {} mode",
               conn->proto_minor, conn->max_write, conn->max_readahead, s.splice ? "on" : "off",
               s.cache ? "page-cache" : "direct_io");
}

void op_destroy(void* userdata) {
  const Server& s = *static_cast<Server*>(userdata);
  spdlog::info("fuse: served {} reads spliced, {} gathered, {} failed", s.reads_spliced.load(),
               s.reads_gathered.load(), s.reads_failed.load());
}

void op_lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  guarded(req, "lookup", [&] {
    const Tree& tree = *server(req).tree;
    fuse_entry_param e{};
    e.attr_timeout = kTimeout;
    e.entry_timeout = kTimeout;
    e.ino = tree.lookup(parent, name);
    if (e.ino == 0) {
      struct stat st;
      if (!tree.stat(parent, st)) {
        fuse_reply_err(req, ENOENT);
        return;
      }
      if (!S_ISDIR(st.st_mode)) {
        fuse_reply_err(req, ENOTDIR);
        return;
      }
      // ino 0 is a negative entry the kernel caches for entry_timeout: the tree is fixed.
      fuse_reply_entry(req, &e);
      return;
    }
    tree.stat(e.ino, e.attr);
    fuse_reply_entry(req, &e);
  });
}

void op_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  guarded(req, "getattr", [&] {
    struct stat st;
    if (!server(req).tree->stat(ino, st)) {
      fuse_reply_err(req, ENOENT);
      return;
    }
    fuse_reply_attr(req, &st, kTimeout);
  });
}

void op_opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  guarded(req, "opendir", [&] {
    struct stat st;
    if (!server(req).tree->stat(ino, st)) {
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
    // Listings never change: let the kernel cache them across opens.
    fi->cache_readdir = 1;
    fi->keep_cache = 1;
    fuse_reply_open(req, fi);
  });
}

void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  guarded(req, "readdir", [&] {
    const Tree& tree = *server(req).tree;
    const std::vector<Tree::DirEntry> entries = tree.list(ino);
    if (entries.empty()) {
      fuse_reply_err(req, not_a_file(tree, ino) == ENOENT ? ENOENT : ENOTDIR);
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
    if (s.tree->file(ino) == nullptr) {
      fuse_reply_err(req, not_a_file(*s.tree, ino));
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
    if (s.cache && !s.readahead_knob.empty())
      std::call_once(server(req).readahead_once, [&] { raise_readahead(s); });
    fi->direct_io = s.cache ? 0 : 1;
    fi->keep_cache = s.cache ? 1 : 0;
    fi->noflush = 1;  // nothing to flush on close
    fuse_reply_open(req, fi);
  });
}

void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  guarded(req, "read", [&] {
    Server& s = server(req);
    const Tree& tree = *s.tree;
    const plan::VirtualFile* file = tree.file(ino);
    if (file == nullptr) {
      fuse_reply_err(req, not_a_file(tree, ino));
      return;
    }
    if (off < 0) {
      fuse_reply_err(req, EINVAL);
      return;
    }
    if (size == 0 || static_cast<uint64_t>(off) >= file->size()) {
      fuse_reply_buf(req, nullptr, 0);
      return;
    }
    thread_local std::vector<plan::Run> runs = [] {
      std::vector<plan::Run> v;
      v.reserve(256);
      return v;
    }();
    runs.clear();
    const uint64_t length = file->map(static_cast<uint64_t>(off), size, runs);
    if (int err = tree.check_sources(runs)) {
      s.reads_failed.fetch_add(1, std::memory_order_relaxed);
      fuse_reply_err(req, err);
      return;
    }

    if (s.splice && splice_fits(runs, length, s.pipe_max)) {
      thread_local SpliceVec splice_vec;
      fuse_bufvec* vec = splice_vec.get();
      vec->count = runs.size();
      vec->idx = 0;
      vec->off = 0;
      fuse_buf* bufs = vec->buf;
      for (size_t i = 0; i < runs.size(); ++i) {
        const plan::Run& run = runs[i];
        fuse_buf& b = bufs[i];
        b = {};
        b.size = run.length;
        if (run.mem != nullptr) {
          b.mem = const_cast<char*>(run.mem);  // libfuse only reads it
          b.fd = -1;
        } else {
          b.flags = static_cast<fuse_buf_flags>(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK);
          b.fd = tree.source_fd(run.source);
          b.pos = static_cast<off_t>(run.offset);
        }
      }
      s.reads_spliced.fetch_add(1, std::memory_order_relaxed);
      fuse_reply_data(req, vec,
                      s.splice_move ? FUSE_BUF_SPLICE_MOVE : static_cast<fuse_buf_copy_flags>(0));
      return;
    }

    if (runs.size() == 1 && runs[0].mem != nullptr) {
      s.reads_gathered.fetch_add(1, std::memory_order_relaxed);
      fuse_reply_buf(req, runs[0].mem, length);
      return;
    }
    thread_local GatherBuffer gather_buffer;
    char* out = gather_buffer.get(length);
    if (int err = tree.gather(runs, out)) {
      s.reads_failed.fetch_add(1, std::memory_order_relaxed);
      fuse_reply_err(req, err);
      return;
    }
    s.reads_gathered.fetch_add(1, std::memory_order_relaxed);
    fuse_reply_buf(req, out, length);
  });
}

void op_release(fuse_req_t req, fuse_ino_t, fuse_file_info*) { fuse_reply_err(req, 0); }

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

void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char*, size_t) {
  guarded(req, "getxattr", [&] {
    struct stat st;
    fuse_reply_err(req, server(req).tree->stat(ino, st) ? ENODATA : ENOENT);
  });
}

void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  guarded(req, "listxattr", [&] {
    struct stat st;
    if (!server(req).tree->stat(ino, st)) {
      fuse_reply_err(req, ENOENT);
      return;
    }
    if (size == 0)
      fuse_reply_xattr(req, 0);
    else
      fuse_reply_buf(req, nullptr, 0);
  });
}

void op_access(fuse_req_t req, fuse_ino_t ino, int mask) {
  guarded(req, "access", [&] {
    struct stat st;
    if (!server(req).tree->stat(ino, st)) {
      fuse_reply_err(req, ENOENT);
      return;
    }
    fuse_reply_err(req, (mask & W_OK) != 0 ? EROFS : 0);
  });
}

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

bool splice_fits(std::span<const plan::Run> runs, uint64_t length, size_t pipe_max) {
  constexpr uint64_t kPage = 4096;
  constexpr uint64_t kOutHeader = 16;  // struct fuse_out_header
  if (runs.empty() || runs.size() > kMaxSpliceRuns) return false;
  // libfuse 3.14 looks only at the last fd buffer and copies instead when it is under two
  // pages; then our own gather is cheaper than its per-request allocation.
  uint64_t last_fd_length = 0;
  for (const plan::Run& run : runs)
    if (run.mem == nullptr) last_fd_length = run.length;
  if (last_fd_length < 2 * kPage) return false;
  // Its pipe-size heuristic: a page per iovec (the out header) and per buffer, one spare,
  // plus the message. A pipe cannot grow past pipe-max-size without CAP_SYS_RESOURCE.
  const uint64_t pipe_size = kPage * (1 + runs.size() + 1) + kOutHeader + length;
  return pipe_size <= pipe_max;
}

}  // namespace ckptfs::fs::detail
