// fuse_ceiling: the fastest a FUSE server answers READs on this machine, so that the bench can
// set ckptfs beside it in the same run. It serves the given files read-only as MOUNTPOINT/f0,
// f1, ... (same sizes), with direct_io and a multi-threaded loop like a ckptfs mount, in one of
// these modes:
//
//   static  every READ is answered from one constant 1 MiB buffer: the transport alone, with no
//           data to find or copy. The bytes are wrong by design; it is a bound, not a server.
//   pread   every READ is a pread() of the file into the thread's buffer: a FUSE server in front
//           of files that already exist, which is what ckptfs would be if the resharded files
//           had been written out.
//   splice  every READ is the file's range spliced from its page cache into the reply (libfuse
//           splices it into a pipe, then into /dev/fuse): the transport plus the one copy that
//           any server of bytes held in the page cache must make, out of memory rather than out
//           of a cache-resident buffer. Needs pipes that hold a 1 MiB reply
//           (fs.pipe-max-size >= 2 MiB); otherwise libfuse falls back to pread + reply.
//   mmap    every READ is answered with fuse_reply_buf straight from a read-only mapping of
//           the file (the kernel's copy, out of the page cache, is again the only one).
//
//   fuse_ceiling MOUNTPOINT static|pread|splice|mmap FILE...  (foreground; returns when
//   unmounted)
//
// Reply buffers sit on 2 MiB huge pages, as ckptfs's do, so the comparison is about the data
// path and not about page size.
#define FUSE_USE_VERSION 312

#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr size_t kBuffer = size_t{1} << 20;
constexpr size_t kHuge = size_t{2} << 20;
constexpr double kTimeout = 24 * 3600.0;

struct File {
  std::string name;
  int fd = -1;
  off_t size = 0;
};

enum class Mode { kStatic, kPread, kSplice, kMmap };
Mode g_mode = Mode::kStatic;
std::vector<File> g_files;        // inode 2 + i
std::vector<const char*> g_maps;  // mmap mode: each file mapped whole

char* huge_buffer() {
  void* p = nullptr;
  if (posix_memalign(&p, kHuge, kHuge) != 0) return nullptr;
  madvise(p, kHuge, MADV_HUGEPAGE);
  std::memset(p, 0x5a, kHuge);
  return static_cast<char*>(p);
}

const File* file_of(fuse_ino_t ino) {
  return ino >= 2 && ino - 2 < g_files.size() ? &g_files[ino - 2] : nullptr;
}

void fill_stat(fuse_ino_t ino, struct stat& st) {
  st = {};
  st.st_ino = ino;
  if (ino == FUSE_ROOT_ID) {
    st.st_mode = S_IFDIR | 0555;
    st.st_nlink = 2;
  } else {
    st.st_mode = S_IFREG | 0444;
    st.st_nlink = 1;
    st.st_size = file_of(ino)->size;
  }
}

void op_lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  for (size_t i = 0; parent == FUSE_ROOT_ID && i < g_files.size(); ++i) {
    if (g_files[i].name != name) continue;
    fuse_entry_param e{};
    e.ino = 2 + i;
    e.attr_timeout = e.entry_timeout = kTimeout;
    fill_stat(e.ino, e.attr);
    fuse_reply_entry(req, &e);
    return;
  }
  fuse_reply_err(req, ENOENT);
}

void op_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  if (ino != FUSE_ROOT_ID && file_of(ino) == nullptr) {
    fuse_reply_err(req, ENOENT);
    return;
  }
  struct stat st;
  fill_stat(ino, st);
  fuse_reply_attr(req, &st, kTimeout);
}

void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  if (ino != FUSE_ROOT_ID) {
    fuse_reply_err(req, ENOTDIR);
    return;
  }
  std::vector<char> buf(size);
  size_t used = 0;
  for (size_t i = static_cast<size_t>(off); i < g_files.size(); ++i) {
    struct stat st;
    fill_stat(2 + i, st);
    const size_t n = fuse_add_direntry(req, buf.data() + used, size - used, g_files[i].name.c_str(),
                                       &st, static_cast<off_t>(i + 1));
    if (n > size - used) break;
    used += n;
  }
  fuse_reply_buf(req, buf.data(), used);
}

void op_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (file_of(ino) == nullptr) {
    fuse_reply_err(req, EISDIR);
    return;
  }
  if ((fi->flags & O_ACCMODE) != O_RDONLY) {
    fuse_reply_err(req, EROFS);
    return;
  }
  fi->direct_io = 1;
  fuse_reply_open(req, fi);
}

