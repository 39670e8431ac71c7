#include "fuse_ops.h"

#include <spdlog/spdlog.h>

#include <cerrno>
#include <exception>
#include <string>
#include <vector>

namespace ckptfs::fs::detail {

namespace {

Server& server(fuse_req_t req) { return *static_cast<Server*>(fuse_req_userdata(req)); }
Service& service(fuse_req_t req) { return *server(req).service; }

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

// A READ's answer, as a reply to the kernel.
class Reply final : public ReadSink {
 public:
  explicit Reply(fuse_req_t req) : req_(req) {}
  void bytes(std::span<const char> data) override {
    fuse_reply_buf(req_, data.data(), data.size());
  }
  void pipe(int fd, size_t length) override {
    fuse_bufvec data = FUSE_BUFVEC_INIT(length);
    data.buf[0].flags = FUSE_BUF_IS_FD;
    data.buf[0].fd = fd;
    fuse_reply_data(req_, &data, static_cast<fuse_buf_copy_flags>(0));
  }
  void error(int err) override { fuse_reply_err(req_, err); }

 private:
  fuse_req_t req_;
};

// A reply to getxattr/listxattr: the size when asked for it (`size` 0), else the value if it
// fits.
void reply_xattr(fuse_req_t req, const Service::Xattr& x, size_t size) {
  if (x.err != 0)
    fuse_reply_err(req, x.err);
  else if (size == 0)
    fuse_reply_xattr(req, x.value.size());
  else if (size < x.value.size())
    fuse_reply_err(req, ERANGE);
  else
    fuse_reply_buf(req, x.value.data(), x.value.size());
}

// Sets what an open settled on `fi`.
void apply(const Service::Opened& o, fuse_file_info* fi) {
  fi->fh = o.fh;
  fi->direct_io = o.direct_io ? 1 : 0;
  fi->keep_cache = o.keep_cache ? 1 : 0;
  fi->cache_readdir = o.cache_readdir ? 1 : 0;
  fi->noflush = o.noflush ? 1 : 0;
}

void op_init(void* userdata, fuse_conn_info* conn) {
  Server& s = *static_cast<Server*>(userdata);
  conn->want &= ~(FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE | FUSE_CAP_SPLICE_READ);
  const Service::Settled settled =
      s.service->start({(conn->capable & FUSE_CAP_SPLICE_WRITE) != 0, conn->max_write});
  if (settled.splice) conn->want |= FUSE_CAP_SPLICE_WRITE;
  conn->max_write = settled.max_write;
  if (settled.max_read != 0) conn->max_read = settled.max_read;
  spdlog::info("fuse: protocol 7.{}, max_write {}, max_read {}, max_readahead {}, {}",
               conn->proto_minor, conn->max_write, conn->max_read, conn->max_readahead,
               s.service->mode(s.direct_io_mmap.offered));
}

void op_destroy(void* userdata) { static_cast<Server*>(userdata)->service->stop(); }

void op_lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  guarded(req, "lookup", [&] {
    const Service::Entry found = service(req).lookup(parent, name);
    if (found.err != 0) {
      fuse_reply_err(req, found.err);
      return;
    }
    fuse_entry_param e{};
    e.ino = found.ino;
    e.attr = found.attr;
    e.attr_timeout = found.attr_timeout;
    e.entry_timeout = found.entry_timeout;
    fuse_reply_entry(req, &e);
  });
}

void op_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  guarded(req, "getattr", [&] {
    const Service::Attr a = service(req).getattr(ino);
    if (a.err != 0)
      fuse_reply_err(req, a.err);
    else
      fuse_reply_attr(req, &a.st, a.timeout);
  });
}

void op_opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  guarded(req, "opendir", [&] {
    const Service::Opened o = service(req).opendir(ino, fi->flags);
    if (o.err != 0) {
      fuse_reply_err(req, o.err);
      return;
    }
    fi->cache_readdir = o.cache_readdir ? 1 : 0;
    fi->keep_cache = o.keep_cache ? 1 : 0;
    fuse_reply_open(req, fi);
  });
}

void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  guarded(req, "readdir", [&] {
    const Service::Listing listing = service(req).list(ino);
    if (listing.err != 0) {
      fuse_reply_err(req, listing.err);
      return;
    }
    const std::vector<Tree::DirEntry>& entries = listing.entries;
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
    Server& s = server(req);
    const Service::Opened o = s.service->open(ino, fi->flags, s.direct_io_mmap.granted);
    if (o.err != 0) {
      fuse_reply_err(req, o.err);
      return;
    }
    apply(o, fi);
    // Interrupted: no RELEASE follows.
    if (fuse_reply_open(req, fi) != 0) s.service->release(o.fh);
  });
}

void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  guarded(req, "read", [&] {
    Server& s = server(req);
    Reply reply(req);
    // A READ without a lock owner comes from the page cache (a read() names its owner).
    const fuse_ctx* ctx = fuse_req_ctx(req);
    s.service->read(ino, fi != nullptr ? fi->fh : 0, off, size,
                    fi != nullptr && fi->lock_owner == 0, s.direct_io_mmap.granted, reply,
                    ctx != nullptr ? static_cast<uint64_t>(ctx->pid) : 0);
  });
}

void op_release(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  service(req).release(fi->fh);
  fuse_reply_err(req, 0);
}

void op_statfs(fuse_req_t req, fuse_ino_t) {
  guarded(req, "statfs", [&] {
    const struct statvfs st = service(req).statfs();
    fuse_reply_statfs(req, &st);
  });
}

void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  guarded(req, "getxattr", [&] { reply_xattr(req, service(req).getxattr(ino, name), size); });
}

void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  guarded(req, "listxattr", [&] { reply_xattr(req, service(req).listxattr(ino), size); });
}

// Attributes are facts about the mount, not the user's to change.
void op_setxattr(fuse_req_t req, fuse_ino_t, const char*, const char*, size_t, int) {
  fuse_reply_err(req, EROFS);
}

void op_removexattr(fuse_req_t req, fuse_ino_t, const char*) { fuse_reply_err(req, EROFS); }

void op_access(fuse_req_t req, fuse_ino_t ino, int mask) {
  guarded(req, "access", [&] { fuse_reply_err(req, service(req).access(ino, mask)); });
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
