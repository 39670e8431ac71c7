#include "ckptfs/fs/mount.h"

#include <fcntl.h>
#include <malloc.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "ckptfs/crypt/decrypted_stream.h"
#include "ckptfs/error.h"
#include "ckptfs/util/eintr.h"
#include "ckptfs/util/open_path.h"
#include "device_io.h"
#include "fuse_ops.h"

namespace ckptfs::fs {

namespace {

namespace stdfs = std::filesystem;

// libfuse reports mount problems through its log function, sometimes one message in several
// calls. While setting up, collect what it says to put into our Error (and log it at debug
// only, to avoid saying it twice).
std::mutex g_fuse_log_mutex;
std::string g_fuse_setup_log;
bool g_fuse_setting_up = false;

void fuse_log_to_spdlog(enum fuse_log_level level, const char* format, va_list ap) {
  char text[1024];
  std::vsnprintf(text, sizeof text, format, ap);
  std::string_view message(text);
  std::lock_guard lock(g_fuse_log_mutex);
  if (g_fuse_setting_up && level <= FUSE_LOG_ERR) g_fuse_setup_log += message;
  while (!message.empty() && (message.back() == '\n' || message.back() == ' '))
    message.remove_suffix(1);
  if (message.empty()) return;
  spdlog::level::level_enum out = spdlog::level::debug;
  if (!g_fuse_setting_up) {
    if (level <= FUSE_LOG_ERR)
      out = spdlog::level::err;
    else if (level <= FUSE_LOG_WARNING)
      out = spdlog::level::warn;
    else if (level <= FUSE_LOG_INFO)
      out = spdlog::level::info;
  }
  spdlog::log(out, "libfuse: {}", message);
}

void begin_setup() {
  std::lock_guard lock(g_fuse_log_mutex);
  g_fuse_setting_up = true;
  g_fuse_setup_log.clear();
  fuse_set_log_func(fuse_log_to_spdlog);
}

void end_setup() {
  std::lock_guard lock(g_fuse_log_mutex);
  g_fuse_setting_up = false;
}

// What libfuse said while setting up, as one line.
std::string setup_errors(std::string_view fallback) {
  std::lock_guard lock(g_fuse_log_mutex);
  std::string out;
  size_t begin = 0;
  while (begin < g_fuse_setup_log.size()) {
    size_t end = g_fuse_setup_log.find('\n', begin);
    if (end == std::string::npos) end = g_fuse_setup_log.size();
    std::string_view line(g_fuse_setup_log.data() + begin, end - begin);
    while (!line.empty() && line.back() == ' ') line.remove_suffix(1);
    if (!line.empty()) {
      if (!out.empty()) out += "; ";
      out += line;
    }
    begin = end + 1;
  }
  return out.empty() ? std::string(fallback) : out;
}

// Splits one -o value on commas, keeping backslash-escaped ones (libfuse's own syntax).
std::vector<std::string> split_options(std::string_view list) {
  std::vector<std::string> out;
  std::string current;
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i] == '\\' && i + 1 < list.size()) {
      current += list[i];
      current += list[++i];
    } else if (list[i] == ',') {
      if (!current.empty()) out.push_back(std::move(current));
      current.clear();
    } else {
      current += list[i];
    }
  }
  if (!current.empty()) out.push_back(std::move(current));
  return out;
}

