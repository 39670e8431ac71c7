#include "ckptfs/index/lmdb.h"

#include <sys/statvfs.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "ckptfs/error.h"
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

}  // namespace

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
