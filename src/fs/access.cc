#include "access.h"

#include <sys/stat.h>

namespace ckptfs::fs {

namespace {

// Whether the file's owner (`owner`) or a member of its group `gid` may search a directory
// with stat `dir`. Supplementary groups are not known: the owner counts as a member of the
// file's group, and a group member as nobody in particular otherwise.
bool may_search(const struct stat& dir, bool owner, uid_t uid, gid_t gid) {
  if (owner && dir.st_uid == uid) return (dir.st_mode & S_IXUSR) != 0;
  if (dir.st_gid == gid) return (dir.st_mode & S_IXGRP) != 0;
  return (dir.st_mode & S_IXOTH) != 0;
}

// Takes from `out` each read bit whose class cannot search every directory above `file`.
void narrow_by_directories(const std::filesystem::path& file, Access& out, DirStats& dirs) {
  for (std::filesystem::path dir = file.parent_path(); !dir.empty(); dir = dir.parent_path()) {
    auto it = dirs.find(dir.string());
    if (it == dirs.end()) {
      struct stat ds {};
      if (::stat(dir.c_str(), &ds) != 0) {
        out.read &= S_IRUSR;
        ds.st_mode = 0;  // remembered as searchable by nobody
      }
      it = dirs.emplace(dir.string(), ds).first;
    }
    const struct stat& ds = it->second;
    if (!(ds.st_mode & S_IXOTH)) out.read &= ~S_IROTH;
    if (!may_search(ds, false, out.uid, out.gid)) out.read &= ~S_IRGRP;
    if (!may_search(ds, true, out.uid, out.gid)) out.read &= ~S_IRUSR;
    if (dir == dir.root_path()) break;
  }
}

}  // namespace

Access source_access(const std::filesystem::path& path, const struct stat& st, DirStats& dirs) {
  Access out{st.st_uid, st.st_gid, static_cast<mode_t>(st.st_mode & 0444)};
  std::error_code ec;
  std::filesystem::path lexical = std::filesystem::absolute(path, ec).lexically_normal();
  if (ec) lexical = path;
  narrow_by_directories(lexical, out, dirs);
  // Through a symlink (of the file or of a directory above it) the bytes come from the target:
  // its directories must be searchable too, wherever they are.
  const std::filesystem::path target = std::filesystem::canonical(path, ec);
  if (!ec && target != lexical) narrow_by_directories(target, out, dirs);
  return out;
}

Access combine_access(std::span<const Access> sources, uid_t mounter_uid, gid_t mounter_gid) {
  if (sources.empty()) return {mounter_uid, mounter_gid, 0444};
  Access out = sources.front();
  bool same_uid = true, same_gid = true;
  for (const Access& a : sources) {
    same_uid = same_uid && a.uid == out.uid;
    same_gid = same_gid && a.gid == out.gid;
    out.read &= a.read;
  }
  if (!same_uid) {
    out.uid = mounter_uid;
    out.read |= S_IRUSR;
  }
  if (!same_gid) {
    out.gid = mounter_gid;
    out.read &= ~S_IRGRP;
  }
  return out;
}

}  // namespace ckptfs::fs
