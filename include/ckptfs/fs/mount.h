// Serving a Tree through libfuse3's low-level API, read-only.
//
// Thread-safety: call mount() from one thread while no other thread of the process runs: it
// installs process-wide signal handlers and (in the background) forks, and a forked child keeps
// only the calling thread. The Tree is then served from libfuse's worker threads at once.
// unmount, check_log_file and prepare_mountpoint keep no state and may be called from any thread.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "ckptfs/fs/tree.h"

namespace ckptfs::fs {

struct MountOptions {
  bool foreground = false;
  bool cache = false;  // page-cache mode with keep_cache (mmap users)
  // The -o list, passed on to libfuse (each entry may hold a comma-separated list). Handled
  // here instead: "cache" (same as cache = true), "noreadahead" (no read-ahead thread in
  // direct_io mode), "nosplice" (every READ gathered: the default, since a spliced READ's source
  // check runs before the kernel's copy), "splice" (READs of few long runs spliced while other
  // readers' READs are served too, if pipes may hold 2 MiB; a warning if not), "splice=always"
  // (every such READ, in 512 KiB READs unless pipes may hold 2 MiB), "max_read=N" (also passed on),
  // "max_threads=N", "max_idle_threads=N", "readahead_max=BYTES" (what all open files may hold read
  // ahead together, 256M by default; K, M and G suffixes; 0: no read-ahead), "decrypt_max=BYTES"
  // (what the decrypted pages of all encrypted sources may hold together, 256M by default; one
  // page is always allowed). "nonempty" (mount over a directory that is not empty). "ro" is always
  // forced.
  std::vector<std::string> fuse_options;
  // Over encrypted sources (Tree::encrypted) "allow_other" and "allow_root" are refused unless
  // this is set (--allow-other-decrypted), and "cache" and splicing are turned off (with a
  // warning if asked for): decrypted bytes go only to the mounting user, straight from the daemon's
  // buffers.
  bool allow_other_decrypted = false;
  std::string log_file;  // where the daemon logs once detached
  // What is mounted and why (the sources chosen), in one line: MOUNTPOINT/.ckptfs/sources.json.
  std::string chosen;
  // Shown as "ckptfs:<fsname>" in /proc/mounts; empty: the directory the sources share.
  std::string fsname;
  // Called once the kernel mount exists, before serving starts: what the caller has to say
  // about a mount that happened (nothing, when the options or the mount fail).
  std::function<void()> on_mounted;
};

// Mounts and serves until unmounted. In the foreground it returns when unmounted. Otherwise the
// parent returns 0 once the kernel mount exists and the child serves it, or throws Error (and
// leaves no mount) if mounting failed. The server reads `tree` in place (the child's copy of
// it after the fork), so it must outlive the call.
int mount(const std::filesystem::path& mountpoint, const Tree& tree, const MountOptions& options);

// Throws Error in one line unless `log_file` can be opened for appending (it is created if
// missing), so that a daemon is never started with nowhere to log.
void check_log_file(const std::string& log_file);

// Unmounts a ckptfs mount; `lazy` detaches it now and lets open files finish (umount -l). Throws
// Error naming the mountpoint.
void unmount(const std::filesystem::path& mountpoint, bool lazy = false);

// Readies `mountpoint` for a mount: creates it (and its parents) if missing; if it is a ckptfs
// mount whose daemon is gone (ENOTCONN), detaches that dead mount with a warning; refuses a
// directory that is not empty unless `nonempty`, and anything that is not a directory. Throws
// Error saying what to do.
void prepare_mountpoint(const std::filesystem::path& mountpoint, bool nonempty);

}  // namespace ckptfs::fs