std::string escape_option(std::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == ',' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

struct ParsedOptions {
  std::vector<std::string> fuse;  // for libfuse, one option each
  bool cache = false;
  bool read_ahead = true;  // direct_io mode only
  // Chosen per READ by default, for the sources that hold a read lease (source_leases.h).
  Service::Splice splice = Service::Splice::kAuto;
  bool splice_named = false;      // a splice option was given: say why it is off, if it is
  unsigned max_read = 0;          // largest READ; 0: max_write decides
  unsigned max_threads = 0;       // 0: libfuse's default
  unsigned max_idle_threads = 8;  // keeps a pool warm for parallel readers
  bool nonempty = false;
  // The read-ahead of all open files together.
  size_t read_ahead_max = Prefetcher::kDefaultMaxBytes;
  bool read_ahead_max_named = false;
  // The decrypted pages of all encrypted sources together.
  uint64_t decrypt_max = crypt::kDefaultDecryptBudget;
  double s3_amplify = Service::kDefaultS3Amplify;
  // Where S3 sources' ranges are held: a directory (empty: kDefaultSpoolDir), or "off" (in
  // memory); and the most bytes there (0: Spool::default_capacity).
  std::string s3_spool;
  uint64_t s3_spool_max = 0;
};

// FHS: temporary files kept across reboots, so on a disk where /tmp may be in memory.
constexpr const char* kDefaultSpoolDir = "/var/tmp";
// Below this a default spool is not worth its writes (the disk is all but full).
constexpr uint64_t kMinDefaultSpool = uint64_t{64} << 20;

// The number after "name=" in `option`, from `lo` to `hi`; `what` names it in the error.
unsigned parse_number(std::string_view option, size_t name_length, unsigned lo, unsigned hi,
                      std::string_view what) {
  const std::string_view value = option.substr(name_length);
  unsigned n = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec != std::errc() || end != value.data() + value.size() || n < lo || n > hi)
    fail("bad mount option \"{}\": expected a {} from {} to {}", option, what, lo, hi);
  return n;
}

// The ratio after "name=" in `option`: a decimal number from 1 to 1000 (such as 1.1).
double parse_ratio(std::string_view option, size_t name_length) {
  const std::string value(option.substr(name_length));
  char* end = nullptr;
  const double x = std::strtod(value.c_str(), &end);
  if (value.empty() || end != value.c_str() + value.size() || !(x >= 1 && x <= 1000))
    fail("bad mount option \"{}\": expected a ratio from 1 to 1000, such as 1.1", option);
  return x;
}

// The byte count after "name=" in `option`: digits with an optional binary suffix K, M or G
// (256M is 268435456), up to 1 TiB.
size_t parse_bytes(std::string_view option, size_t name_length) {
  const std::string_view value = option.substr(name_length);
  uint64_t n = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  const std::string_view suffix(end, static_cast<size_t>(value.data() + value.size() - end));
  unsigned shift = 0;
  if (suffix == "K" || suffix == "k")
    shift = 10;
  else if (suffix == "M" || suffix == "m")
    shift = 20;
  else if (suffix == "G" || suffix == "g")
    shift = 30;
  else if (!suffix.empty())
    ec = std::errc::invalid_argument;
  constexpr uint64_t kMax = uint64_t{1} << 40;
  if (ec != std::errc() || n > (kMax >> shift))
    fail("bad mount option \"{}\": expected a byte count up to 1024G, such as 256M", option);
  return static_cast<size_t>(n << shift);
}

ParsedOptions parse_options(const MountOptions& options) {
  ParsedOptions out;
  out.cache = options.cache;
  for (const std::string& list : options.fuse_options) {
    for (std::string& option : split_options(list)) {
      std::string_view o = option;
      if (o == "cache") {
        out.cache = true;
      } else if (o == "noreadahead") {
        out.read_ahead = false;
      } else if (o == "splice" || o == "splice=auto") {
        out.splice = Service::Splice::kAuto;
        out.splice_named = true;
      } else if (o == "splice=always") {
        out.splice = Service::Splice::kAlways;
        out.splice_named = true;
      } else if (o == "nosplice" || o == "splice=never") {
        out.splice = Service::Splice::kOff;
      } else if (o.starts_with("max_read=")) {
        // libfuse takes it too, and refuses to start unless init asks for the same size.
        out.max_read = parse_number(o, 9, 4096, 1 << 20, "byte count");
        out.fuse.push_back(std::move(option));
      } else if (o.starts_with("readahead_max=")) {
        out.read_ahead_max = parse_bytes(o, 14);
        out.read_ahead_max_named = true;
      } else if (o.starts_with("s3_amplify=")) {
        out.s3_amplify = parse_ratio(o, 11);
      } else if (o.starts_with("s3_spool=")) {
        out.s3_spool = o.substr(9);
        if (out.s3_spool.empty())
          fail("bad mount option \"{}\": expected a directory on a local disk, or off", option);
      } else if (o.starts_with("s3_spool_max=")) {
        out.s3_spool_max = parse_bytes(o, 13);
        if (out.s3_spool_max < Service::kS3MaxRange)  // room for one GET at least
          fail(
              "bad mount option \"{}\": expected a byte count of at least 8M, such as 16G (or "
              "-o s3_spool=off)",
              option);
      } else if (o.starts_with("decrypt_max=")) {
        out.decrypt_max = parse_bytes(o, 12);
      } else if (o.starts_with("max_threads=")) {
        out.max_threads = parse_number(o, 12, 1, 1024, "count");
      } else if (o.starts_with("max_idle_threads=")) {
        out.max_idle_threads = parse_number(o, 17, 1, 1024, "count");
      } else if (o == "nonempty") {
        out.nonempty = true;  // checked before mounting; libfuse 3 no longer takes it
      } else if (o == "rw") {
        fail("bad mount option \"rw\": ckptfs mounts are read-only");
      } else {
        out.fuse.push_back(std::move(option));
      }
    }
  }
  return out;
}

