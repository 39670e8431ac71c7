#include "ckptfs/index/lmdb.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ckptfs/error.h"
#include "ckptfs/util/eintr.h"
#include "ckptfs/util/fd.h"
#include "ckptfs/util/open_path.h"

namespace ckptfs::index::lmdb {

namespace {

MDB_val val(std::string_view bytes) {
  return MDB_val{bytes.size(), const_cast<char*>(bytes.data())};
}

std::string_view view(const MDB_val& v) {
  return std::string_view(static_cast<const char*>(v.mv_data), v.mv_size);
}

// LMDB reports a short write as EIO, which is how a full filesystem shows on a commit; say so
// when the index's filesystem has (next to) no room left.
bool filesystem_full(const std::filesystem::path& dir) {
  struct statvfs fs;
  return ::statvfs(dir.c_str(), &fs) == 0 &&
         static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize < (uint64_t{1} << 20);
}

// LMDB maps lock.mdb and writes its reader table through the mapping: on a filesystem with no
// free block (a full tmpfs) that write is a SIGBUS, not an error. Allocating the blocks first
// turns it into ENOSPC. KEEP_SIZE: LMDB reads its reader count from the file's size, which a
// process already using the file must keep seeing.
void allocate_lock_file(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / "lock.mdb";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!fd) return;  // a read-only place: mdb_env_open says so in its own words
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return;
  const off_t bytes = std::max<off_t>(st.st_size, static_cast<off_t>(kLockFileBytes));
  if (retry_eintr([&] { return ::fallocate(fd.get(), FALLOC_FL_KEEP_SIZE, 0, bytes); }) == 0 ||
      errno != ENOSPC)
    return;  // done, or a filesystem without fallocate (LMDB's ftruncate then)
  fail("{}: cannot allocate the index's lock file: {} (the index's filesystem is full)",
       path.string(), std::strerror(ENOSPC));
}

// Where this process mapped data.mdb (the file `st` describes); null if /proc/self/maps does not
// say. The device is not compared: an overlay shows its lower layer's there.
const char* mapping_of(const struct stat& st) {
  std::FILE* maps = std::fopen("/proc/self/maps", "re");
  if (maps == nullptr) return nullptr;
  const char* found = nullptr;
  char line[4096];
  while (found == nullptr && std::fgets(line, sizeof line, maps)) {
    unsigned long start = 0, end = 0, offset = 0, inode = 0;
    unsigned major = 0, minor = 0;
    char perms[8];
    if (std::sscanf(line, "%lx-%lx %7s %lx %x:%x %lu", &start, &end, perms, &offset, &major, &minor,
                    &inode) == 7 &&
        inode == st.st_ino && offset == 0 && std::strstr(line, "/data.mdb") != nullptr)
      found = reinterpret_cast<const char*>(start);
  }
  std::fclose(maps);
  return found;
}

constexpr unsigned kProbeMaxDbs = 64;

// The walk probe() runs in its child; "" if every check holds.
std::string walk(const std::filesystem::path& dir, size_t map_size, unsigned max_dbs,
                 unsigned flags) {
  MDB_env* env = nullptr;
  int rc = mdb_env_create(&env);
  // Room for whatever named databases the main database lists, however few the caller opens.
  if (rc == 0) rc = mdb_env_set_maxdbs(env, std::max(max_dbs, kProbeMaxDbs));
  if (rc == 0) rc = mdb_env_set_mapsize(env, map_size);
  if (rc == 0) rc = mdb_env_open(env, dir.c_str(), flags | MDB_RDONLY, 0600);
  // An environment LMDB refuses to open (not an LMDB file, no permission) fails the same way,
  // without crashing, in the caller's own mdb_env_open, which says so in LMDB's words.
  if (rc != 0) return "";
  MDB_envinfo info;
  mdb_env_info(env, &info);
  mdb_filehandle_t fd = -1;
  struct stat st;
  if (mdb_env_get_fd(env, &fd) != 0 || ::fstat(fd, &st) != 0) return "data.mdb cannot be stat'ed";
  // LMDB does not tell where it mapped the file (me_mapaddr is only set for MDB_FIXEDMAP): the
  // mapping of data.mdb's inode in /proc/self/maps does.
  const char* begin = mapping_of(st);
  if (begin == nullptr) return "";  // no /proc: the walk cannot check, so it does not judge
  const char* end = begin + st.st_size;
  const auto inside = [&](const MDB_val& v) {
    const char* p = static_cast<const char*>(v.mv_data);
    return v.mv_size == 0 || (p >= begin && p <= end && v.mv_size <= static_cast<size_t>(end - p));
  };
  MDB_txn* txn = nullptr;
  if ((rc = mdb_txn_begin(env, nullptr, MDB_RDONLY, &txn)) != 0) return mdb_strerror(rc);
  // Each database's keys; the main database's name the named ones. Opening the main database
  // by name sets its key order, which mdb_get needs.
  MDB_dbi main_db = 0;
  if ((rc = mdb_dbi_open(txn, nullptr, 0, &main_db)) != 0) return mdb_strerror(rc);
  std::vector<MDB_dbi> dbs{0, main_db};  // the free list (FREE_DBI), the main database
  for (size_t d = 0; d < dbs.size(); ++d) {
    MDB_cursor* cursor = nullptr;
    if ((rc = mdb_cursor_open(txn, dbs[d], &cursor)) != 0) return mdb_strerror(rc);
    MDB_val k, v;
    std::string previous;
    for (MDB_cursor_op op = MDB_FIRST; (rc = mdb_cursor_get(cursor, &k, &v, op)) == 0;
         op = MDB_NEXT) {
      if (!inside(k) || !inside(v)) return "a key or value lies outside data.mdb";
      std::string key(static_cast<const char*>(k.mv_data), k.mv_size);
      if (dbs[d] == 0) {  // the free list: keys are transaction ids in native order
        if (k.mv_size != sizeof(size_t)) return "a malformed free list";
        size_t id = 0;
        std::memcpy(&id, k.mv_data, sizeof id);
        key.assign(sizeof id, '\0');
        for (size_t i = 0; i < sizeof id; ++i)
          key[i] = static_cast<char>(id >> (8 * (sizeof id - 1 - i)));
      }
      if (op == MDB_NEXT && key <= previous) return "keys out of order";
      previous = key;
      if (dbs[d] == 0) {  // a free-list entry: a count, then that many page numbers
        if (v.mv_size % sizeof(size_t) != 0 || v.mv_size == 0) return "a malformed free list";
        std::vector<size_t> pages(v.mv_size / sizeof(size_t));
        std::memcpy(pages.data(), v.mv_data, v.mv_size);
        if (pages[0] != pages.size() - 1) return "a malformed free list";
        for (size_t i = 1; i < pages.size(); ++i)
          if (pages[i] > info.me_last_pgno) return "a free page past the end of data.mdb";
        continue;
      }
      MDB_val again = k, found;
      if (mdb_get(txn, dbs[d], &again, &found) != 0 || found.mv_data != v.mv_data)
        return "a key is not found again";
      if (dbs[d] == main_db && key.find('\0') == std::string::npos) {  // a named database
        MDB_dbi named = 0;
        if ((rc = mdb_dbi_open(txn, key.c_str(), 0, &named)) == MDB_DBS_FULL) break;
        if (rc != 0) return mdb_strerror(rc);
        dbs.push_back(named);
      }
    }
    if (rc != MDB_NOTFOUND) return mdb_strerror(rc);
    mdb_cursor_close(cursor);
  }
  return "";
}

// The variable that makes this program the probe's child: "FD FLAGS MAX_DBS MAP_SIZE DIR".
constexpr const char* kProbeVariable = "CKPTFS_INDEX_PROBE";
constexpr int kProbeFd = 3;

// In the probe's child (any program holding this file, run by probe()): walks the index, writes
// why it failed ("" if it did not) to the pipe, and ends the process before main. The child
// dies of what a damaged page does to LMDB, silently: its assertion text is not for this walk.
__attribute__((constructor)) void probe_child() {
  const char* spec = std::getenv(kProbeVariable);
  if (spec == nullptr) return;
  int fd = -1, consumed = 0;
  unsigned flags = 0, max_dbs = 0;
  unsigned long long map_size = 0;
  if (std::sscanf(spec, "%d %u %u %llu %n", &fd, &flags, &max_dbs, &map_size, &consumed) != 4)
    ::_exit(2);
  // Default actions, not a handler a runtime (a sanitizer's) installed before main.
  for (int sig : {SIGABRT, SIGBUS, SIGSEGV, SIGFPE, SIGILL}) ::signal(sig, SIG_DFL);
  const int null = ::open("/dev/null", O_WRONLY);
  if (null >= 0) ::dup2(null, STDERR_FILENO);
  std::string why;
  try {
    why = walk(spec + consumed, map_size, max_dbs, flags);
  } catch (...) {
    why = "out of memory";
  }
  const ssize_t n = ::write(fd, why.data(), why.size());
  ::_exit(n == static_cast<ssize_t>(why.size()) ? 0 : 1);
}

// A probe that takes longer than this is taken for a walk caught in a loop of damaged pages.
constexpr auto kProbeTimeout = std::chrono::seconds(60);

// probe() once per version of a data.mdb in this process: a mount plans ranks one by one from
// the same shipped index, and running the program anew for each walk costs milliseconds.
std::string probe_once(const std::filesystem::path& dir, size_t map_size, unsigned max_dbs,
                       unsigned flags) {
  struct stat st;
  if (::stat((dir / "data.mdb").c_str(), &st) != 0 || !S_ISREG(st.st_mode))
    return "";  // a new environment, or one mdb_env_open refuses in its own words
  using Key = std::tuple<dev_t, ino_t, off_t, int64_t, int64_t, int64_t, int64_t>;
  const Key key{st.st_dev,          st.st_ino,         st.st_size,        st.st_mtim.tv_sec,
                st.st_mtim.tv_nsec, st.st_ctim.tv_sec, st.st_ctim.tv_nsec};
  static std::mutex mu;
  static std::map<Key, std::string> seen;
  {
    std::lock_guard lock(mu);
    if (auto it = seen.find(key); it != seen.end()) return it->second;
  }
  std::string why = probe(dir, map_size, max_dbs, flags);
  std::lock_guard lock(mu);
  seen.emplace(key, why);
  return why;
}

}  // namespace

