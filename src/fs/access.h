// Who may read a target file: its owner, group and read bits come from the source files it is
// made of, so a view is never more readable than its sources (the mount always runs with
// default_permissions, so the kernel enforces these bits). Pure functions over stat results;
// safe from any thread.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <filesystem>
#include <map>
#include <span>
#include <string>

namespace ckptfs::fs {

struct Access {
  uid_t uid = 0;
  gid_t gid = 0;
  mode_t read = 0;  // read bits only (0444 at most)
  bool operator==(const Access&) const = default;
};

// Stats of directories already seen, so that many sources in one directory cost one stat each.
using DirStats = std::map<std::string, struct stat, std::less<>>;

// The owner, group and *effective* read bits of the file at `path` (stat `st`): a class keeps
// its read bit only if it may also search every directory above the file (the owner through
// each directory's owner, group or other bits as the directory's owner and group match; the
// group likewise; others through the other bits), since a 0644 file in a 0700 directory is
// not readable by others. A directory that cannot be stat'ed takes every bit but the owner's.
// A symlink is followed (`latest` links and rank directories on other volumes are common): `st`
// is the target's, and the directories above the target count as well as those above `path`.
Access source_access(const std::filesystem::path& path, const struct stat& st, DirStats& dirs);

// The access of a file made of `sources`: the owner if every source has the same one (else
// `mounter_uid`, who could read them all), likewise the group (else `mounter_gid`, and no
// group bit: the mounter's group had no say over the sources); the owner bit and the group bit
// only if every source grants it to its (common) owner and group; the other bit only if every
// source grants it. No sources: the mounter's, 0444.
Access combine_access(std::span<const Access> sources, uid_t mounter_uid, gid_t mounter_gid);

}  // namespace ckptfs::fs