// The directory every source lives under, for fsname.
std::string common_source_dir(const Tree& tree) {
  std::optional<stdfs::path> common;
  for (const index::IndexedSource& source : tree.plan().sources) {
    const stdfs::path dir = stdfs::absolute(source.file.path).lexically_normal().parent_path();
    if (!common) {
      common = dir;
      continue;
    }
    stdfs::path shared;
    auto a = common->begin(), b = dir.begin();
    for (; a != common->end() && b != dir.end() && *a == *b; ++a, ++b) shared /= *a;
    common = shared;
  }
  return common && !common->empty() ? common->string() : std::string("ckptfs");
}

// libfuse's argument vector, freed however libfuse reallocated it.
class FuseArgs {
 public:
  explicit FuseArgs(const std::vector<std::string>& argv) {
    for (const std::string& arg : argv)
      if (fuse_opt_add_arg(&args_, arg.c_str()) != 0) throw std::bad_alloc();
  }
  ~FuseArgs() { fuse_opt_free_args(&args_); }
  FuseArgs(const FuseArgs&) = delete;
  FuseArgs& operator=(const FuseArgs&) = delete;
  fuse_args* get() { return &args_; }

 private:
  fuse_args args_ = FUSE_ARGS_INIT(0, nullptr);
};

// Runs the session until the kernel unmounts (or a signal), then tears it down. 0 on a clean
// end, 1 if the loop failed.
int serve(fuse_session* se, const ParsedOptions& parsed) {
  // Buffers of 256 KiB to 1 MiB live on their own huge pages (reply_buffer.h); the rest of the
  // read path's memory comes from malloc. A fixed threshold stops glibc from raising its mmap
  // and trim thresholds as buffers are freed, so per-thread arenas give memory back: peak
  // memory measured 37-45 MiB with it, 40-47 MiB without.
  ::mallopt(M_MMAP_THRESHOLD, 256 * 1024);
  fuse_loop_config* config = fuse_loop_cfg_create();
  fuse_loop_cfg_set_clone_fd(config, 0);
  fuse_loop_cfg_set_idle_threads(config, parsed.max_idle_threads);
  if (parsed.max_threads != 0) fuse_loop_cfg_set_max_threads(config, parsed.max_threads);
  const int rc = fuse_session_loop_mt(se, config);
  fuse_loop_cfg_destroy(config);
  // The kernel usually unmounted already (umount/fusermount3 -u); this then only closes the
  // device. After a signal it really unmounts.
  fuse_session_unmount(se);
  fuse_remove_signal_handlers(se);
  fuse_session_destroy(se);
  if (rc < 0) {
    spdlog::error("fuse session loop failed: {}", errno_text(-rc));
    return 1;
  }
  spdlog::info("unmounted{}", rc > 0 ? fmt::format(" (signal {})", rc) : std::string());
  return 0;
}