void op_init(void*, fuse_conn_info* conn) {
  if (g_mode == Mode::kSplice && (conn->capable & FUSE_CAP_SPLICE_WRITE) != 0)
    conn->want |= FUSE_CAP_SPLICE_WRITE;
}

void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  static char* const constant = g_mode == Mode::kStatic ? huge_buffer() : nullptr;
  thread_local char* const own = g_mode == Mode::kPread ? huge_buffer() : nullptr;
  const File* f = file_of(ino);
  const bool ready = g_mode == Mode::kStatic  ? constant != nullptr
                     : g_mode == Mode::kPread ? own != nullptr
                                              : true;
  if (f == nullptr || size > kBuffer || !ready) {
    fuse_reply_err(req, f == nullptr ? EBADF : EIO);
    return;
  }
  const size_t want = off >= f->size ? 0 : std::min<size_t>(size, f->size - off);
  if (g_mode == Mode::kStatic) {
    fuse_reply_buf(req, constant, want);
    return;
  }
  if (g_mode == Mode::kMmap) {
    fuse_reply_buf(req, g_maps[ino - 2] + off, want);
    return;
  }
  if (g_mode == Mode::kSplice) {
    fuse_bufvec data = FUSE_BUFVEC_INIT(want);
    data.buf[0].flags = static_cast<fuse_buf_flags>(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK);
    data.buf[0].fd = f->fd;
    data.buf[0].pos = off;
    fuse_reply_data(req, &data, static_cast<fuse_buf_copy_flags>(0));
    return;
  }
  size_t got = 0;
  while (got < want) {
    const ssize_t n = pread(f->fd, own + got, want - got, off + static_cast<off_t>(got));
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  fuse_reply_buf(req, own, got);
}

}  // namespace

int main(int argc, char** argv) {
  const char* const modes[] = {"static", "pread", "splice", "mmap"};
  int mode = -1;
  for (int m = 0; argc >= 4 && m < 4; ++m)
    if (std::strcmp(argv[2], modes[m]) == 0) mode = m;
  if (mode < 0) {
    std::fprintf(stderr, "usage: fuse_ceiling MOUNTPOINT static|pread|splice|mmap FILE...\n");
    return 2;
  }
  g_mode = static_cast<Mode>(mode);
  for (int i = 3; i < argc; ++i) {
    File f{"f" + std::to_string(i - 3), open(argv[i], O_RDONLY | O_CLOEXEC)};
    struct stat st;
    if (f.fd < 0 || fstat(f.fd, &st) != 0) {
      std::fprintf(stderr, "fuse_ceiling: %s: %s\n", argv[i], std::strerror(errno));
      return 1;
    }
    f.size = st.st_size;
    g_files.push_back(f);
    if (g_mode == Mode::kMmap) {
      void* map = mmap(nullptr, std::max<size_t>(f.size, 1), PROT_READ, MAP_SHARED, f.fd, 0);
      if (map == MAP_FAILED) {
        std::fprintf(stderr, "fuse_ceiling: mmap %s: %s\n", argv[i], std::strerror(errno));
        return 1;
      }
      g_maps.push_back(static_cast<const char*>(map));
    }
  }
  fuse_lowlevel_ops ops{};
  ops.init = op_init;
  ops.lookup = op_lookup;
  ops.getattr = op_getattr;
  ops.readdir = op_readdir;
  ops.open = op_open;
  ops.read = op_read;

  char prog[] = "fuse_ceiling";
  char opt[] = "-o";
  char opts[] = "ro,fsname=fuse_ceiling,subtype=fuse_ceiling";
  char* fargs[] = {prog, opt, opts};
  fuse_args args = FUSE_ARGS_INIT(3, fargs);
  fuse_session* se = fuse_session_new(&args, &ops, sizeof(ops), nullptr);
  if (se == nullptr || fuse_session_mount(se, argv[1]) != 0) {
    std::fprintf(stderr, "fuse_ceiling: cannot mount %s\n", argv[1]);
    return 1;
  }
  fuse_loop_config* config = fuse_loop_cfg_create();
  fuse_loop_cfg_set_clone_fd(config, 0);
  fuse_loop_cfg_set_idle_threads(config, 8);
  const int rc = fuse_session_loop_mt(se, config);
  fuse_loop_cfg_destroy(config);
  fuse_session_unmount(se);
  fuse_session_destroy(se);
  return rc == 0 ? 0 : 1;
}
