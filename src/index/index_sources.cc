#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>

#include "ckptfs/crypt/framing.h"
#include "ckptfs/error.h"
#include "ckptfs/index/readers.h"
#include "ckptfs/index/store.h"
#include "ckptfs/index/structure.h"
#include "ckptfs/remote/objects.h"
#include "ckptfs/util/out_of_memory.h"
#include "ckptfs/util/remote_fs.h"

namespace ckptfs::index {

namespace fs = std::filesystem;

namespace {

source::SourceFile open_source(const fs::path& path, source::OpenFiles* opens) {
  return opens ? opens->open(path) : source::SourceFile::open(path);
}

// Scanning is mostly waiting for header pages of cold files, and decoding index entries is CPU
// work: two in flight hide much of the one and halve the other without crowding the (small)
// machine or the disk.
constexpr size_t kScanThreads = 2;
// Sources on a network or FUSE filesystem (NFS, SMB, Ceph, s3fs, mountpoint-s3): a read waits
// for a round trip (a ranged GET), not for the disk or the CPU, so many files go at once.
constexpr size_t kRemoteScanThreads = 8;

// How many files to scan at once when the sources are where `path` is.
size_t scan_threads(const fs::path& path) {
  struct statfs st;
  if (::statfs(path.c_str(), &st) != 0) return kScanThreads;
  switch (static_cast<uint32_t>(st.f_type)) {
    case 0x65735546u:  // FUSE
    case 0x6969u:      // NFS
    case 0x517bu:      // SMB
    case 0xff534d42u:  // CIFS
    case 0xfe534d42u:  // SMB2
    case 0x00c36400u:  // Ceph
    case 0x01021997u:  // 9P
    case 0x5346414fu:  // AFS
    case 0x47504653u:  // GPFS
    case 0x0bd00bd0u:  // Lustre
      return kRemoteScanThreads;
    default:
      return kScanThreads;
  }
}

// That of the first of `paths` (the sources of a mount sit together).
size_t scan_threads(const std::vector<fs::path>& paths) {
  return paths.empty() ? kScanThreads : scan_threads(paths.front());
}

// Runs `work(i)` for every i in [0, count), `threads` at a time, and returns how many (a
// prefix) completed. On failure the workers stop taking new items and the error of the first
// item that failed is returned in `error`.
template <typename Work>
size_t parallel_in_order(size_t count, size_t threads, std::exception_ptr& error,
                         const Work& work) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  size_t error_at = count;