std::string probe(const std::filesystem::path& dir, size_t map_size, unsigned max_dbs,
                  unsigned flags) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    fail("{}: cannot check the index: pipe: {}", dir.string(), std::strerror(errno));
  UniqueFd read_end(fds[0]), write_end(fds[1]);
  // The walk runs in a fresh copy of this program, never in a bare fork: a child forked while
  // another thread holds a lock (a sanitizer's allocator, say, which a fork does not reset)
  // waits for it for ever. probe_child() above, run before main, does the walk there.
  const std::string ours = fmt::format("{}=", kProbeVariable);
  std::vector<std::string> env_text;
  for (char** e = environ; *e != nullptr; ++e)
    if (!std::string_view(*e).starts_with(ours)) env_text.emplace_back(*e);
  env_text.push_back(fmt::format("{}={} {} {} {} {}", kProbeVariable, kProbeFd, flags, max_dbs,
                                 map_size, dir.string()));
  std::vector<char*> envp;
  for (std::string& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  char name[] = "ckptfs-index-probe";
  char* argv[] = {name, nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, write_end.get(), kProbeFd);  // without O_CLOEXEC
  pid_t pid = 0;
  const int spawned = ::posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0)
    fail("{}: cannot check the index: cannot run /proc/self/exe: {}", dir.string(),
         std::strerror(spawned));
  write_end = UniqueFd();
  std::string why;
  const auto deadline = std::chrono::steady_clock::now() + kProbeTimeout;
  bool timed_out = false;
  for (char buf[256];;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{read_end.get(), POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    const ssize_t n = retry_eintr([&] { return ::read(read_end.get(), buf, sizeof buf); });
    if (n <= 0) break;
    why.append(buf, static_cast<size_t>(n));
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) return "reading it did not finish";
  if (WIFSIGNALED(status))
    return fmt::format("reading it crashed ({})", ::strsignal(WTERMSIG(status)));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return "reading it failed";
  return why;
}

