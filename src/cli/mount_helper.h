// mount(8)'s helper protocol: the binary called as mount.ckptfs or mount.fuse.ckptfs (a
// symlink) turns "SOURCE MOUNTPOINT -o key=value,..." into a `ckptfs mount` command line, so that
// `mount -t fuse.ckptfs` and /etc/fstab lines work.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ckptfs::cli {

// Whether the program was called under a mount helper's name ("mount.*").
bool is_mount_helper(std::string_view argv0);

// The equivalent `ckptfs [--log-level L] mount SRC MNT [flags] [-o opt]...` arguments (argv[0]
// kept). -o keys src_strategy, dst_strategy, index_dir, log_file, step, view, prefix and
// log_level become the flags of the same name; mount(8)'s own words (defaults, noauto, nofail,
// ro, rw, user, _netdev, x-*, comment=...) are dropped; anything else stays a -o option. Sets
// `fake` for -f (mount(8)'s "do everything but the mount"). Throws Error for a malformed call.
std::vector<std::string> mount_helper_args(const std::vector<std::string>& args, bool& fake);

}  // namespace ckptfs::cli