// Not registered by name, so a process may mount (and set this up) more than once.
void log_to_file(const std::string& path) {
  auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path);
  auto logger = std::make_shared<spdlog::logger>("ckptfs", std::move(sink));
  logger->set_level(spdlog::get_level());
  // Every line as it happens: a log read while the mount serves (or after a kill -9) must be
  // whole, and lines are rare (none per read unless something fails).
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(std::move(logger));
}

void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = retry_eintr([&] { return ::write(fd, data.data(), data.size()); });
    if (n <= 0) return;
    data.remove_prefix(static_cast<size_t>(n));
  }
}

// The detached server. Tells the waiting parent "R" once ready, or "E" and why not; never
// returns into the caller's code.
[[noreturn]] void run_daemon(fuse_session* se, const ParsedOptions& parsed,
                             const std::string& log_file, int ready_fd) {
  int rc = 1;
  try {
    if (::chdir("/") != 0) fail("chdir /: {}", errno_text(errno));
    const int null_fd = ::open("/dev/null", O_RDWR);
    if (null_fd < 0) fail("cannot open /dev/null: {}", errno_text(errno));
    if (!log_file.empty()) log_to_file(log_file);
    ::dup2(null_fd, STDIN_FILENO);
    ::dup2(null_fd, STDOUT_FILENO);
    ::dup2(null_fd, STDERR_FILENO);
    if (null_fd > STDERR_FILENO) ::close(null_fd);
    write_all(ready_fd, "R");
    ::close(std::exchange(ready_fd, -1));
    rc = serve(se, parsed);
  } catch (const std::exception& e) {
    if (ready_fd >= 0) {
      write_all(ready_fd, std::string("E") + e.what());
      ::close(ready_fd);
    } else {
      spdlog::error("{}", e.what());
    }
  }
  // Flushed, not shut down: threads the Tree keeps (the steps watcher, the S3 cache's) still run
  // until _exit, and a log line from one after spdlog::shutdown() dereferences the dropped
  // default logger (a SEGV at exit, seen under TSan).
  spdlog::default_logger()->flush();
  ::_exit(rc);
}

// The read_ahead_kb file of a mount's backing device, found through mountinfo because stat()
// on the mount would wait for a server that is not running yet; empty if not found (mountinfo
// escapes spaces, so such paths keep the default).
std::string readahead_knob(const stdfs::path& where) {
  std::ifstream mountinfo("/proc/self/mountinfo");
  for (std::string line; std::getline(mountinfo, line);) {
    std::istringstream fields(line);
    std::string id, parent, device, root, point;
    fields >> id >> parent >> device >> root >> point;
    if (point == where.string()) return "/sys/class/bdi/" + device + "/read_ahead_kb";
  }
  return {};
}

// Undoes the kernel mount from this process: for failures after fuse_session_mount.
[[noreturn]] void abandon_mount(fuse_session* se, const stdfs::path& where,
                                const std::string& why) {
  fuse_session_unmount(se);
  fuse_remove_signal_handlers(se);
  fuse_session_destroy(se);
  fail("cannot mount at {}: {}", where.string(), why);
}

struct MountEntry {
  std::string fstype;
  std::string device;
};

// /proc/mounts escapes space, tab, newline and backslash as \ooo.
std::string unescape_mount_field(std::string_view field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size()) {
      const char* p = field.data() + i + 1;
      if (p[0] >= '0' && p[0] <= '3' && p[1] >= '0' && p[1] <= '7' && p[2] >= '0' && p[2] <= '7') {
        out += static_cast<char>((p[0] - '0') * 64 + (p[1] - '0') * 8 + (p[2] - '0'));
        i += 3;
        continue;
      }
    }
    out += field[i];
  }
  return out;
}

// The topmost mount at `path`, if any.
std::optional<MountEntry> find_mount(const stdfs::path& path) {
  std::ifstream in("/proc/self/mounts");
  std::optional<MountEntry> found;
  std::string device, where, fstype, rest;
  while (in >> device >> where >> fstype) {
    std::getline(in, rest);
    if (unescape_mount_field(where) == path.native())
      found = MountEntry{fstype, unescape_mount_field(device)};
  }
  return found;
}

