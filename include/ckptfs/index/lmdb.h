// Minimal RAII over the LMDB C API, for the index. Every failure becomes an Error naming the
// environment's directory, the operation and mdb_strerror's text; the two outcomes a caller
// must act on (a full map, a key not found) are return values instead.
//
// Thread-safety is LMDB's: one Env may be used from many threads at once (begin a Txn each; the
// index opens it MDB_NOTLS), but a Txn and its Cursors belong to one thread at a time.
#pragma once

#include <lmdb.h>

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace ckptfs::index::lmdb {

// Throws Error "<dir>: <what>: <mdb_strerror(rc)>" unless rc is MDB_SUCCESS.
void check(int rc, const std::filesystem::path& dir, std::string_view what);

// The size LMDB gives a new lock file (its default 126 reader slots of 64 bytes, after the
// 192-byte table header).
inline constexpr size_t kLockFileBytes = 8192;

// Whether LMDB can read the environment in `dir` without crashing this process. LMDB keeps no
// checksums: a damaged page makes it abort on an assertion, fault, or hand out a value past the
// end of data.mdb. So a child process (this program run anew from /proc/self/exe, never a bare
// fork, which could inherit a lock another thread holds) opens the environment (as `flags` say:
// MDB_NOLOCK for a shipped index, else registered as a reader, so that a concurrent writer cannot
// recycle the pages it walks) and walks every database, the free list included, with a cursor:
// every key must ascend and be found again by a lookup, every key and value lie inside data.mdb,
// every free-list entry be a well-formed list of pages inside it. Returns "" if all holds, else why
// not (in a few words: the signal that killed the walk, LMDB's error, the check that failed).
// The walk reads branch and leaf pages only, not values stored on overflow pages (those are
// checked by the entries' own CRC-32s). Safe from any thread: the child only calls LMDB.
std::string probe(const std::filesystem::path& dir, size_t map_size, unsigned max_dbs,
                  unsigned flags);

class Env {
 public:
  // mdb_env_open on an existing directory, with up to `max_dbs` named databases. Unless
  // `flags` hold MDB_NOLOCK, the lock file's blocks are allocated first: LMDB maps it and
  // writes through the mapping, which on a full filesystem (tmpfs) would raise SIGBUS; a lock
  // file that cannot be allocated is an Error saying the filesystem is full. An existing
  // data.mdb is probed first (once per version of the file in this process): one LMDB cannot
  // read is an Error "<dir>: the index is damaged: <why>".
  static Env open(const std::filesystem::path& dir, size_t map_size, unsigned max_dbs,
                  unsigned flags);

  Env() = default;
  Env(Env&& other) noexcept;
  Env& operator=(Env&& other) noexcept;
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;
  ~Env();

  MDB_env* get() const { return env_; }
  const std::filesystem::path& dir() const { return dir_; }
  size_t map_size() const;
  // Only while this process has no transaction open in the environment (LMDB's rule).
  // 0 adopts the size another process grew the map to.
  void set_map_size(size_t bytes);

 private:
  MDB_env* env_ = nullptr;
  std::filesystem::path dir_;
};

// Aborted on destruction unless committed.
class Txn {
 public:
  // A write transaction unless `flags` holds MDB_RDONLY. Returns nullopt (and opens nothing)
  // on MDB_MAP_RESIZED, which the caller resolves with set_map_size(0) and a retry.
  static std::optional<Txn> begin(const Env& env, unsigned flags);

  Txn(Txn&& other) noexcept;
  Txn& operator=(Txn&& other) noexcept;
  Txn(const Txn&) = delete;
  Txn& operator=(const Txn&) = delete;
  ~Txn();

  MDB_txn* get() const { return txn_; }
  const std::filesystem::path& dir() const { return dir_; }
  // nullopt if the database does not exist and `flags` lacks MDB_CREATE.
  std::optional<MDB_dbi> open_db(const char* name, unsigned flags);
  // The bytes stay valid until the transaction ends or writes.
  std::optional<std::string_view> get(MDB_dbi dbi, std::string_view key) const;
  // False on MDB_MAP_FULL: the transaction is then unusable and must be aborted.
  [[nodiscard]] bool put(MDB_dbi dbi, std::string_view key, std::string_view value);
  // Deleting an absent key is not an error. False on MDB_MAP_FULL, as for put.
  [[nodiscard]] bool del(MDB_dbi dbi, std::string_view key);
  // Empties the database (mdb_drop without deleting it). False on MDB_MAP_FULL.
  [[nodiscard]] bool drop(MDB_dbi dbi);
  size_t count(MDB_dbi dbi) const;
  // False on MDB_MAP_FULL. Either way the transaction is over.
  [[nodiscard]] bool commit();
  void abort();

 private:
  Txn(MDB_txn* txn, std::filesystem::path dir) : txn_(txn), dir_(std::move(dir)) {}
  MDB_txn* txn_ = nullptr;
  std::filesystem::path dir_;  // for messages
};

// Walks one database in key order.
class Cursor {
 public:
  Cursor(const Txn& txn, MDB_dbi dbi);
  Cursor(const Cursor&) = delete;
  Cursor& operator=(const Cursor&) = delete;
  ~Cursor();

  // The first entry, then the following ones; false past the last.
  bool next(std::string_view& key, std::string_view& value);

 private:
  MDB_cursor* cursor_ = nullptr;
  std::filesystem::path dir_;
  bool started_ = false;
};

}  // namespace ckptfs::index::lmdb
