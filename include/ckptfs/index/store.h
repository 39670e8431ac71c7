// The persistent index: LMDB, source file fingerprint -> header-only scan of that file. A second
// mount of an unchanged source reads it instead of scanning; a changed file has a new
// fingerprint and is scanned again. Nothing here is on the read path.
// Scans of encrypted sources (FileScan::encrypted) are never stored: their names, shapes and
// offsets describe the plaintext, and their structure digest would hash plaintext bytes.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ckptfs/index/deferred_check.h"
#include "ckptfs/index/structure.h"
#include "ckptfs/scan/file_scan.h"
#include "ckptfs/scan/reader.h"
#include "ckptfs/source/open_files.h"
#include "ckptfs/source/source_file.h"

namespace ckptfs::index {

// On disk: an LMDB environment (data.mdb, lock.mdb) in the index directory, with two named
// databases. kScansDb maps Fingerprint::key() to a serialized indexpb::ScannedFile
// (proto/index.proto). kPathsDb maps a 64-bit hash of a path (LMDB keys are short) to the key
// last stored for that path followed by the path, so that the entry of a file's previous version
// is dropped when the new one is stored instead of piling up.
inline constexpr char kScansDb[] = "scans";
inline constexpr char kPathsDb[] = "paths";
// kTargetsDb (a shipped index built with a destination strategy): key kTargetsViewKey holds the
// view the summaries were planned for (ViewKey), and each target rank's 8-byte big-endian rank
// holds its serialized indexpb::TargetSummary and CRC-32.
inline constexpr char kTargetsDb[] = "targets";
inline constexpr char kTargetsViewKey[] = "view";
inline constexpr char kTargetsFilesKey[] = "files";
// The LMDB map is address space, not disk. It starts small, so that a mount fits under an
// address-space limit (ulimit -v), holds some 500k parameters, and a full map is doubled and the
// write retried; an existing larger environment opens at its own size.
inline constexpr size_t kDefaultMapSize = size_t{64} << 20;

// Bumped whenever scan::FileScan or its stored form changes meaning: entries written with
// another version read as absent, and the files are scanned again.
inline constexpr uint32_t kFormatVersion = 5;

// The scan stored in an index entry (a ScannedFile and its CRC-32) for a file of `file_size`
// bytes, or nullopt with the reason in `why`: a damaged, foreign or stale entry, or one that
// could not have come from scanning such a file (scan::check_scan), is never trusted. With
// `structure`, also the digest of the file's structure bytes the entry was made from. With a
// `path`, the entry must be the scan of the file at that path: over a FUSE filesystem that
// reuses inode numbers, two files of one size and mtime can have had the same fingerprint, and
// the later one's scan replaced the other's under it.
std::optional<scan::FileScan> decode_entry(std::string_view entry, uint64_t file_size,
                                           std::string* why = nullptr,
                                           StructureDigest* structure = nullptr,
                                           std::string_view path = {});

// $XDG_CACHE_HOME/ckptfs/index (if that is an absolute path), else $HOME/.cache/ckptfs/index.
// Throws Error if neither variable is usable.
std::filesystem::path default_dir();

// One target rank as a mount lists it before planning it.
struct TargetSummary {
  struct File {
    std::string name;
    uint64_t size = 0;
    int64_t mtime_ns = 0;  // the newest mtime of the sources it reads
    bool page_cache = false;
    std::vector<int64_t> source_ranks;  // ascending: the sources whose bytes it reads
  };
  int64_t rank = 0;
  std::vector<File> files;            // in the order the planner makes them
  std::vector<int64_t> source_ranks;  // ascending: the source ranks its plan loads
};

// The summary of target `rank` stored in a kTargetsDb entry (a serialized
// indexpb::TargetSummary and its CRC-32), or nullopt with the reason in `why`. A shipped index
// comes from another machine, so nothing is trusted: besides the checksum, format version and
// rank, every file name must be one plain directory entry (not empty, "." or "..", no '/' or
// NUL, at most 255 bytes, each once), every size must fit in an off_t, and the source ranks (the
// summary's and each file's) must be non-negative and strictly ascending.
std::optional<TargetSummary> decode_target(std::string_view entry, int64_t rank,
                                           std::string* why = nullptr);
// The kTargetsDb entry put_targets stores for `target`: what decode_target reads back.
std::string encode_target(const TargetSummary& target);

struct Entry {
  std::string path;
  source::Fingerprint fingerprint;
  uint64_t params = 0;  // FileScan::params.size()
};

// Whether an entry still describes the file at its path without reading it: the same size,
// mtime and ctime (device and inode may differ: a FUSE or network filesystem renumbers them).
// kGone: no file there; kChanged: another file or the same one changed (`why` says what: size,
// mtime, another inode, ctime; a mount may still use it after checking the file's structure
// bytes, lookup_cached); kUnknown: it cannot be told (stat failed for another reason, e.g. a
// directory that cannot be searched).
struct Freshness {
  enum State { kCurrent, kGone, kChanged, kUnknown } state = kCurrent;
  std::string why;  // "" when current, or kOnFuse
};
// A current entry of a file on a FUSE filesystem has this note: its attributes match, and a
// mount compares its structure bytes before using it (a FUSE daemon may set a ctime back).
inline constexpr std::string_view kOnFuse = "on a FUSE filesystem: a mount compares its headers";
// An entry of an S3 object (its path is its s3:// URL) is kUnknown with this reason.
inline constexpr std::string_view kNotChecked = "an S3 object, not checked";
Freshness freshness(const Entry& entry);

// Safe to share between threads (operations take turns) and between processes (LMDB's locks).
// A process can hold only one Store per directory at a time (LMDB's rule); a second one throws
// (open_waiting waits for the first to be closed).
class Store {
 public:
  // Opens the LMDB environment in `dir`, creating the directory (mode 0700, parents included)
  // and the environment if missing; throws Error naming `dir` and LMDB's reason (for a damaged
  // environment, with the `ckptfs index clear` that removes it).
  explicit Store(const std::filesystem::path& dir, size_t initial_map_size = kDefaultMapSize);
  // The same, but when this process has the index open already (LMDB allows one Store a
  // process: a plan being indexed, another entry being dropped), waits up to `patience` for it
  // to be closed before throwing.
  static Store open_waiting(const std::filesystem::path& dir, std::chrono::milliseconds patience);
  ~Store();
  Store(Store&&) noexcept;
  Store& operator=(Store&&) noexcept;