// Absolute, with symlinks in the parent resolved, without touching the mountpoint itself:
// stat on a mount whose server died fails with ENOTCONN.
stdfs::path resolve_mountpoint(const stdfs::path& mountpoint) {
  stdfs::path absolute = stdfs::absolute(mountpoint).lexically_normal();
  if (!absolute.has_filename() && absolute.has_parent_path()) absolute = absolute.parent_path();
  std::error_code ec;
  const stdfs::path parent = stdfs::canonical(absolute.parent_path(), ec);
  if (ec || absolute == absolute.root_path()) return absolute;
  return parent / absolute.filename();
}

}  // namespace

void check_log_file(const std::string& log_file) {
  if (log_file.empty()) return;
  // A new log is its owner's only: it holds what the status log holds, which may be no more
  // readable than the most private source (status.h); chmod widens it where that is fine.
  try {
    util::open_regular_append(log_file, "log file", 0600);
  } catch (const Error& e) {
    fail("--log-file {}; give a writable path to a regular file", e.what());
  }
}

void prepare_mountpoint(const std::filesystem::path& mountpoint, bool nonempty) {
  const stdfs::path where = resolve_mountpoint(mountpoint);
  // statfs, not stat: the kernel may answer stat of a dead mount from its attribute cache (just
  // after the readers of a killed daemon stat it), statfs always asks the server.
  struct statfs st;
  if (::statfs(where.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOTCONN) {
      const std::optional<MountEntry> entry = find_mount(where);
      if (!entry || entry->fstype != "fuse.ckptfs")
        fail(
            "cannot mount at {}: a FUSE mount whose server is gone is there ({}); unmount it "
            "with fusermount3 -u -z {}",
            where.string(), entry ? entry->fstype : "unknown", where.string());
      spdlog::warn("{}: the ckptfs daemon serving it is gone; detaching that dead mount",
                   where.string());
      unmount(where, /*lazy=*/true);
    } else if (auto kind = util::wrong_kind(where, S_IFDIR)) {  // a symlink loop or dangling
      fail("cannot mount at {}: it is {}, not a directory", where.string(), *kind);
    } else if (err == ENOENT) {
      // Only the last component: a mistyped path must not leave a trail of new directories.
      std::error_code ec;
      if (!stdfs::is_directory(where.parent_path(), ec))
        fail(
            "cannot mount at {}: {} does not exist; create it first (ckptfs creates only the "
            "mountpoint itself)",
            where.string(), where.parent_path().string());
      stdfs::create_directory(where, ec);
      if (ec) fail("cannot mount at {}: cannot create it: {}", where.string(), ec.message());
      spdlog::info("{}: created the mountpoint", where.string());
      return;
    } else {
      fail("cannot mount at {}: {}", where.string(), errno_text(err));
    }
  }
  if (auto kind = util::wrong_kind(where, S_IFDIR))
    fail("cannot mount at {}: it is {}, not a directory", where.string(), *kind);
  std::error_code ec;
  if (nonempty) return;
  if (const std::optional<MountEntry> entry = find_mount(where);
      entry && entry->fstype == "fuse.ckptfs")
    return;  // mount() names the mount already there
  stdfs::directory_iterator it(where, ec);
  if (!ec && it != stdfs::directory_iterator())
    fail(
        "cannot mount at {}: it is not empty (its files would be hidden); mount on an empty "
        "directory, or pass -o nonempty",
        where.string());
}

