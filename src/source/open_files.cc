#include "ckptfs/source/open_files.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <utility>

namespace ckptfs::source {

namespace {

// A descriptor of the same open file (no open(2)), or an empty one if none is left.
UniqueFd duplicate(int fd) { return UniqueFd(::fcntl(fd, F_DUPFD_CLOEXEC, 0)); }

}  // namespace

SourceFile OpenFiles::open(const std::filesystem::path& path) {
  std::lock_guard lock(mutex_);
  const auto it = held_.find(path.string());
  if (it != held_.end()) {
    // stat follows symlinks as open does; a file renamed over the path has another inode.
    struct stat named, held;
    if (::stat(path.c_str(), &named) == 0 && ::fstat(it->second.fd.get(), &held) == 0 &&
        named.st_dev == held.st_dev && named.st_ino == held.st_ino) {
      if (UniqueFd copy = duplicate(it->second.fd.get()))
        return SourceFile::adopt(path, std::move(copy));
    }
  }
  SourceFile file = SourceFile::open(path);
  if (UniqueFd keep = duplicate(file.fd.get()))
    held_.insert_or_assign(path.string(), Held{std::move(keep), std::nullopt});
  else
    held_.erase(path.string());  // out of descriptors: the next plan opens it again
  return file;
}

OpenFiles::Held* OpenFiles::held_for(const SourceFile& file) {
  const auto it = held_.find(file.path.string());
  if (it == held_.end() || !file.fd) return nullptr;
  struct stat mine, held;
  if (::fstat(file.fd.get(), &mine) != 0 || ::fstat(it->second.fd.get(), &held) != 0 ||
      mine.st_dev != held.st_dev || mine.st_ino != held.st_ino)
    return nullptr;
  return &it->second;
}

bool OpenFiles::checked(const SourceFile& file) {
  std::lock_guard lock(mutex_);
  const Held* held = held_for(file);
  return held != nullptr && held->checked == file.fingerprint;
}

void OpenFiles::mark_checked(const SourceFile& file) {
  std::lock_guard lock(mutex_);
  if (Held* held = held_for(file)) held->checked = file.fingerprint;
}

}  // namespace ckptfs::source