  const auto worker = [&] {
    for (size_t k; !failed.load() && (k = next.fetch_add(1)) < count;) {
      try {
        work(k);
      } catch (...) {
        std::lock_guard lock(mu);
        if (k < error_at) {
          error_at = k;
          error = std::current_exception();
        }
        failed = true;
      }
    }
  };
  {
    std::vector<std::jthread> helpers;
    for (size_t i = 1; i < std::min(threads, count); ++i) helpers.emplace_back(worker);
    worker();
  }
  // Items are taken in order and a taken item is always finished, so everything before the
  // first failure completed.
  return error_at;
}

// The name a source is indexed under: an object's URL, else the absolute path.
std::string absolute_name(const fs::path& path) { return remote::source_name(path); }

// The name a message gives a source: an object's URL (never its placeholder's temp path), else
// the path as given.
std::string display_name(const source::SourceFile& file) {
  const remote::ObjectRef* object = remote::object_of(file.fd.get());
  return object ? object->url() : file.path.string();
}

// The reader is the first of `readers` (the caller's family's) that claims the file.
scan::FileScan scan_source(int fd, const std::string& name, scan::Readers readers) {
  return naming_out_of_memory(name, "scanning it", [&] {
    char head[1] = {};
    // An empty protobuf is a valid checkpoint of no parameters, which planning would then
    // report as parameters missing from it: a 0-byte source is a save that never wrote.
    if (remote::pread(fd, head, sizeof head, 0) == 0)
      fail("{}: the checkpoint file is empty (0 bytes); save or copy it again", name);
    return scan::pick_reader(readers.empty() ? mindspore_readers() : readers, fd, name)
        .scan(fd, name, {});
  });
}

// Scans sources[i] for every i in `misses`; returns how many of `misses` (a prefix) were
// scanned, with the first failure in `error`.
size_t scan_files(std::vector<IndexedSource>& sources, const std::vector<size_t>& misses,
                  std::exception_ptr& error, const OnFile& on_file, scan::Readers readers) {
  const size_t threads = misses.empty() ? kScanThreads : scan_threads(sources[misses[0]].file.path);
  return parallel_in_order(misses.size(), threads, error, [&](size_t k) {
    IndexedSource& source = sources[misses[k]];
    const std::string name = display_name(source.file);
    source.scan = scan_source(source.file.fd.get(), name, readers);
    // An encrypted file's extents are plaintext offsets: its structure bytes are plaintext,
    // and neither they nor a digest of them are kept (the scan is never stored).
    if (!source.scan.encrypted)
      source.structure = structure_digest(source.file.fd.get(), name, source.scan);
    // A file still being written would leave a scan of a prefix in the index for good.
    if (source::fingerprint_of(source.file.fd.get(), name) != source.file.fingerprint) {
      fail("{}: changed while being indexed; index it again once it is complete", name);
    }
    spdlog::debug("{}: scanned, {} parameters", name, source.scan.params.size());
    if (on_file) on_file(source.scan);
  });
}

// `index build` takes no key: an encrypted source's scan describes its plaintext and is never
// stored (store.h), so it is refused by name rather than scanned for nothing.
void refuse_encrypted(int fd, const std::string& name) {
  std::array<uint8_t, 4> head{};
  if (remote::pread(fd, head.data(), head.size(), 0) == static_cast<ssize_t>(head.size()) &&
      crypt::looks_encrypted(head))
    fail(
        "{}: byte offset 0: an encrypted checkpoint; ckptfs never indexes those (the scan "
        "describes the decrypted bytes): mount it with --dec-key-file, which scans it each time",
        name);
}

// The deferred check of `file`: the one an earlier plan of the mount made (through `opens`),
// else make()'s.
template <typename Make>
std::shared_ptr<const DeferredCheck> deferred_check(source::OpenFiles* opens,
                                                    const source::SourceFile& file, Make&& make) {
  if (opens == nullptr) return make();
  return std::static_pointer_cast<const DeferredCheck>(
      opens->shared_check(file, [&]() -> std::shared_ptr<const void> { return make(); }));
}

}  // namespace

std::optional<CachedScan> lookup_cached(const Store& store, const source::SourceFile& file,
                                        const std::string& name, bool may_defer) {
  return naming_out_of_memory(
      name, "reading its scan from the index", [&]() -> std::optional<CachedScan> {
        // A FUSE daemon reports whatever ctime it likes: s3fs reports the object's
        // x-amz-meta-ctime, which its utimens sets to the mtime it is given, so a rewrite
        // through s3fs and `touch -d` put size, mtime and ctime back.
        const bool trust_ctime = !on_fuse_filesystem(file.fd.get());
        if (trust_ctime)
          if (std::optional<scan::FileScan> scan = store.lookup(file.fingerprint)) {
            CachedScan found;
            found.scan = std::move(*scan);
            return found;
          }
        std::string why;
        CachedScan found;
        source::Fingerprint stored;
        std::optional<scan::FileScan> scan = store.lookup_path(
            name, file.fingerprint.size, file.fingerprint.mtime_ns, why, found.structure, &stored);
        if (!scan) return std::nullopt;
        if (!trust_ctime && may_defer) {
          found.deferred = true;
        } else if ((!trust_ctime || stored.ctime_ns != file.fingerprint.ctime_ns) &&
                   !same_structure(structure_digest(file.fd.get(), name, *scan), found.structure)) {
          spdlog::info("{}: its size and mtime are those indexed, its headers are not; scanning it",
                       name);
          return std::nullopt;
        }
        found.scan = std::move(*scan);
        // Over FUSE only the path finds it (the fingerprint is never looked up there), and
        // recording it under an inode number the daemon hands out again would only replace
        // another file's entry of the same size and mtime.
        found.moved = trust_ctime && stored != file.fingerprint;
        found.stored = stored;
        return found;
      });
}