namespace {

// Step 1: the canonical mountpoint, ready and free (prepare_mountpoint), and the log file
// checked. Throws Error naming the mountpoint.
stdfs::path resolve_mount(const stdfs::path& mountpoint, const ParsedOptions& parsed,
                          const std::string& log_file) {
  prepare_mountpoint(mountpoint, parsed.nonempty);
  std::error_code ec;
  const stdfs::path where = stdfs::canonical(mountpoint, ec);
  if (ec) fail("cannot mount at {}: {}", mountpoint.string(), ec.message());
  if (!stdfs::is_directory(where, ec)) fail("cannot mount at {}: not a directory", where.string());
  // The kernel would stack a second view on the first, and one umount would leave the other.
  if (const std::optional<MountEntry> entry = find_mount(where);
      entry && entry->fstype == "fuse.ckptfs")
    fail("cannot mount at {}: ckptfs already mounted there ({})", where.string(), entry->device);
  try {
    check_log_file(log_file);
  } catch (const Error& e) {
    fail("cannot mount at {}: {}", where.string(), e.what());
  }
  return where;
}

// Step 2: libfuse's arguments: our fixed options, the user's, and "ro" last, so nothing before
// it can turn it off.
std::vector<std::string> fuse_argv(const std::string& fsname, const ParsedOptions& parsed) {
  std::vector<std::string> argv = {
      "ckptfs", "-o",
      "subtype=ckptfs,default_permissions,fsname=" + escape_option("ckptfs:" + fsname)};
  for (const std::string& option : parsed.fuse) {
    argv.push_back("-o");
    argv.push_back(option);
  }
  argv.push_back("-o");
  argv.push_back("ro");
  return argv;
}

// Step 3: the session, its signal handlers and the kernel mount. Throws Error with what libfuse
// said, leaving nothing mounted.
fuse_session* open_session(const std::vector<std::string>& argv, detail::Server& server,
                           const stdfs::path& where) {
  begin_setup();
  FuseArgs args(argv);
  fuse_session* se =
      fuse_session_new(args.get(), &detail::lowlevel_ops(), sizeof(fuse_lowlevel_ops), &server);
  if (se == nullptr) {
    end_setup();
    fail("cannot mount at {}: {}", where.string(), setup_errors("bad FUSE options"));
  }
  if (fuse_set_signal_handlers(se) != 0) {
    fuse_session_destroy(se);
    end_setup();
    fail("cannot mount at {}: cannot install signal handlers", where.string());
  }
  if (fuse_session_mount(se, where.c_str()) != 0) {
    fuse_remove_signal_handlers(se);
    fuse_session_destroy(se);
    end_setup();
    fail("cannot mount at {}: {}", where.string(), setup_errors("mount failed"));
  }
  end_setup();
  return se;
}

// What the parent reads from the daemon's ready pipe until it closes: "R", or "E" and why not.
std::string wait_for_daemon(pid_t child, int ready_fd) {
  int status = 0;
  static_cast<void>(retry_eintr([&] { return ::waitpid(child, &status, 0); }));
  std::string reply;
  char buf[512];
  for (;;) {
    const ssize_t n = retry_eintr([&] { return ::read(ready_fd, buf, sizeof buf); });
    if (n <= 0) break;
    reply.append(buf, static_cast<size_t>(n));
    if (reply == "R") break;  // all a ready server sends
  }
  ::close(ready_fd);
  return reply;
}

// Step 4 (background): forks the daemon that serves `se` and waits until it serves. 0, or
// throws Error after undoing the mount.
int start_daemon(fuse_session* se, const stdfs::path& where, const ParsedOptions& parsed,
                 const std::string& log_file) {
  int ready[2];
  if (::pipe2(ready, O_CLOEXEC) != 0)
    abandon_mount(se, where, fmt::format("pipe: {}", errno_text(errno)));
  const pid_t child = ::fork();
  if (child < 0) {
    ::close(ready[0]);
    ::close(ready[1]);
    abandon_mount(se, where, fmt::format("fork: {}", errno_text(errno)));
  }
  if (child == 0) {
    // Fork twice so the server is nobody's child: the caller reaps the middle process now,
    // and the server is adopted by init instead of lingering as the caller's zombie.
    ::close(ready[0]);
    ::setsid();
    const pid_t daemon = ::fork();
    if (daemon != 0) ::_exit(daemon < 0 ? 1 : 0);
    run_daemon(se, parsed, log_file, ready[1]);
  }
  ::close(ready[1]);
  const std::string reply = wait_for_daemon(child, ready[0]);
  if (reply == "R") {
    // The server holds its own copy of the device fd. Ours must be closed, or the kernel
    // would keep the connection alive if the server died; destroying the session closes it
    // and does not unmount.
    fuse_remove_signal_handlers(se);
    fuse_session_destroy(se);
    return 0;
  }
  if (!reply.empty() && reply[0] == 'E') abandon_mount(se, where, reply.substr(1));
  abandon_mount(se, where,
                log_file.empty()
                    ? std::string("the server exited before it was ready")
                    : fmt::format("the server exited before it was ready (see {})", log_file));
}

}  // namespace