  // A shipped index (`ckptfs index build SRC --output DIR`, copied next to the checkpoint and
  // opened by every node): MDB_RDONLY | MDB_NOLOCK, so it works on a read-only path and neither
  // writes nor locks anything. insert() and clear() throw. Throws Error naming `dir` if it is
  // not such an index.
  static Store open_shipped(const std::filesystem::path& dir);
  bool read_only() const;

  const std::filesystem::path& dir() const;

  // The scan stored for the file at absolute `path`, if it was built from a file of this size
  // and mtime (a shipped index is copied, so inode, device and ctime are not compared), with
  // the digest of the structure bytes it was made from in `structure` (for the caller to
  // compare with the file's) and, with `stored`, the fingerprint it is stored under. nullopt
  // with the reason in `why` otherwise.
  std::optional<scan::FileScan> lookup_path(const std::string& path, uint64_t size,
                                            int64_t mtime_ns, std::string& why,
                                            StructureDigest& structure,
                                            source::Fingerprint* stored = nullptr) const;

  // The stored scan of the file with this fingerprint; nullopt if there is none, or it was
  // written with another kFormatVersion, or it does not decode.
  std::optional<scan::FileScan> lookup(const source::Fingerprint& fingerprint) const;
  struct NewEntry {
    NewEntry(std::string path_, const source::Fingerprint& fingerprint_,
             const scan::FileScan* scan_, const StructureDigest& structure_ = {})
        : path(std::move(path_)), fingerprint(fingerprint_), scan(scan_), structure(structure_) {}
    std::string path;
    source::Fingerprint fingerprint;
    const scan::FileScan* scan = nullptr;
    StructureDigest structure;  // of the file the scan was made from (structure_digest)
  };
  // All in one write transaction; the map grows as needed. The entries are encoded before the
  // store is locked, so threads inserting at once encode in parallel.
  void insert(std::span<const NewEntry> items);
  // While on, commits do not wait for the disk (a bulk build); turning it off syncs once.
  void defer_sync(bool on);
  // Turns the deferral off as defer_sync(false) does, but the sync runs on a thread of its own
  // and the caller goes on (lookups are not held up meanwhile); wait_synced() waits for it and
  // throws its Error. Commits made after this call sync as usual. The store's destruction waits
  // for the sync too.
  void sync_in_background();
  void wait_synced();
  // The fingerprint stored for the file at absolute `path` (no scan is decoded); nullopt if
  // there is none.
  std::optional<source::Fingerprint> fingerprint(const std::string& path) const;