void check(int rc, const std::filesystem::path& dir, std::string_view what) {
  if (rc == MDB_SUCCESS) return;
  if ((rc == EIO || rc == ENOSPC) && filesystem_full(dir))
    fail("{}: {}: {} (the index's filesystem is full)", dir.string(), what, std::strerror(ENOSPC));
  fail("{}: {}: {}", dir.string(), what, mdb_strerror(rc));
}

Env Env::open(const std::filesystem::path& dir, size_t map_size, unsigned max_dbs, unsigned flags) {
  // LMDB opens and maps its two files whatever they are: a FIFO or a device (/dev/zero maps
  // without end) in their place is refused here, naming it.
  util::require_directory(dir, "index directory");
  for (const char* name : {"data.mdb", "lock.mdb"})
    if (auto kind = util::wrong_kind(dir / name, S_IFREG))
      util::refuse_kind(dir / name, "index file", *kind, S_IFREG);
  Env env;  // closes the handle if a step below throws
  env.dir_ = dir;
  check(mdb_env_create(&env.env_), dir, "cannot create the LMDB environment");
  check(mdb_env_set_maxdbs(env.env_, max_dbs), dir, "cannot set the LMDB database count");
  check(mdb_env_set_mapsize(env.env_, map_size), dir, "cannot set the LMDB map size");
  if (!(flags & MDB_NOLOCK)) allocate_lock_file(dir);
  if (const std::string why = probe_once(dir, map_size, max_dbs, flags); !why.empty())
    fail("{}: the index is damaged: {}", dir.string(), why);
  check(mdb_env_open(env.env_, dir.c_str(), flags, 0600), dir, "cannot open the LMDB environment");
  return env;
}

