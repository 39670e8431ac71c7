#include "ckptfs/index/store.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <future>
#include <mutex>
#include <optional>
#include <set>
#include <utility>

#include "ckptfs/error.h"
#include "ckptfs/index/lmdb.h"
#include "ckptfs/util/open_path.h"
#include "ckptfs/util/remote_fs.h"
#include "entry_codec.h"
#include "index.pb.h"

namespace ckptfs::index {

namespace fs = std::filesystem;

namespace {

// Beyond this a full map is an error rather than another doubling: the index of even a huge
// source is far smaller, so something else is wrong.
constexpr size_t kMaxMapSize = size_t{1} << 40;
// A begin that keeps reporting MDB_MAP_RESIZED after adopting the new size is not going to stop.
constexpr int kMaxResizeRetries = 4;

// mkdir -p with mode 0700 for what it creates: the index holds paths of the user's files.
void make_dirs(const fs::path& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      fail("{}: cannot use as index directory: it is {}, not a directory", dir.string(),
           util::wrong_kind(dir, S_IFDIR).value_or(util::kind_of_mode(st.st_mode)));
    }
    return;
  }
  if (errno != ENOENT) {
    const int err = errno;
    if (auto kind = util::wrong_kind(dir, S_IFDIR))
      fail("{}: cannot use as index directory: it is {}", dir.string(), *kind);
    fail("{}: cannot use as index directory: {}", dir.string(), std::strerror(err));
  }
  if (dir.has_parent_path() && dir.parent_path() != dir) make_dirs(dir.parent_path());
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    fail("{}: cannot create index directory: {}", dir.string(), std::strerror(errno));
  }
}

// FNV-1a: stable across builds and platforms, which std::hash is not promised to be.
std::string path_key(std::string_view path) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : path) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  std::string key(8, '\0');
  for (int i = 0; i < 8; ++i) key[i] = static_cast<char>(h >> (56 - 8 * i));
  return key;
}

// LMDB forbids opening one environment twice in a process (closing either would drop the
// other's locks), so Store refuses instead of corrupting, after waiting up to `patience` for
// the other one to be closed.
class OpenOnce {
 public:
  OpenOnce(const fs::path& dir, std::chrono::milliseconds patience) {
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0) {
      fail("{}: cannot use as index directory: {}", dir.string(), std::strerror(errno));
    }
    id_ = {st.st_dev, st.st_ino};
    std::unique_lock lock(mu());
    if (!closed().wait_for(lock, patience, [&] { return !open().contains(id_); }))
      fail("{}: the index is already open in this process", dir.string());
    open().insert(id_);
  }
  ~OpenOnce() {
    {
      std::lock_guard lock(mu());
      open().erase(id_);
    }
    closed().notify_all();
  }
  OpenOnce(const OpenOnce&) = delete;
  OpenOnce& operator=(const OpenOnce&) = delete;

 private:
  static std::mutex& mu() {
    static std::mutex m;
    return m;
  }
  static std::condition_variable& closed() {
    static std::condition_variable c;
    return c;
  }
  static std::set<std::pair<dev_t, ino_t>>& open() {
    static std::set<std::pair<dev_t, ino_t>> dirs;
    return dirs;
  }
  std::pair<dev_t, ino_t> id_;
};

}  // namespace

bool remove_environment(const fs::path& dir) {
  bool any = false;
  for (const char* name : {"data.mdb", "lock.mdb"}) {
    std::error_code ec;
    any |= fs::remove(dir / name, ec);
    if (ec) fail("{}: cannot remove: {}", (dir / name).string(), ec.message());
  }
  return any;
}

fs::path default_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  // The XDG spec says to ignore a relative value.
  if (xdg && xdg[0] == '/') return fs::path(xdg) / "ckptfs" / "index";
  const char* home = std::getenv("HOME");
  if (home && home[0] != '\0') return fs::path(home) / ".cache" / "ckptfs" / "index";
  fail("no index directory: neither XDG_CACHE_HOME nor HOME is set; pass --index-dir");
}

struct Store::Impl {
  explicit Impl(const fs::path& dir, std::chrono::milliseconds patience = {})
      : once(dir, patience) {}

  bool read_only = false;
  OpenOnce once;  // first member, so the environment is closed before it is released
  lmdb::Env env;
  MDB_dbi scans = 0;
  MDB_dbi paths = 0;
  std::optional<MDB_dbi> targets;  // absent in a shipped index built by an older ckptfs
  // One operation at a time: a map resize is only allowed while this process has no
  // transaction open, and the index is far from any hot path.
  mutable std::mutex mu;
  // sync_in_background's sync; last, so that it is waited for before the environment closes.
  std::future<void> syncing;