// Over encrypted sources: other users only when asked for by name, and no page cache or splice
// (a spliced run would be ciphertext, and page-cache mode keeps plaintext after the reader).
void restrict_for_encrypted(ParsedOptions& parsed, const MountOptions& options) {
  for (const std::string& o : parsed.fuse)
    if ((o == "allow_other" || o == "allow_root") && !options.allow_other_decrypted)
      fail(
          "-o {}: the sources are encrypted, so other users would read their decrypted bytes; "
          "add --allow-other-decrypted if that is what you want",
          o);
  if (parsed.cache) spdlog::warn("-o cache is off: the sources are encrypted (direct I/O only)");
  if (parsed.splice_named && parsed.splice != Service::Splice::kOff)
    spdlog::warn("-o splice is off: the sources are encrypted (their bytes are decrypted)");
  parsed.cache = false;
  parsed.splice = Service::Splice::kOff;
}

namespace {

// The spool of an S3 mount (spool.h), made before the daemon forks so that a directory named
// with -o s3_spool that cannot hold one fails the mount; null for "off", or when the default
// directory is in memory, all but full or cannot hold one (the ranges are then held in memory,
// with a warning: the daemon's memory grows by up to -o readahead_max's larger default).
std::shared_ptr<Spool> open_spool(const ParsedOptions& parsed) {
  if (parsed.s3_spool == "off") return nullptr;
  const bool named = !parsed.s3_spool.empty();
  std::error_code ec;
  const stdfs::path dir =
      named ? stdfs::absolute(parsed.s3_spool, ec) : stdfs::path(kDefaultSpoolDir);
  const uint64_t free_room = Spool::default_capacity(dir);
  if (named) {
    if (free_room == 0)
      fail("-o s3_spool={}: no room there (not a directory, or its disk is full)", dir.string());
    if (parsed.s3_spool_max > 4 * free_room)
      spdlog::warn(
          "-o s3_spool_max={} MiB: {} has {} MiB free; ranges past that are fetched by their "
          "readers",
          parsed.s3_spool_max >> 20, dir.string(), 4 * free_room >> 20);
    return std::make_shared<Spool>(dir, parsed.s3_spool_max != 0 ? parsed.s3_spool_max : free_room);
  }
  if (Spool::in_memory(dir)) {
    spdlog::warn("S3 ranges held in memory: {} is in memory; -o s3_spool=DIR names a local disk",
                 dir.string());
    return nullptr;
  }
  const uint64_t capacity = parsed.s3_spool_max != 0 ? parsed.s3_spool_max : free_room;
  if (parsed.s3_spool_max == 0 && capacity < kMinDefaultSpool) {
    spdlog::warn(
        "S3 ranges held in memory: {} has {} MiB free; -o s3_spool=DIR names a local disk with "
        "room",
        dir.string(), capacity * 4 >> 20);
    return nullptr;
  }
  try {
    return std::make_shared<Spool>(dir, capacity);
  } catch (const Error& e) {
    spdlog::warn("S3 ranges held in memory: {}", e.what());
    return nullptr;
  }
}

}  // namespace

