#include "spool.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "ckptfs/error.h"

namespace ckptfs::fs {

namespace {

uint64_t page_size() {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

// An unlinked file in `dir`: O_TMPFILE where the filesystem knows it, else a named file
// unlinked at once.
UniqueFd unlinked_file(const std::filesystem::path& dir) {
  UniqueFd fd(::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
  if (fd || (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)) return fd;
  std::string name = (dir / "ckptfs-spool-XXXXXX").string();
  fd = UniqueFd(::mkostemp(name.data(), O_CLOEXEC));
  if (fd) ::unlink(name.c_str());
  return fd;
}

}  // namespace

Spool::Spool(const std::filesystem::path& dir, uint64_t capacity)
    : dir_(dir), capacity_(capacity / page_size() * page_size()), span_(2 * capacity_) {
  if (capacity_ == 0) fail("-o s3_spool_max: {} bytes hold no page", capacity);
  fd_ = unlinked_file(dir);
  if (!fd_)
    fail("-o s3_spool={}: cannot make a file there: {}; name another directory on a local disk",
         dir.string(), errno_text(errno));
  if (::ftruncate(fd_.get(), static_cast<off_t>(span_)) != 0)
    fail("-o s3_spool={}: cannot size a file of {} MiB there: {}", dir.string(), span_ >> 20,
         errno_text(errno));
  void* p = ::mmap(nullptr, span_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
  if (p == MAP_FAILED)
    fail("-o s3_spool={}: cannot map its file: {}", dir.string(), errno_text(errno));
  base_ = static_cast<uint8_t*>(p);
  add_free(0, span_);
  // A filesystem that cannot give a range its blocks up front (ext4 without extents, NFSv3,
  // older ZFS) would hold nothing, every range refused at fetch: refused here instead.
  uint8_t* probe = allocate(page_size());
  if (probe == nullptr)
    fail(
        "-o s3_spool={}: cannot reserve disk blocks there (fallocate: {}); name a directory on a "
        "local disk with room",
        dir.string(), errno_text(errno));
  free(probe, page_size());
}

Spool::~Spool() {
  if (base_ != nullptr) ::munmap(base_, span_);
}

uint64_t Spool::round_up(uint64_t size) {
  return (size + page_size() - 1) / page_size() * page_size();
}

void Spool::remove_free(std::map<uint64_t, uint64_t>::iterator it) {
  sizes_.erase({it->second, it->first});
  free_.erase(it);
}

std::pair<uint64_t, uint64_t> Spool::add_free(uint64_t offset, uint64_t size) {
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && next->first == offset + size) {
    size += next->second;
    remove_free(next++);
  }
  if (next != free_.begin()) {
    const auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      size += prev->second;
      remove_free(prev);
    }
  }
  free_.emplace(offset, size);
  sizes_.emplace(size, offset);
  return {offset, offset + size};
}

uint8_t* Spool::allocate(uint64_t size) {
  size = round_up(size);
  if (size == 0) return nullptr;
  std::lock_guard lock(mutex_);
  const auto fit = sizes_.lower_bound({size, 0});
  if (fit == sizes_.end()) return nullptr;
  const auto [extent, offset] = *fit;
  remove_free(free_.find(offset));
  if (extent > size) add_free(offset + size, extent - size);
  if (::fallocate(fd_.get(), 0, static_cast<off_t>(offset), static_cast<off_t>(size)) != 0) {
    const int err = errno;
    // A filesystem may keep the blocks it took before it ran out (ext4 does): given back.
    ::fallocate(fd_.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                static_cast<off_t>(size));
    add_free(offset, size);
    errno = err;
    return nullptr;
  }
  used_ += size;
  return base_ + offset;
}

void Spool::free(uint8_t* p, uint64_t size) noexcept {
  if (p == nullptr) return;
  size = round_up(size);
  const auto offset = static_cast<uint64_t>(p - base_);
  std::lock_guard lock(mutex_);
  used_ -= size;
  const auto [from, to] = add_free(offset, size);
  // The blocks go back to the disk and the pages leave the page cache (and this mapping) now,
  // not when memory runs short. With the free room up to a large page (folio, at most 2 MiB)
  // each side, within the free extent it joins: a store into a range may dirty a folio reaching
  // past its end, into free room, which the filesystem then gives blocks (ext4: 1.7 MiB past a
  // 32 MiB spool of ranges of random sizes). Not the whole extent: the file's never-used room
  // (twice the capacity) would be walked at every free.
  constexpr uint64_t kLargestFolio = uint64_t{2} << 20;
  const uint64_t first = std::max(from, offset - std::min(offset, kLargestFolio));
  const uint64_t last = std::min(to, offset + size + kLargestFolio);
  ::fallocate(fd_.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(first),
              static_cast<off_t>(last - first));
}

uint64_t Spool::used() const {
  std::lock_guard lock(mutex_);
  return used_;
}

uint64_t Spool::disk_bytes() const {
  struct stat st {};
  return ::fstat(fd_.get(), &st) == 0 ? static_cast<uint64_t>(st.st_blocks) * 512 : 0;
}

bool Spool::in_memory(const std::filesystem::path& dir) {
  struct statfs st {};
  if (::statfs(dir.c_str(), &st) != 0) return false;
  const auto type = static_cast<uint64_t>(st.f_type);
  return type == TMPFS_MAGIC || type == RAMFS_MAGIC;
}

uint64_t Spool::default_capacity(const std::filesystem::path& dir) {
  struct statvfs st {};
  if (::statvfs(dir.c_str(), &st) != 0) return 0;
  // At most 1 TiB (-o s3_spool_max's own limit): twice that is still a file ext4 allows.
  return std::min(static_cast<uint64_t>(st.f_bavail) * st.f_frsize / 4, uint64_t{1} << 40);
}

}  // namespace ckptfs::fs
