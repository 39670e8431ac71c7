#include "ckptfs/source/open_files.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <utility>

namespace ckptfs::source {

namespace {

// A descriptor of the same open file (no open(2)), or an empty one if none is left.
UniqueFd duplicate(int fd) { return UniqueFd(::fcntl(fd, F_DUPFD_CLOEXEC, 0)); }

// Whether `st` is the file open on `fd` (an S3 object's placeholder, not its identity).
bool is_open_on(const struct stat& st, int fd) {
  struct stat open;
  return ::fstat(fd, &open) == 0 && open.st_dev == st.st_dev && open.st_ino == st.st_ino;
}

}  // namespace

SourceFile OpenFiles::open(const std::filesystem::path& path) {
  std::lock_guard lock(mutex_);
  const auto it = held_.find(path.string());
  if (it != held_.end()) {
    // stat follows symlinks as open does; a file renamed over the path has another inode.
    struct stat named;
    if (std::shared_ptr<const UniqueFd> shared = it->second.fd.lock();
        shared && ::stat(path.c_str(), &named) == 0 && is_open_on(named, shared->get())) {
      if (UniqueFd copy = duplicate(shared->get())) {
        SourceFile file = SourceFile::adopt(path, std::move(copy));
        file.shared = std::move(shared);
        return file;
      }
    }
  }
  SourceFile file = SourceFile::open(path);
  if (UniqueFd keep = duplicate(file.fd.get())) {
    file.shared = std::make_shared<const UniqueFd>(std::move(keep));
    held_.insert_or_assign(path.string(),
                           Held{file.shared, keep_ == Keep::kForLife ? file.shared : nullptr,
                                std::nullopt, nullptr, std::nullopt});
    sweep();
  } else {
    held_.erase(path.string());  // out of descriptors: the next plan opens it again
  }
  return file;
}

void OpenFiles::sweep() {
  if (held_.size() < sweep_at_) return;
  std::erase_if(held_, [](const auto& entry) { return entry.second.fd.expired(); });
  sweep_at_ = std::max<size_t>(64, 2 * held_.size());
}

OpenFiles::Held* OpenFiles::held_for(const SourceFile& file) {
  const auto it = held_.find(file.path.string());
  if (it == held_.end() || !file.fd) return nullptr;
  const std::shared_ptr<const UniqueFd> held = it->second.fd.lock();
  struct stat mine;
  if (!held || ::fstat(file.fd.get(), &mine) != 0 || !is_open_on(mine, held->get())) return nullptr;
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

std::shared_ptr<const void> OpenFiles::shared_check(
    const SourceFile& file, const std::function<std::shared_ptr<const void>()>& make) {
  std::lock_guard lock(mutex_);
  Held* held = held_for(file);
  if (held != nullptr && held->check && held->check_for == file.fingerprint) return held->check;
  std::shared_ptr<const void> check = make();
  if (held != nullptr) {
    held->check = check;
    held->check_for = file.fingerprint;
  }
  return check;
}

}  // namespace ckptfs::source