  // Replaces every target summary with `targets`, planned for the view `view_key` from the
  // source files `files` (as the caller lists them), in one write transaction, with `extra`
  // values beside them (keys longer than the summaries' 8-byte rank keys), read back with
  // targets_extra.
  void put_targets(std::string_view view_key, std::string_view files,
                   std::span<const TargetSummary> targets,
                   std::span<const std::pair<std::string, std::string>> extra = {});
  // A value put_targets stored as `extra`; nullopt if none.
  std::optional<std::string> targets_extra(std::string_view key) const;
  // The view the target summaries were planned for; nullopt if the index holds none (built
  // without a destination strategy, or by an older ckptfs).
  std::optional<std::string> targets_view() const;
  // The source files they were planned from, as put_targets was given them; nullopt if none.
  std::optional<std::string> targets_files() const;
  // The summary of target `rank`; nullopt if there is none or it is damaged.
  std::optional<TargetSummary> target(int64_t rank) const;

  // The current-version entries, sorted by path. With `unreadable`, also the keys of the
  // entries written by another kFormatVersion or damaged (never used, so dead weight).
  std::vector<Entry> entries(std::vector<std::string>* unreadable = nullptr) const;
  // Removes the entries stored under these keys (Fingerprint::key(), or keys from entries'
  // `unreadable`) and the path records that point to them; returns how many were there.
  size_t remove(std::span<const std::string> keys);
  size_t clear();  // removes every entry (of any version), returns how many