int mount(const std::filesystem::path& mountpoint, const Tree& tree, const MountOptions& options) {
  ParsedOptions parsed = parse_options(options);
  if (tree.encrypted()) restrict_for_encrypted(parsed, options);
  crypt::set_decrypt_budget(parsed.decrypt_max);
  // A splice would copy the placeholder of an S3 object, not the object.
  if (tree.remote() && parsed.splice != Service::Splice::kOff) {
    if (parsed.splice_named)
      spdlog::warn("-o splice is off: the sources are S3 objects (read with ranged GETs)");
    parsed.splice = Service::Splice::kOff;
  }
  const std::shared_ptr<Spool> spool = tree.remote() ? open_spool(parsed) : nullptr;
  // Ranges held in memory: a larger default bound (Service::default_s3_read_ahead_max).
  if (tree.remote() && !spool && !parsed.read_ahead_max_named)
    parsed.read_ahead_max = Service::default_s3_read_ahead_max();
  std::string log_file;
  if (!options.log_file.empty()) log_file = stdfs::absolute(options.log_file).string();
  const stdfs::path where = resolve_mount(mountpoint, parsed, log_file);
  const std::string fsname = options.fsname.empty() ? common_source_dir(tree) : options.fsname;

  detail::Server server;
  server.service = std::make_unique<Service>(
      tree, options.chosen,
      Service::Options{parsed.cache, parsed.read_ahead && !parsed.cache, parsed.max_read,
                       parsed.splice, parsed.read_ahead_max, parsed.s3_amplify, spool});
  // .ckptfs/log keeps the lines from here on: the mount and the notes on the sources (the
  // daemon forks with them), then whatever the server logs (init hooks the ring to the logger
  // it serves with). This process's logger lets go of it on the way out.
  const std::shared_ptr<spdlog::sinks::sink> ring = server.service->status().log_sink();
  spdlog::default_logger()->sinks().push_back(ring);
  struct Unhook {
    const std::shared_ptr<spdlog::sinks::sink>& ring;
    ~Unhook() { std::erase(spdlog::default_logger()->sinks(), ring); }
  } unhook{ring};

  fuse_session* se = open_session(fuse_argv(fsname, parsed), server, where);
  // Without it, mapped files are served through the page cache (Service::open).
  if (int err = detail::install_device_io(se); err != 0)
    spdlog::warn("cannot hook the FUSE device ({}): mapped files use the page cache",
                 errno_text(-err));
  // Raised at the first open of a file read through the page cache, or one that may be
  // mapped.
  server.service->set_readahead_knob(readahead_knob(where));
  spdlog::info("mounted {} ({} files, {} bytes) from {}", where.string(),
               tree.plan().targets.size(), tree.total_bytes(), fsname);
  if (options.on_mounted) options.on_mounted();

  if (!options.foreground) return start_daemon(se, where, parsed, log_file);
  if (!log_file.empty()) {
    try {
      log_to_file(log_file);
    } catch (const std::exception& e) {
      abandon_mount(se, where, fmt::format("cannot log to {}: {}", log_file, e.what()));
    }
  }
  return serve(se, parsed);
}

void unmount(const std::filesystem::path& mountpoint, bool lazy) {
  const stdfs::path where = resolve_mountpoint(mountpoint);
  const std::optional<MountEntry> entry = find_mount(where);
  if (!entry) fail("cannot unmount {}: not mounted", where.string());
  if (entry->fstype != "fuse.ckptfs")
    fail("cannot unmount {}: not a ckptfs mount (it is {} from {})", where.string(), entry->fstype,
         entry->device);
  if (::geteuid() == 0) {
    if (::umount2(where.c_str(), lazy ? MNT_DETACH : 0) != 0) {
      const int err = errno;
      fail("cannot unmount {}: {}{}", where.string(), errno_text(err),
           err == EBUSY ? " (a file or directory in it is still open; ckptfs umount -z detaches "
                          "it now and finishes once they are closed)"
                        : "");
    }
    return;
  }
  const pid_t pid = ::fork();
  if (pid < 0) fail("cannot unmount {}: fork: {}", where.string(), errno_text(errno));
  if (pid == 0) {
    if (lazy)
      ::execlp("fusermount3", "fusermount3", "-u", "-z", "--", where.c_str(),
               static_cast<char*>(nullptr));
    else
      ::execlp("fusermount3", "fusermount3", "-u", "--", where.c_str(),
               static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  if (retry_eintr([&] { return ::waitpid(pid, &status, 0); }) < 0)
    fail("cannot unmount {}: waitpid: {}", where.string(), errno_text(errno));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
      fail("cannot unmount {}: fusermount3 not found", where.string());
    fail("cannot unmount {}: fusermount3 -u failed (see its message above)", where.string());
  }
}

}  // namespace ckptfs::fs