  // Callers hold mu.
  lmdb::Txn begin(unsigned flags) {
    for (int attempt = 0; attempt < kMaxResizeRetries; ++attempt) {
      if (std::optional<lmdb::Txn> txn = lmdb::Txn::begin(env, flags)) return std::move(*txn);
      // Another process grew the map past ours; adopt its size.
      env.set_map_size(0);
    }
    fail("{}: the index map keeps being resized by another process", env.dir().string());
  }

  // Callers hold mu and have no transaction open.
  void grow() {
    const size_t size = env.map_size();
    if (size >= kMaxMapSize) {
      fail("{}: the index is full at {} bytes; run `ckptfs index clear`", env.dir().string(), size);
    }
    env.set_map_size(std::min(size * 2, kMaxMapSize));
    spdlog::info("{}: index map grown to {} bytes", env.dir().string(), env.map_size());
  }
};

Store::Store(const fs::path& dir, size_t initial_map_size)
    : Store(dir, initial_map_size, std::chrono::milliseconds(0)) {}

Store Store::open_waiting(const fs::path& dir, std::chrono::milliseconds patience) {
  return Store(dir, kDefaultMapSize, patience);
}

Store::Store(const fs::path& dir, size_t initial_map_size, std::chrono::milliseconds patience) {
  make_dirs(dir);
  impl_ = std::make_unique<Impl>(dir, patience);
  try {
    impl_->env = lmdb::Env::open(dir, initial_map_size, 3, MDB_NOTLS);
  } catch (const Error& e) {
    std::error_code ec;
    if (!fs::exists(dir / "data.mdb", ec)) throw;
    fail("{}; the index is only a cache: `ckptfs index clear --index-dir {}` removes it", e.what(),
         dir.string());
  }
  // Reader slots of processes that died mid-transaction would otherwise pin old pages forever.
  int dead = 0;
  lmdb::check(mdb_reader_check(impl_->env.get(), &dead), dir, "LMDB reader check failed");
  // Usually the databases exist: find them without taking the writer lock or syncing, which a
  // mount would otherwise wait for.
  {
    lmdb::Txn txn = impl_->begin(MDB_RDONLY);
    const std::optional<MDB_dbi> scans = txn.open_db(kScansDb, 0);
    const std::optional<MDB_dbi> paths = txn.open_db(kPathsDb, 0);
    const std::optional<MDB_dbi> targets = txn.open_db(kTargetsDb, 0);
    if (scans && paths && targets && txn.commit()) {  // a read-only commit keeps the handles open
      impl_->scans = *scans;
      impl_->paths = *paths;
      impl_->targets = *targets;
      return;
    }
  }
  for (;;) {
    lmdb::Txn txn = impl_->begin(0);
    impl_->scans = *txn.open_db(kScansDb, MDB_CREATE);
    impl_->paths = *txn.open_db(kPathsDb, MDB_CREATE);
    impl_->targets = *txn.open_db(kTargetsDb, MDB_CREATE);
    if (txn.commit()) break;
    impl_->grow();
  }
}

Store Store::open_shipped(const fs::path& dir) {
  util::require_directory(dir, "index directory (--index)");
  if (auto kind = util::wrong_kind(dir / "data.mdb", S_IFREG))
    util::refuse_kind(dir / "data.mdb", "index file (--index)", *kind, S_IFREG);
  std::error_code ec;
  if (!fs::is_regular_file(dir / "data.mdb", ec))
    fail("--index {}: no data.mdb there; build the index with `ckptfs index build SRC --output {}`",
         dir.string(), dir.string());
  Store store;
  store.impl_ = std::make_unique<Impl>(dir);
  store.impl_->read_only = true;
  // No lock file: nodes share the index on storage that may be read-only and lock nothing.
  try {
    store.impl_->env =
        lmdb::Env::open(dir, kDefaultMapSize, 3, MDB_RDONLY | MDB_NOLOCK | MDB_NOTLS);
  } catch (const Error& e) {
    fail("--index {}; rebuild it with `ckptfs index build SRC --output {}`", e.what(),
         dir.string());
  }
  lmdb::Txn txn = store.impl_->begin(MDB_RDONLY);
  const std::optional<MDB_dbi> scans = txn.open_db(kScansDb, 0);
  const std::optional<MDB_dbi> paths = txn.open_db(kPathsDb, 0);
  store.impl_->targets = txn.open_db(kTargetsDb, 0);
  if (!scans || !paths || !txn.commit())
    fail("--index {}: not a ckptfs index; build one with `ckptfs index build SRC --output {}`",
         dir.string(), dir.string());
  store.impl_->scans = *scans;
  store.impl_->paths = *paths;
  return store;
}