std::vector<IndexedSource> index_sources_shipped(const Store& store,
                                                 const std::vector<fs::path>& paths,
                                                 const OnFile& on_file, bool check_structure,
                                                 source::OpenFiles* opens, bool defer) {
  std::vector<IndexedSource> sources(paths.size());
  for (size_t i = 0; i < paths.size(); ++i) sources[i].file = open_source(paths[i], opens);
  std::exception_ptr error;
  parallel_in_order(sources.size(), scan_threads(paths), error, [&](size_t i) {
    IndexedSource& s = sources[i];
    const std::string name = absolute_name(s.file.path);
    std::string why;
    StructureDigest built;
    std::optional<scan::FileScan> scan =
        naming_out_of_memory(name, "reading its scan from the index", [&] {
          return store.lookup_path(name, s.file.fingerprint.size, s.file.fingerprint.mtime_ns, why,
                                   built);
        });
    // Size and mtime can be put back after a rewrite in place: the bytes the scan was read
    // from are compared too, before anything is planned from it (once per file and fingerprint
    // for all the plans of a mount). An object's "mtime" is a hash of its ETag, which every
    // upload changes: nothing more to read (GETs) for it.
    if (scan && check_structure && remote::object_of(s.file.fd.get()) == nullptr &&
        !(opens && opens->checked(s.file))) {
      if (defer && on_fuse_filesystem(s.file.fd.get()))
        s.deferred = deferred_check(opens, s.file, [&] {
          return std::make_shared<const DeferredCheck>(std::move(built), *scan, store.dir(),
                                                       std::string(), /*shipped=*/true);
        });
      else if (!same_structure(structure_digest(s.file.fd.get(), name, *scan), built))
        why =
            "was built from other headers than it has now (rewritten in place, its size and "
            "mtime kept?)";
      else if (opens)
        opens->mark_checked(s.file);
    }
    if (!scan || !why.empty())
      fail("{}: the index {} {}; rebuild it with `ckptfs index build SRC --output {}`", name,
           store.dir().string(), why, store.dir().string());
    s.scan = std::move(*scan);
    s.from_index = true;
    if (on_file) on_file(s.scan);
  });
  if (error) std::rethrow_exception(error);
  spdlog::info("{} source files: {} from the index, 0 scanned", sources.size(), sources.size());
  return sources;
}

BuildResult build_index(Store* store, const std::vector<fs::path>& paths, const OnFile& on_file,
                        scan::Readers readers, bool sync_later) {
  std::atomic<uint64_t> params{0};
  std::atomic<size_t> hits{0}, unrecorded{0};
  std::atomic<bool> warned{false};
  // A cache index that cannot grow (a full disk) costs the next mount its head start, not this
  // build; the caller refuses a shipped index that misses entries.
  const auto record = [&](const Store::NewEntry& entry) {
    try {
      store->insert(std::span(&entry, 1));
      return true;
    } catch (const Error& e) {
      if (!warned.exchange(true)) spdlog::warn("{}; the new scans are not recorded", e.what());
      return false;
    }
  };
  std::exception_ptr error;
  if (store) store->defer_sync(true);
  parallel_in_order(paths.size(), scan_threads(paths), error, [&](size_t i) {
    const source::SourceFile file = source::SourceFile::open(paths[i]);
    const std::string name = display_name(file);
    const std::string absolute = absolute_name(file.path);
    if (const std::optional<CachedScan> known =
            store ? lookup_cached(*store, file, absolute) : std::nullopt) {
      // Left under its old fingerprint if this fails: still found by path.
      if (known->moved) record({absolute, file.fingerprint, &known->scan, known->structure});
      params += known->scan.params.size();
      ++hits;
      if (on_file) on_file(known->scan);
    } else {
      refuse_encrypted(file.fd.get(), name);
      const scan::FileScan scan = scan_source(file.fd.get(), name, readers);
      const StructureDigest structure = structure_digest(file.fd.get(), name, scan);
      if (source::fingerprint_of(file.fd.get(), name) != file.fingerprint)
        fail("{}: changed while being indexed; index it again once it is complete", name);
      if (!store || !record({absolute, file.fingerprint, &scan, structure})) ++unrecorded;
      params += scan.params.size();
      if (on_file) on_file(scan);
    }
  });
  try {
    if (store && sync_later) store->sync_in_background();
    if (store && !sync_later) store->defer_sync(false);
  } catch (const Error& e) {
    spdlog::warn("{}; the new scans may not be recorded", e.what());
    unrecorded += paths.size() - hits.load();
  }
  if (error) std::rethrow_exception(error);
  return {paths.size(), params.load(), hits.load(), unrecorded.load()};
}

