#include "memory_limit.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>

namespace ckptfs::fs {

namespace {

namespace stdfs = std::filesystem;

// The number in `file` (its first line), or ~0 for "max", a missing file or anything else.
uint64_t read_limit(const stdfs::path& file) {
  std::ifstream in(file);
  std::string line;
  if (!in || !std::getline(in, line)) return ~uint64_t{0};
  uint64_t n = 0;
  const auto [end, ec] = std::from_chars(line.data(), line.data() + line.size(), n);
  return ec == std::errc() && end != line.data() ? n : ~uint64_t{0};
}

// The least `name` in `group` (under `base`) and the groups above it up to `base`. A group the
// file names that is not under `base` (the kernel names it from outside this mount namespace)
// leaves `base`'s own limit: in a container that is the container's group.
uint64_t least_limit(const stdfs::path& base, std::string_view group, const char* name) {
  stdfs::path dir = base / stdfs::path(group).relative_path();
  std::error_code ec;
  if (!stdfs::is_directory(dir, ec)) dir = base;
  uint64_t least = ~uint64_t{0};
  for (;; dir = dir.parent_path()) {
    least = std::min(least, read_limit(dir / name));
    if (dir == base || !dir.has_relative_path() || dir.string().size() <= base.string().size())
      break;
  }
  return least;
}

}  // namespace

uint64_t memory_limit(const stdfs::path& proc_cgroup, const stdfs::path& cgroup_root) {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  uint64_t limit = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
  std::ifstream in(proc_cgroup);
  // Lines "id:controllers:group": "0::group" for v2, controllers naming "memory" for v1.
  for (std::string line; std::getline(in, line);) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string_view controllers = std::string_view(line).substr(a + 1, b - a - 1);
    const std::string_view group = std::string_view(line).substr(b + 1);
    if (line.compare(0, a, "0") == 0 && controllers.empty()) {
      limit = std::min(limit, least_limit(cgroup_root, group, "memory.max"));
      continue;
    }
    for (size_t at = 0; at <= controllers.size();) {
      const size_t to = std::min(controllers.find(',', at), controllers.size());
      if (controllers.substr(at, to - at) == "memory")
        limit =
            std::min(limit, least_limit(cgroup_root / "memory", group, "memory.limit_in_bytes"));
      at = to + 1;
    }
  }
  return limit;
}

}  // namespace ckptfs::fs