 private:
  Store() = default;
  Store(const std::filesystem::path& dir, size_t initial_map_size,
        std::chrono::milliseconds patience);
  std::optional<std::string> targets_value(std::string_view key) const;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Deletes the LMDB files of `dir` (data.mdb, lock.mdb), for an environment too damaged to open;
// true if there were any. Throws Error naming a file that cannot be removed.
bool remove_environment(const std::filesystem::path& dir);

// The scan the cache index holds for `file` (at absolute path `name`), by its fingerprint, or
// else by its path, size and mtime: a filesystem that does not keep inode numbers (a FUSE client
// whose kernel forgot the inode, an S3 filesystem or NFS mounted again) gives an unchanged file
// another device and inode. If the ctime is the stored one too, that is all that changed (no
// call sets a ctime back on a kernel filesystem), and nothing is read. Otherwise (a copy with its
// mtime kept, a chmod, a replacement by rename), the file's structure bytes are read and must
// have the stored digest: a scan is a function of those bytes and the size. On a FUSE filesystem
// a ctime proves nothing (s3fs keeps it in the object's metadata and `touch -d` sets it with the
// mtime), so the structure bytes are always compared: now, or with `may_defer`, before the file
// is first served (`deferred`, deferred_check.h), so that a remount reads none of them.
// `moved` is set when the scan was found under another fingerprint; `structure` is the stored
// digest when `moved` or `deferred`, so that the caller records the scan under the new
// fingerprint or checks it.
// nullopt: scan the file. Throws Error if the structure bytes cannot be read.
struct CachedScan {
  scan::FileScan scan;
  bool moved = false;
  bool deferred = false;
  StructureDigest structure;
  source::Fingerprint stored;  // the fingerprint the scan is stored under, when by path
};
std::optional<CachedScan> lookup_cached(const Store& store, const source::SourceFile& file,
                                        const std::string& name, bool may_defer = false);

struct IndexedSource {
  source::SourceFile file;
  scan::FileScan scan;
  bool from_index = false;
  // Set for scans made now and those the index held under another fingerprint (lookup_cached's
  // `moved`); unset for the rest taken from the index.
  StructureDigest structure;
  // A scan taken from the index whose structure bytes are to be compared as the file is served
  // (lookup_cached's `deferred`, index_sources_shipped's `defer`); null for the rest. Shared by
  // the plans made from it.
  std::shared_ptr<const DeferredCheck> deferred;
};

// Called once per file whose scan is known (taken from the index or scanned), from the worker
// threads, so that a caller can report progress.
using OnFile = std::function<void(const scan::FileScan&)>;

// Opens every path, takes scans from the store (lookup_cached) and scans the rest (header only,
// two files at a time, each with the first of `readers` that claims it; none given:
// index::mindspore_readers()), then records the new scans, and the scans found under another
// fingerprint, in one transaction under the absolute paths. Results are in the order of `paths`.
// A file that changes while it is scanned is an Error, as is any open or scan failure; failing to
// record the new scans is only logged, since the index is a cache.
std::vector<IndexedSource> index_sources(Store& store,
                                         const std::vector<std::filesystem::path>& paths,
                                         const OnFile& on_file = {}, scan::Readers readers = {});
// The same without a persistent index (null `store`): every file is scanned.
// With `opens`, the files are opened through it (source/open_files.h). With `defer`, a scan
// of a file on a FUSE filesystem is taken without reading it (lookup_cached's `may_defer`): for
// plans whose bytes are served only through fs::Tree, which makes the deferred checks.
std::vector<IndexedSource> index_sources(Store* store,
                                         const std::vector<std::filesystem::path>& paths,
                                         const OnFile& on_file = {}, scan::Readers readers = {},
                                         source::OpenFiles* opens = nullptr, bool defer = false);

struct BuildResult {
  size_t files = 0;
  uint64_t params = 0;  // source tensors
  size_t from_index = 0;
  size_t unrecorded = 0;  // scanned but not stored (the store could not be written; logged)
};
// index build: scans every file of `paths` the store does not hold yet and stores it, two files
// at a time, each scan encoded and written as soon as it is made and then dropped: memory is
// that of a file's scan per thread, whatever the number of files. `on_file` after each file.
// Throws Error naming the first file that cannot be opened or scanned (the files stored before
// it stay stored). A null `store` (an index that cannot be opened) scans every file and
// records none (all counted as `unrecorded`). `sync_later`: the new scans' sync is only started
// (Store::sync_in_background) and the caller waits for it (Store::wait_synced), so that index
// build plans its target summaries while the pages reach the disk.
BuildResult build_index(Store* store, const std::vector<std::filesystem::path>& paths,
                        const OnFile& on_file = {}, scan::Readers readers = {},
                        bool sync_later = false);

// From a read-only shipped index only: every path must have an entry of its current size and
// mtime, and its structure bytes (structure.h) must have the digest the entry holds, else
// Error in one line naming the file, what changed, and how to rebuild. Reads each file's
// structure bytes once (a safetensors header, every record header of a .ckpt); scans and
// writes nothing. `check_structure` false skips that read: only for the index this process has
// just built from these files (index build's target summaries), whose digests were taken from
// the bytes it scanned moments before; size and mtime are still compared.
// With `opens`, the files are opened through it (source/open_files.h). With `defer`, the
// structure of a file on a FUSE filesystem is compared as it is served instead (`deferred`,
// deferred_check.h: over an S3 filesystem the read fetches the whole object): for plans whose
// bytes are served only through fs::Tree.
std::vector<IndexedSource> index_sources_shipped(
    const Store& store, const std::vector<std::filesystem::path>& paths, const OnFile& on_file = {},
    bool check_structure = true, source::OpenFiles* opens = nullptr, bool defer = false);

}  // namespace ckptfs::index
