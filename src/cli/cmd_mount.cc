// ckptfs mount / umount: source scan -> index -> strategies -> plan -> FUSE.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/error.h"
#include "ckptfs/fs/mount.h"
#include "ckptfs/fs/tree.h"
#include "ckptfs/util/open_path.h"
#include "commands.h"
#include "s3_source.h"
#include "view.h"

namespace ckptfs::cli {

namespace {

struct MountArgs {
  ViewArgs view;
  std::string mountpoint;
  std::string log_file;
  bool foreground = false;
  bool allow_other_decrypted = false;
  std::vector<std::string> options;
};

constexpr std::string_view kByStage = "by_stage";

std::vector<std::string> split_options(const std::string& list) {
  std::vector<std::string> out;
  size_t begin = 0;
  for (size_t comma; (comma = list.find(',', begin)) != std::string::npos; begin = comma + 1)
    out.push_back(list.substr(begin, comma - begin));
  out.push_back(list.substr(begin));
  return out;
}

bool has_option(const std::vector<std::string>& lists, std::string_view word) {
  for (const std::string& list : lists)
    for (const std::string& w : split_options(list))
      if (w == word) return true;
  return false;
}

// -o uid=N, gid=N and umask=OCTAL, as other FUSE filesystems take them; the words are removed
// from `options`.
struct Owner {
  std::optional<uid_t> uid;  // default: derived from the sources (fs::Tree)
  std::optional<gid_t> gid;
  mode_t umask = 0;
};

Owner take_owner(std::vector<std::string>& options) {
  Owner out;
  const auto number = [](const std::string& word, size_t skip, int base) {
    const std::string value = word.substr(skip);
    char* end = nullptr;
    errno = 0;
    const unsigned long n = std::strtoul(value.c_str(), &end, base);
    if (value.empty() || *end != '\0' || errno != 0 || n > 0xFFFFFFFEul)
      fail("bad mount option \"{}\": expected a{} number", word, base == 8 ? "n octal" : "");
    return n;
  };
  for (std::string& list : options) {
    std::string kept;
    for (const std::string& word : split_options(list)) {
      if (word.starts_with("uid="))
        out.uid = static_cast<uid_t>(number(word, 4, 10));
      else if (word.starts_with("gid="))
        out.gid = static_cast<gid_t>(number(word, 4, 10));
      else if (word.starts_with("umask="))
        out.umask = static_cast<mode_t>(number(word, 6, 8) & 0777);
      else
        kept += (kept.empty() ? "" : ",") + word;
    }
    list = kept;
  }
  std::erase(options, std::string());
  return out;
}

// The -o words go to fs::mount as they are (but by_stage, which chooses the files): it takes
// out its own (cache, noreadahead, ...) and hands the rest to libfuse.
fs::MountOptions mount_options(const MountArgs& args) {
  fs::MountOptions out;
  out.foreground = args.foreground;
  out.log_file = args.log_file;
  for (const std::string& list : args.options) {
    std::string kept;
    for (const std::string& word : split_options(list))
      if (word != kByStage) kept += (kept.empty() ? "" : ",") + word;
    if (!kept.empty()) out.fuse_options.push_back(kept);
  }
  return out;
}

void run_mount(MountArgs& args) {
  // Before the mountpoint may be created: a mistyped SRC_DIR leaves nothing behind.
  util::require_directory(args.view.src_dir, "source directory");
  // Before the sources are read: a mountpoint that cannot be used is refused at once.
  fs::prepare_mountpoint(args.mountpoint, has_option(args.options, "nonempty"));
  fs::check_log_file(args.log_file);
  if (has_option(args.options, kByStage)) args.view.by_stage = true;
  // The daemon runs in / (libfuse's daemonize), and a rank listed from a shipped index opens it
  // when it is planned, on first open.
  if (!args.view.shipped_index.empty())
    args.view.shipped_index =
        std::filesystem::absolute(args.view.shipped_index).lexically_normal().string();
  ViewNotes notes;
  std::unique_ptr<fs::Tree> tree = build_tree(args.view, notes, /*steps=*/true);
  fs::MountOptions options = mount_options(args);
  options.allow_other_decrypted = args.allow_other_decrypted;
  // A tree planned on first open has no sources yet to name the mount after.
  if (tree->lazy() != nullptr)
    options.fsname = std::filesystem::absolute(args.view.src_dir).lexically_normal().string();
  if (!s3_source_url().empty()) options.fsname = s3_source_url();
  // Over a network or S3 filesystem the operator sees the read amplification before reading.
  const std::string cost = args.view.quiet ? std::string() : plan_cost_line(*tree);
  options.on_mounted = [&notes, &cost] {
    notes.say();
    if (!cost.empty()) fmt::print(stderr, "ckptfs: {}\n", cost);
  };
  options.chosen = notes.chosen;
  const Owner owner = take_owner(options.fuse_options);
  tree->set_owner(owner.uid, owner.gid, owner.umask);
  const int rc = fs::mount(args.mountpoint, *tree, options);
  if (tree->steps()) tree->steps()->stop_watching();
  // Not freed: this process only exits now, and the detached daemon shares the tables with it
  // copy-on-write, so freeing them would copy every page they sit on first (seconds and
  // gigabytes at millions of source tensors). Kept reachable from a global, so that a leak
  // checker sees it as kept on purpose.
  [[maybe_unused]] static const fs::Tree* kept = nullptr;
  kept = tree.release();
  if (rc != 0) fail("mount at {} ended with status {}", args.mountpoint, rc);
}

}  // namespace

void add_mount_commands(CLI::App& app) {
  auto args = std::make_shared<MountArgs>();
  CLI::App* mount = add_view_command(
      app, "mount",
      "Mount SRC_DIR's checkpoints (.ckpt or .safetensors) at MOUNTPOINT as "
      "rank_N/checkpoint_N.ckpt and rank_N/checkpoint_N.safetensors files resharded from the "
      "source strategy to the destination strategy, synthesized on read",
      args->view);
  mount
      ->add_option("MOUNTPOINT", args->mountpoint,
                   "Empty directory to mount on (created if missing)")
      ->required();
  mount->add_flag("-f,--foreground", args->foreground, "Stay in the foreground until unmounted");
  mount
      ->add_option("-o", args->options,
                   "Mount options, comma-separated: cache (page-cache mode for mmap users; "
                   "default is direct I/O), noreadahead (no read-ahead thread for sequential "
                   "readers), by_stage (one _part<stage> file per source pipeline stage, as "
                   "MindSpore's by-stage transform writes; same as --by-stage), splice=auto (the "
                   "default: splice long runs of read-leased sources while several readers "
                   "read, if pipes may hold 2 MiB; same as splice), splice=never (every read "
                   "gathered; same as nosplice), splice=always, max_read=N, max_threads=N, "
                   "readahead_max=BYTES (read-ahead memory of all files, 256M; for s3:// sources "
                   "also the READs' own GETs, and the range cache when it is in memory, then 1G "
                   "or an eighth of the memory allowed if less; 0: none), "
                   "s3_spool=DIR (s3:// sources: fetched ranges held in an unlinked file there, "
                   "on a local disk, /var/tmp by default; off: in memory), s3_spool_max=BYTES "
                   "(its room, a quarter of the disk's free space by default), "
                   "decrypt_max=BYTES (decrypted pages of all encrypted sources, 256M), "
                   "s3_amplify=X (s3:// sources: the most bytes a coalesced GET fetches per "
                   "byte needed, 8; 1: one GET per run), "
                   "uid=N, gid=N, umask=OCTAL (owner and modes shown; by default a file has its "
                   "sources' owner and no read bit a source lacks, directories are 0555), or any "
                   "libfuse option such as allow_other")
      ->allow_extra_args(false);
  mount->add_flag("--allow-other-decrypted", args->allow_other_decrypted,
                  "Let -o allow_other (or allow_root) stand over encrypted sources, whose views "
                  "are otherwise the mounting user's alone");
  mount->add_option("--log-file", args->log_file,
                    "Log file of the mounted daemon (default: none once detached)");
  mount->callback([args] { run_mount(*args); });

  struct UmountArgs {
    std::string mountpoint;
    bool lazy = false;
  };
  auto umount_args = std::make_shared<UmountArgs>();
  CLI::App* umount = app.add_subcommand("umount", "Unmount a ckptfs mount");
  umount->add_option("MOUNTPOINT", umount_args->mountpoint, "Where ckptfs is mounted")->required();
  umount->add_flag("-z,--lazy", umount_args->lazy,
                   "Detach now, even while files are open; the mount goes once they are closed "
                   "(also what to do after the daemon was killed)");
  umount->callback([umount_args] { fs::unmount(umount_args->mountpoint, umount_args->lazy); });
}

}  // namespace ckptfs::cli
