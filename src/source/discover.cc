#include "ckptfs/source/discover.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <string_view>
#include <system_error>

#include "ckptfs/error.h"

namespace ckptfs::source {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kRankPrefix = "rank_";
constexpr std::string_view kCheckpointSuffix = ".ckpt";
// Naming more ignored checkpoints than this in one warning only buries the useful part.
constexpr size_t kMaxNamesPerWarning = 5;

// Names of the entries of `dir` in byte order, so that warnings and the chosen file never depend
// on the order the filesystem lists them in.
std::vector<std::string> sorted_names(const fs::path& dir) {
  std::error_code ec;
  std::vector<std::string> names;
  fs::directory_iterator it(dir, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  if (ec) fail("{}: cannot read directory: {}", dir.string(), ec.message());
  std::sort(names.begin(), names.end());
  return names;
}

bool is_rank_name(std::string_view name) {
  if (!name.starts_with(kRankPrefix) || name.size() == kRankPrefix.size()) return false;
  name.remove_prefix(kRankPrefix.size());
  return std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The rank of a name accepted by is_rank_name; nullopt if it does not fit in int64_t.
std::optional<int64_t> rank_number(std::string_view name) {
  std::string_view digits = name.substr(kRankPrefix.size());
  while (digits.size() > 1 && digits.front() == '0') digits.remove_prefix(1);
  if (digits.size() > 18) return std::nullopt;
  int64_t rank = 0;
  for (char c : digits) rank = rank * 10 + (c - '0');
  return rank;
}

// What stat (following symlinks) says about `path`, as a reason to ignore it; nullopt when it is
// of the wanted type.
std::optional<std::string> type_mismatch(const fs::path& path, fs::file_type wanted) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec) return fmt::format("cannot stat it: {}", ec.message());
  if (status.type() == wanted) return std::nullopt;
  return wanted == fs::file_type::directory ? "not a directory" : "not a regular file";
}

std::string name_list(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < kMaxNamesPerWarning; ++i) {
    if (i > 0) out += ", ";
    out += names[i];
  }
  if (names.size() > kMaxNamesPerWarning) {
    out += fmt::format(" and {} more", names.size() - kMaxNamesPerWarning);
  }
  return out;
}

// The chosen checkpoint of one rank directory, or nullopt (with a warning) if it has none.
std::optional<fs::path> choose_file(const fs::path& rank_dir, std::vector<std::string>& warnings) {
  std::vector<std::string> candidates;  // in byte order, because sorted_names is
  for (const std::string& name : sorted_names(rank_dir)) {
    const fs::path path = rank_dir / name;
    if (!name.ends_with(kCheckpointSuffix)) {
      warnings.push_back(fmt::format("{}: ignored, not a *.ckpt file", path.string()));
    } else if (name.starts_with('.')) {
      warnings.push_back(fmt::format("{}: ignored, hidden file", path.string()));
    } else if (auto why = type_mismatch(path, fs::file_type::regular)) {
      warnings.push_back(fmt::format("{}: ignored, {}", path.string(), *why));
    } else {
      candidates.push_back(name);
    }
  }
  if (candidates.empty()) {
    warnings.push_back(fmt::format("{}: ignored, no regular *.ckpt file in it", rank_dir.string()));
    return std::nullopt;
  }
  // All candidates share the directory prefix, so the last name is also the last full path.
  const std::string chosen = candidates.back();
  candidates.pop_back();
  if (!candidates.empty()) {
    warnings.push_back(fmt::format("{}: using {}, the last *.ckpt in name order; ignored: {}",
                                   rank_dir.string(), chosen, name_list(candidates)));
  }
  return rank_dir / chosen;
}

}  // namespace

Discovery discover(const fs::path& src_dir) {
  std::error_code ec;
  const fs::file_status status = fs::status(src_dir, ec);
  if (ec) fail("{}: cannot open source directory: {}", src_dir.string(), ec.message());
  if (!fs::is_directory(status)) fail("{}: source is not a directory", src_dir.string());

  Discovery result;
  std::map<int64_t, std::string> rank_dir_names;
  for (const std::string& name : sorted_names(src_dir)) {
    const fs::path path = src_dir / name;
    if (!is_rank_name(name)) {
      result.warnings.push_back(
          fmt::format("{}: ignored, not a rank_<digits> directory", path.string()));
      continue;
    }
    if (auto why = type_mismatch(path, fs::file_type::directory)) {
      result.warnings.push_back(fmt::format("{}: ignored, {}", path.string(), *why));
      continue;
    }
    const std::optional<int64_t> rank = rank_number(name);
    if (!rank) {
      result.warnings.push_back(fmt::format("{}: ignored, rank number too large", path.string()));
      continue;
    }
    std::optional<fs::path> file = choose_file(path, result.warnings);
    if (!file) continue;
    auto [it, inserted] = rank_dir_names.emplace(*rank, name);
    if (!inserted) {
      fail("{}: {} and {} both hold rank {}; remove one of them", src_dir.string(), it->second,
           name, *rank);
    }
    result.files.emplace(*rank, std::move(*file));
  }
  return result;
}

}  // namespace ckptfs::source