Env::Env(Env&& other) noexcept
    : env_(std::exchange(other.env_, nullptr)), dir_(std::move(other.dir_)) {}

Env& Env::operator=(Env&& other) noexcept {
  if (this != &other) {
    if (env_) mdb_env_close(env_);
    env_ = std::exchange(other.env_, nullptr);
    dir_ = std::move(other.dir_);
  }
  return *this;
}

Env::~Env() {
  if (env_) mdb_env_close(env_);
}

size_t Env::map_size() const {
  MDB_envinfo info;
  check(mdb_env_info(env_, &info), dir_, "cannot read the LMDB map size");
  return info.me_mapsize;
}

void Env::set_map_size(size_t bytes) {
  check(mdb_env_set_mapsize(env_, bytes), dir_, "cannot resize the LMDB map");
}

std::optional<Txn> Txn::begin(const Env& env, unsigned flags) {
  MDB_txn* txn = nullptr;
  const int rc = mdb_txn_begin(env.get(), nullptr, flags, &txn);
  if (rc == MDB_MAP_RESIZED) return std::nullopt;
  check(rc, env.dir(), "cannot begin an LMDB transaction");
  return Txn(txn, env.dir());
}

Txn::Txn(Txn&& other) noexcept
    : txn_(std::exchange(other.txn_, nullptr)), dir_(std::move(other.dir_)) {}

Txn& Txn::operator=(Txn&& other) noexcept {
  if (this != &other) {
    abort();
    txn_ = std::exchange(other.txn_, nullptr);
    dir_ = std::move(other.dir_);
  }
  return *this;
}

Txn::~Txn() { abort(); }

std::optional<MDB_dbi> Txn::open_db(const char* name, unsigned flags) {
  MDB_dbi dbi = 0;
  const int rc = mdb_dbi_open(txn_, name, flags, &dbi);
  if (rc == MDB_NOTFOUND) return std::nullopt;
  check(rc, dir_, fmt::format("cannot open LMDB database \"{}\"", name ? name : ""));
  return dbi;
}

std::optional<std::string_view> Txn::get(MDB_dbi dbi, std::string_view key) const {
  MDB_val k = val(key);
  MDB_val v;
  const int rc = mdb_get(txn_, dbi, &k, &v);
  if (rc == MDB_NOTFOUND) return std::nullopt;
  check(rc, dir_, "LMDB get failed");
  return view(v);
}

bool Txn::put(MDB_dbi dbi, std::string_view key, std::string_view value) {
  MDB_val k = val(key);
  MDB_val v = val(value);
  const int rc = mdb_put(txn_, dbi, &k, &v, 0);
  if (rc == MDB_MAP_FULL) return false;
  check(rc, dir_, "LMDB put failed");
  return true;
}

bool Txn::del(MDB_dbi dbi, std::string_view key) {
  MDB_val k = val(key);
  const int rc = mdb_del(txn_, dbi, &k, nullptr);
  if (rc == MDB_MAP_FULL) return false;
  if (rc != MDB_NOTFOUND) check(rc, dir_, "LMDB delete failed");
  return true;
}

bool Txn::drop(MDB_dbi dbi) {
  const int rc = mdb_drop(txn_, dbi, 0);
  if (rc == MDB_MAP_FULL) return false;
  check(rc, dir_, "LMDB drop failed");
  return true;
}

size_t Txn::count(MDB_dbi dbi) const {
  MDB_stat stat;
  check(mdb_stat(txn_, dbi, &stat), dir_, "LMDB stat failed");
  return stat.ms_entries;
}

bool Txn::commit() {
  // mdb_txn_commit frees the transaction whatever it returns.
  const int rc = mdb_txn_commit(std::exchange(txn_, nullptr));
  if (rc == MDB_MAP_FULL) return false;
  check(rc, dir_, "LMDB commit failed");
  return true;
}

void Txn::abort() {
  if (txn_) mdb_txn_abort(std::exchange(txn_, nullptr));
}

Cursor::Cursor(const Txn& txn, MDB_dbi dbi) : dir_(txn.dir()) {
  check(mdb_cursor_open(txn.get(), dbi, &cursor_), dir_, "cannot open an LMDB cursor");
}

Cursor::~Cursor() {
  if (cursor_) mdb_cursor_close(cursor_);
}

bool Cursor::next(std::string_view& key, std::string_view& value) {
  MDB_val k, v;
  const int rc = mdb_cursor_get(cursor_, &k, &v, started_ ? MDB_NEXT : MDB_FIRST);
  started_ = true;
  if (rc == MDB_NOTFOUND) return false;
  check(rc, dir_, "LMDB cursor step failed");
  key = view(k);
  value = view(v);
  return true;
}

}  // namespace ckptfs::index::lmdb