bool Store::read_only() const { return impl_->read_only; }

std::optional<scan::FileScan> Store::lookup_path(const std::string& path, uint64_t size,
                                                 int64_t mtime_ns, std::string& why,
                                                 StructureDigest& structure,
                                                 source::Fingerprint* stored_out) const {
  std::string bytes;
  source::Fingerprint stored;
  {
    std::lock_guard lock(impl_->mu);
    const lmdb::Txn txn = impl_->begin(MDB_RDONLY);
    const std::optional<std::string_view> at = txn.get(impl_->paths, path_key(path));
    const size_t n = source::Fingerprint::kKeySize;
    if (!at || at->size() <= n || at->substr(n) != path) {
      why = "has no entry for it";
      return std::nullopt;
    }
    stored = *source::Fingerprint::from_key(at->substr(0, n));
    const std::optional<std::string_view> value = txn.get(impl_->scans, at->substr(0, n));
    if (!value) {
      why = "has a damaged entry for it";
      return std::nullopt;
    }
    bytes.assign(*value);
  }
  if (stored.size != size || stored.mtime_ns != mtime_ns) {
    why = fmt::format("was built when it had {} bytes and mtime {} ns; it has {} and {} now",
                      stored.size, stored.mtime_ns, size, mtime_ns);
    return std::nullopt;
  }
  std::optional<scan::FileScan> scan = decode_entry(bytes, size, &why, &structure, path);
  if (!scan) why = "holds an unusable entry for it (" + why + ")";
  if (stored_out) *stored_out = stored;
  return scan;
}

std::optional<source::Fingerprint> Store::fingerprint(const std::string& path) const {
  std::lock_guard lock(impl_->mu);
  const lmdb::Txn txn = impl_->begin(MDB_RDONLY);
  const std::optional<std::string_view> at = txn.get(impl_->paths, path_key(path));
  const size_t n = source::Fingerprint::kKeySize;
  if (!at || at->size() <= n || at->substr(n) != path) return std::nullopt;
  return source::Fingerprint::from_key(at->substr(0, n));
}

namespace {

std::string rank_key(int64_t rank) {
  std::string key(8, '\0');
  for (int i = 0; i < 8; ++i)
    key[i] = static_cast<char>(static_cast<uint64_t>(rank) >> (56 - 8 * i));
  return key;
}

}  // namespace

void Store::put_targets(std::string_view view_key, std::string_view files,
                        std::span<const TargetSummary> targets,
                        std::span<const std::pair<std::string, std::string>> extra) {
  if (impl_->read_only) fail("{}: a shipped index is never written by a mount", dir().string());
  std::vector<std::pair<std::string, std::string>> encoded;
  encoded.reserve(targets.size());
  for (const TargetSummary& t : targets) encoded.emplace_back(rank_key(t.rank), encode_target(t));
  std::lock_guard lock(impl_->mu);
  for (;;) {
    lmdb::Txn txn = impl_->begin(0);
    const auto put_all = [&] {
      if (!txn.drop(*impl_->targets)) return false;
      for (const auto& [key, value] : encoded)
        if (!txn.put(*impl_->targets, key, value)) return false;
      for (const auto& [key, value] : extra)
        if (!txn.put(*impl_->targets, key, value)) return false;
      return txn.put(*impl_->targets, kTargetsViewKey, view_key) &&
             txn.put(*impl_->targets, kTargetsFilesKey, files) && txn.commit();
    };
    if (put_all()) return;
    txn.abort();
    impl_->grow();
  }
}

std::optional<std::string> Store::targets_value(std::string_view key) const {
  if (!impl_->targets) return std::nullopt;
  std::lock_guard lock(impl_->mu);
  const lmdb::Txn txn = impl_->begin(MDB_RDONLY);
  const std::optional<std::string_view> value = txn.get(*impl_->targets, key);
  if (!value) return std::nullopt;
  return std::string(*value);
}

std::optional<std::string> Store::targets_view() const { return targets_value(kTargetsViewKey); }

std::optional<std::string> Store::targets_files() const { return targets_value(kTargetsFilesKey); }

std::optional<std::string> Store::targets_extra(std::string_view key) const {
  return targets_value(key);
}

