#include "mount_helper.h"

#include <filesystem>
#include <string>
#include <string_view>

#include "ckptfs/error.h"

namespace ckptfs::cli {

namespace {

// fstab and mount(8) words that mean nothing to a FUSE server.
bool is_mount_command_word(std::string_view o) {
  return o == "defaults" || o == "auto" || o == "noauto" || o == "user" || o == "users" ||
         o == "nouser" || o == "owner" || o == "group" || o == "nofail" || o == "_netdev" ||
         o == "ro" || o == "rw" || o == "suid" || o == "nosuid" || o == "dev" || o == "nodev" ||
         o == "exec" || o == "noexec" || o.starts_with("x-") || o.starts_with("comment=");
}

// ckptfs options given as -o key=value, by key.
constexpr std::pair<std::string_view, std::string_view> kOwnOptions[] = {
    {"src_strategy", "--src-strategy"},
    {"dst_strategy", "--dst-strategy"},
    {"index_dir", "--index-dir"},
    {"log_file", "--log-file"},
    {"step", "--step"},
    {"view", "--view"},
    {"prefix", "--prefix"},
};

}  // namespace

bool is_mount_helper(std::string_view argv0) {
  const std::string name = std::filesystem::path(argv0).filename().string();
  return name.starts_with("mount.");
}

std::vector<std::string> mount_helper_args(const std::vector<std::string>& args, bool& fake) {
  // mount(8) calls: mount.fuse.ckptfs SOURCE MOUNTPOINT [-sfnv] [-o OPTIONS] [-t TYPE]
  fake = false;
  std::vector<std::string> positional, options;
  std::string log_level;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-o" || a == "-t" || a == "-N") {
      if (i + 1 >= args.size()) fail("mount helper: {} needs a value", a);
      if (a == "-o") options.push_back(args[i + 1]);
      ++i;
    } else if (a.starts_with("-o")) {
      options.push_back(a.substr(2));
    } else if (a.size() > 1 && a[0] == '-') {
      // -s (sloppy), -n (no mtab), -v (verbose), -f (fake: do everything but mount)
      for (char c : std::string_view(a).substr(1)) {
        if (c == 'f')
          fake = true;
        else if (c == 'v')
          log_level = "info";
        else if (c != 's' && c != 'n' && c != 'r' && c != 'w')
          fail("mount helper: unknown flag -{}", c);
      }
    } else {
      positional.push_back(a);
    }
  }
  if (positional.size() != 2)
    fail(
        "mount helper: expected SOURCE and MOUNTPOINT, got {} arguments; an fstab line reads "
        "\"SRC_DIR MOUNTPOINT fuse.ckptfs dst_strategy=PATH,src_strategy=PATH 0 0\"",
        positional.size());
  std::vector<std::string> out = {args[0]};
  std::vector<std::string> fuse;
  std::vector<std::string> own;
  for (const std::string& list : options) {
    size_t begin = 0;
    while (begin <= list.size()) {
      size_t end = list.find(',', begin);
      if (end == std::string::npos) end = list.size();
      const std::string o = list.substr(begin, end - begin);
      begin = end + 1;
      if (o.empty() || is_mount_command_word(o)) continue;
      const size_t eq = o.find('=');
      const std::string_view key = std::string_view(o).substr(0, eq);
      if (key == "log_level" && eq != std::string::npos) {
        log_level = o.substr(eq + 1);
        continue;
      }
      bool mine = false;
      for (const auto& [name, flag] : kOwnOptions) {
        if (key != name) continue;
        if (eq == std::string::npos) fail("mount option {} needs a value: {}=...", o, o);
        own.emplace_back(flag);
        own.push_back(o.substr(eq + 1));
        mine = true;
      }
      if (!mine) fuse.push_back(o);
    }
  }
  if (!log_level.empty()) {
    out.push_back("--log-level");
    out.push_back(log_level);
  }
  out.push_back("mount");
  out.push_back(positional[0]);
  out.push_back(positional[1]);
  out.insert(out.end(), own.begin(), own.end());
  for (const std::string& o : fuse) {
    out.push_back("-o");
    out.push_back(o);
  }
  return out;
}

}  // namespace ckptfs::cli