std::vector<IndexedSource> index_sources(Store& store, const std::vector<fs::path>& paths,
                                         const OnFile& on_file, scan::Readers readers) {
  return index_sources(&store, paths, on_file, readers);
}

std::vector<IndexedSource> index_sources(Store* store, const std::vector<fs::path>& paths,
                                         const OnFile& on_file, scan::Readers readers,
                                         source::OpenFiles* opens, bool defer) {
  std::vector<IndexedSource> sources(paths.size());
  for (size_t i = 0; i < paths.size(); ++i) sources[i].file = open_source(paths[i], opens);
  std::exception_ptr lookup_error;
  std::vector<char> moved(sources.size(),
                          0);  // found by path: recorded again under its fingerprint
  if (store != nullptr)
    parallel_in_order(sources.size(), scan_threads(paths), lookup_error, [&](size_t i) {
      IndexedSource& s = sources[i];
      if (std::optional<CachedScan> cached =
              lookup_cached(*store, s.file, absolute_name(s.file.path), defer)) {
        s.scan = std::move(cached->scan);
        s.from_index = true;
        if (cached->moved) {
          moved[i] = 1;
          s.structure = cached->structure;
        }
        if (cached->deferred)
          s.deferred = deferred_check(opens, s.file, [&] {
            return std::make_shared<const DeferredCheck>(std::move(cached->structure), s.scan,
                                                         store->dir(), cached->stored.key());
          });
        if (on_file) on_file(s.scan);
      }
    });
  if (lookup_error) std::rethrow_exception(lookup_error);
  std::vector<size_t> misses;
  for (size_t i = 0; i < sources.size(); ++i)
    if (!sources[i].from_index) misses.push_back(i);
  if (!misses.empty()) {
    spdlog::info("scanning {} of {} source files", misses.size(), sources.size());
  }
  std::exception_ptr error;
  const size_t scanned = scan_files(sources, misses, error, on_file, readers);

  // Recorded even when a later file failed, so that the retry after fixing it is quick.
  std::vector<Store::NewEntry> items;
  items.reserve(scanned);
  for (size_t i = 0; i < sources.size(); ++i)
    if (moved[i])
      items.push_back({absolute_name(sources[i].file.path), sources[i].file.fingerprint,
                       &sources[i].scan, sources[i].structure});
  for (size_t k = 0; k < scanned; ++k) {
    const IndexedSource& source = sources[misses[k]];
    if (source.scan.encrypted) continue;  // never stored (see build_index)
    items.push_back(
        {absolute_name(source.file.path), source.file.fingerprint, &source.scan, source.structure});
  }
  try {
    if (store != nullptr) store->insert(items);
  } catch (const Error& e) {
    // The scans are good; only the next mount loses the head start.
    spdlog::warn("{}; the new scans are not recorded", e.what());
  }
  if (error) std::rethrow_exception(error);
  const size_t renumbered = static_cast<size_t>(std::count(moved.begin(), moved.end(), 1));
  spdlog::info("{} source files: {} from the index, {} scanned{}", sources.size(),
               sources.size() - misses.size(), misses.size(),
               renumbered ? fmt::format(" ({} found by path, size and mtime)", renumbered) : "");
  return sources;
}

}  // namespace ckptfs::index