std::optional<TargetSummary> Store::target(int64_t rank) const {
  if (!impl_->targets) return std::nullopt;
  std::string bytes;
  {
    std::lock_guard lock(impl_->mu);
    const lmdb::Txn txn = impl_->begin(MDB_RDONLY);
    const std::optional<std::string_view> value = txn.get(*impl_->targets, rank_key(rank));
    if (!value) return std::nullopt;
    bytes.assign(*value);
  }
  return decode_target(bytes, rank);
}

Store::~Store() = default;
Store::Store(Store&&) noexcept = default;
Store& Store::operator=(Store&&) noexcept = default;

const fs::path& Store::dir() const { return impl_->env.dir(); }

std::optional<scan::FileScan> Store::lookup(const source::Fingerprint& fingerprint) const {
  std::string bytes;
  {
    // Only the LMDB read takes turns; decoding a copy runs in parallel across callers.
    std::lock_guard lock(impl_->mu);
    const lmdb::Txn txn = impl_->begin(MDB_RDONLY);
    const std::optional<std::string_view> value = txn.get(impl_->scans, fingerprint.key());
    if (!value) return std::nullopt;
    bytes.assign(*value);
  }
  std::string why;
  std::optional<scan::FileScan> scan = decode_entry(bytes, fingerprint.size, &why);
  if (!scan)
    spdlog::warn("{}: an index entry is unusable ({}); scanning the file again", dir().string(),
                 why);
  return scan;
}

void Store::insert(std::span<const NewEntry> items) {
  if (impl_->read_only) fail("{}: a shipped index is never written by a mount", dir().string());
  struct Encoded {
    std::string path_key;
    std::string path_value;  // scan key, then path
    std::string scan_key;
    std::string scan_value;
  };
  std::vector<Encoded> encoded;
  encoded.reserve(items.size());
  for (const NewEntry& item : items) {
    if (!item.scan) fail("{}: no scan given for {}", dir().string(), item.path);
    Encoded& e = encoded.emplace_back();
    e.path_key = path_key(item.path);
    e.scan_key = item.fingerprint.key();
    e.path_value = e.scan_key + item.path;
    e.scan_value = encode_entry(item.path, *item.scan, item.structure);
  }
  if (encoded.empty()) return;

  std::lock_guard lock(impl_->mu);
  const auto put_all = [&](lmdb::Txn& txn) {
    for (const Encoded& e : encoded) {
      if (std::optional<std::string_view> old = txn.get(impl_->paths, e.path_key)) {
        const size_t n = source::Fingerprint::kKeySize;
        // Hash collisions between paths are harmless: the old entry is only dropped when the
        // stored path is really this one.
        if (old->size() > n && old->substr(n) == std::string_view(e.path_value).substr(n) &&
            old->substr(0, n) != e.scan_key) {
          const std::string stale(old->substr(0, n));
          if (!txn.del(impl_->scans, stale)) return false;
        }
      }
      if (!txn.put(impl_->scans, e.scan_key, e.scan_value)) return false;
      if (!txn.put(impl_->paths, e.path_key, e.path_value)) return false;
    }
    return txn.commit();
  };
  for (;;) {
    lmdb::Txn txn = impl_->begin(0);
    if (put_all(txn)) return;
    txn.abort();
    impl_->grow();
  }
}

void Store::defer_sync(bool on) {
  if (impl_->read_only) return;
  std::lock_guard lock(impl_->mu);
  lmdb::check(mdb_env_set_flags(impl_->env.get(), MDB_NOSYNC, on ? 1 : 0), dir(),
              "cannot set MDB_NOSYNC");
  if (!on) lmdb::check(mdb_env_sync(impl_->env.get(), 1), dir(), "cannot sync the index");
}

void Store::sync_in_background() {
  if (impl_->read_only) return;
  std::lock_guard lock(impl_->mu);
  lmdb::check(mdb_env_set_flags(impl_->env.get(), MDB_NOSYNC, 0), dir(), "cannot set MDB_NOSYNC");
  // Outside `mu`: readers go on while the pages reach the disk. A later commit syncs by itself
  // (LMDB's commit writes its pages, syncs the file, then writes the meta page), so this only
  // starts the write-back early; a map resize remaps the file, which a sync does not mind.
  impl_->syncing = std::async(std::launch::async, [env = impl_->env.get(), dir = dir()] {
    lmdb::check(mdb_env_sync(env, 1), dir, "cannot sync the index");
  });
}

void Store::wait_synced() {
  std::future<void> syncing;
  {
    std::lock_guard lock(impl_->mu);
    syncing = std::move(impl_->syncing);
  }
  if (syncing.valid()) syncing.get();
}

std::vector<Entry> Store::entries(std::vector<std::string>* unreadable) const {
  std::vector<Entry> out;
  {
    std::lock_guard lock(impl_->mu);
    const lmdb::Txn txn = impl_->begin(MDB_RDONLY);
    lmdb::Cursor cursor(txn, impl_->scans);
    std::string_view key, value;
    indexpb::ScannedFile file;
    while (cursor.next(key, value)) {
      const std::optional<source::Fingerprint> fingerprint = source::Fingerprint::from_key(key);
      const std::optional<std::string_view> message = checked_message(value);
      if (!fingerprint || !message ||
          !file.ParseFromArray(message->data(), static_cast<int>(message->size())) ||
          file.format_version() != kFormatVersion) {
        if (unreadable) unreadable->emplace_back(key);
        continue;
      }
      out.push_back(Entry{file.path(), *fingerprint, static_cast<uint64_t>(file.params_size())});
    }
  }
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) {
    return a.path != b.path ? a.path < b.path : a.fingerprint.key() < b.fingerprint.key();
  });
  return out;
}

size_t Store::remove(std::span<const std::string> keys) {
  if (impl_->read_only) fail("{}: a shipped index is never written by a mount", dir().string());
  if (keys.empty()) return 0;
  const std::set<std::string_view> doomed(keys.begin(), keys.end());
  std::lock_guard lock(impl_->mu);
  for (;;) {
    lmdb::Txn txn = impl_->begin(0);
    size_t removed = 0;
    bool ok = true;
    for (const std::string_view key : doomed) {
      if (!txn.get(impl_->scans, key)) continue;
      ok = ok && txn.del(impl_->scans, key);
      ++removed;
    }
    // A path record names its scan by key; one naming a removed scan would only mislead.
    std::vector<std::string> paths;
    {
      lmdb::Cursor cursor(txn, impl_->paths);
      std::string_view key, value;
      while (cursor.next(key, value))
        if (value.size() >= source::Fingerprint::kKeySize &&
            doomed.count(value.substr(0, source::Fingerprint::kKeySize)))
          paths.emplace_back(key);
    }
    for (const std::string& key : paths) ok = ok && txn.del(impl_->paths, key);
    if (ok && txn.commit()) return removed;
    txn.abort();
    impl_->grow();
  }
}

Freshness freshness(const Entry& entry) {
  // Keyed by URL, size and ETag: only a request to the store could tell (and the index keeps no
  // endpoint or keys); a changed object has another ETag, so a stale entry is never used.
  if (entry.path.starts_with("s3://")) return {Freshness::kUnknown, std::string(kNotChecked)};
  struct stat st;
  if (::stat(entry.path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return {Freshness::kGone, "file missing"};
    return {Freshness::kUnknown, fmt::format("cannot be checked: {}", std::strerror(errno))};
  }
  const source::Fingerprint& was = entry.fingerprint;
  const source::Fingerprint now = source::Fingerprint::from_stat(st);
  if (!S_ISREG(st.st_mode)) return {Freshness::kGone, "no longer a regular file"};
  if (now.size != was.size)
    return {Freshness::kChanged, fmt::format("size changed: {} -> {} bytes", was.size, now.size)};
  if (now.mtime_ns != was.mtime_ns) return {Freshness::kChanged, "mtime changed"};
  // Another device and inode with the ctime kept is the filesystem renumbering (a FUSE or
  // network filesystem); the index still serves the entry (lookup_cached). A FUSE daemon reports
  // whatever ctime it likes (s3fs's `touch -d` sets it back), so there the attributes only say
  // the entry may be current: a mount compares the file's structure bytes before using it.
  if (now.ctime_ns == was.ctime_ns) {
    if (on_fuse_filesystem(entry.path.c_str())) return {Freshness::kCurrent, std::string(kOnFuse)};
    return {};
  }
  if (now.ino != was.ino || now.dev != was.dev)
    return {Freshness::kChanged, "replaced by another file (inode changed)"};
  return {Freshness::kChanged, "rewritten or its attributes changed (ctime changed)"};
}

size_t Store::clear() {
  if (impl_->read_only) fail("{}: a shipped index is never written by a mount", dir().string());
  std::lock_guard lock(impl_->mu);
  for (;;) {
    lmdb::Txn txn = impl_->begin(0);
    const size_t removed = txn.count(impl_->scans);
    if (txn.drop(impl_->scans) && txn.drop(impl_->paths) &&
        (!impl_->targets || txn.drop(*impl_->targets)) && txn.commit())
      return removed;
    txn.abort();
    impl_->grow();
  }
}

}  // namespace ckptfs::index
