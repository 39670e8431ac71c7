#include "ckptfs/source/discover.h"

#include <fmt/format.h>

#include <algorithm>
#include <system_error>

#include "ckptfs/error.h"
#include "ckptfs/util/open_path.h"

namespace ckptfs::source {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kRankPrefix = "rank_";
constexpr std::string_view kCheckpointSuffix = ".ckpt";
constexpr std::string_view kSafetensorsSuffix = ".safetensors";

bool is_checkpoint_name(std::string_view name) {
  return name.ends_with(kCheckpointSuffix) || name.ends_with(kSafetensorsSuffix);
}
constexpr std::string_view kBreakpointTail = "_breakpoint";
// MindFormers' output/ keeps rank directories one level down.
constexpr std::string_view kMindFormersCheckpoints = "checkpoint";
constexpr std::string_view kMindFormersStrategies = "strategy";
// Naming more ignored entries than this in one line only buries the useful part.
constexpr size_t kMaxNamesPerLine = 5;

// Names of the entries of `dir` in byte order, so that messages and choices never depend on the
// order the filesystem lists them in.
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

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool is_rank_name(std::string_view name) {
  return name.starts_with(kRankPrefix) && all_digits(name.substr(kRankPrefix.size()));
}

// Decimal digits as a number; nullopt past 18 significant digits.
std::optional<int64_t> number(std::string_view digits) {
  while (digits.size() > 1 && digits.front() == '0') digits.remove_prefix(1);
  if (digits.size() > 18) return std::nullopt;
  int64_t value = 0;
  for (char c : digits) value = value * 10 + (c - '0');
  return value;
}

// The integers of `s`, in order, each saturated at 18 digits' worth.
std::vector<int64_t> integers(std::string_view s) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < s.size();) {
    if (s[i] < '0' || s[i] > '9') {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
    out.push_back(number(s.substr(i, j - i)).value_or(INT64_MAX));
    i = j;
  }
  return out;
}

}  // namespace

Candidate make_candidate(std::string name) {
  Candidate c;
  std::string_view stem(name);
  stem.remove_suffix(stem.ends_with(kCheckpointSuffix) ? kCheckpointSuffix.size()
                                                       : kSafetensorsSuffix.size());
  if (stem.ends_with(kBreakpointTail)) {
    c.breakpoint = true;
    stem.remove_suffix(kBreakpointTail.size());
  }
  // "<digits>_<digits>" at the very end of the stem.
  const size_t under = stem.rfind('_');
  if (under != std::string_view::npos && all_digits(stem.substr(under + 1))) {
    size_t begin = under;
    while (begin > 0 && stem[begin - 1] >= '0' && stem[begin - 1] <= '9') --begin;
    if (begin < under) {
      c.step = StepKey{number(stem.substr(begin, under - begin)).value_or(INT64_MAX),
                       number(stem.substr(under + 1)).value_or(INT64_MAX)};
    }
  }
  c.name = std::move(name);
  return c;
}

namespace {

// The last two integers of a name, missing ones -1 (so fewer integers sort first).
std::pair<int64_t, int64_t> last_two(std::string_view name) {
  const std::vector<int64_t> ints = integers(name);
  const size_t n = ints.size();
  return {n >= 2 ? ints[n - 2] : -1, n >= 1 ? ints[n - 1] : -1};
}

// Why `path` (symlinks followed) is not of the wanted type; nullopt when it is.
// "not a regular file: a FIFO (named pipe)", "not a directory: a symlink loop (...)".
std::optional<std::string> type_mismatch(const fs::path& path, fs::file_type wanted) {
  const bool dir = wanted == fs::file_type::directory;
  const std::string_view expected = dir ? "not a directory" : "not a regular file";
  if (auto kind = util::wrong_kind(path, dir ? S_IFDIR : S_IFREG))
    return fmt::format("{}: {}", expected, *kind);
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec) return fmt::format("cannot stat it: {}", ec.message());
  if (status.type() == wanted) return std::nullopt;
  return std::string(expected);
}

// Why a rank directory gave no candidate, for the message that counts it missing: "rank_5/ is
// empty", "rank_7/ holds no regular checkpoint file (checkpoint_7.ckpt: not a regular file: a
// FIFO (named pipe))".
std::string why_no_candidate(const fs::path& rank_dir, size_t entries,
                             const std::vector<Ignored>& ignored, size_t first_ignored) {
  const std::string name = rank_dir.filename().string() + "/";
  if (entries == 0) return name + " is empty";
  std::string odd;
  for (size_t i = first_ignored; i < ignored.size(); ++i) {
    const std::string file = ignored[i].path.filename().string();
    if (!is_checkpoint_name(file) || ignored[i].side_file || file.starts_with('.')) continue;
    odd += fmt::format("{}{}: {}", odd.empty() ? "" : "; ", file, ignored[i].why);
  }
  if (odd.empty()) return name + " holds no regular, non-hidden *.ckpt or *.safetensors file";
  return fmt::format("{} holds no regular checkpoint file ({})", name, odd);
}

bool is_side_file(std::string_view name) {
  return name.ends_with(".tmp") || name.ends_with(".meta") || name == "meta.json";
}

RankDir list_rank_dir(const fs::path& rank_dir, std::vector<Ignored>& ignored) {
  RankDir out{rank_dir, {}};
  for (std::string& name : sorted_names(rank_dir)) {
    const fs::path path = rank_dir / name;
    if (is_side_file(name)) {
      ignored.push_back({path, "not a checkpoint (a partial save or a side file)", true});
    } else if (!is_checkpoint_name(name)) {
      ignored.push_back({path, "not a *.ckpt or *.safetensors file"});
    } else if (name.starts_with('.')) {
      ignored.push_back({path, "hidden file"});
    } else if (auto why = type_mismatch(path, fs::file_type::regular)) {
      ignored.push_back({path, *why});
    } else {
      out.candidates.push_back(make_candidate(std::move(name)));
    }
  }
  std::sort(out.candidates.begin(), out.candidates.end(), candidate_before);
  // MindSpore's transform refuses such a directory too: which format would be meant?
  const auto ckpt =
      std::find_if(out.candidates.begin(), out.candidates.end(),
                   [](const Candidate& c) { return c.name.ends_with(kCheckpointSuffix); });
  const auto st =
      std::find_if(out.candidates.begin(), out.candidates.end(),
                   [](const Candidate& c) { return c.name.ends_with(kSafetensorsSuffix); });
  if (ckpt != out.candidates.end() && st != out.candidates.end())
    fail(
        "{} and {}: a rank directory holds both .ckpt and .safetensors checkpoints; keep one "
        "format (MindSpore refuses this too)",
        (rank_dir / ckpt->name).string(), (rank_dir / st->name).string());
  return out;
}

bool has_rank_dirs(const fs::path& dir) {
  for (const std::string& name : sorted_names(dir))
    if (is_rank_name(name) && !type_mismatch(dir / name, fs::file_type::directory)) return true;
  return false;
}

}  // namespace

std::string StepKey::str() const { return fmt::format("{}_{}", epoch, step); }
std::string StepKey::text() const { return fmt::format("epoch {} step {}", epoch, step); }

bool candidate_before(const Candidate& a, const Candidate& b) {
  const auto ka = last_two(a.name), kb = last_two(b.name);
  if (ka != kb) return ka < kb;
  return a.name < b.name;
}

Listing list_sources(const fs::path& src_dir) {
  std::error_code ec;
  const fs::file_status status = fs::status(src_dir, ec);
  if (ec) fail("{}: cannot open source directory: {}", src_dir.string(), ec.message());
  if (!fs::is_directory(status)) fail("{}: source is not a directory", src_dir.string());

  Listing result;
  result.root = src_dir;
  const fs::path checkpoints = src_dir / kMindFormersCheckpoints;
  if (!has_rank_dirs(src_dir) && !type_mismatch(checkpoints, fs::file_type::directory) &&
      has_rank_dirs(checkpoints)) {
    result.root = checkpoints;
    const fs::path strategies = src_dir / kMindFormersStrategies;
    if (!type_mismatch(strategies, fs::file_type::directory))
      result.mindformers_strategy = strategies;
  }

  std::map<int64_t, std::string> rank_dir_names;
  for (const std::string& name : sorted_names(result.root)) {
    const fs::path path = result.root / name;
    if (!is_rank_name(name)) {
      result.ignored.push_back({path, "not a rank_<digits> directory"});
      continue;
    }
    const std::optional<int64_t> rank = number(name.substr(kRankPrefix.size()));
    if (auto why = type_mismatch(path, fs::file_type::directory)) {
      result.ignored.push_back({path, *why});
      if (rank) result.unusable.emplace(*rank, fmt::format("{} is {}", name, *why));
      continue;
    }
    if (!rank) {
      result.ignored.push_back({path, "rank number too large"});
      continue;
    }
    const size_t first_ignored = result.ignored.size();
    RankDir dir = list_rank_dir(path, result.ignored);
    if (dir.candidates.empty()) {
      const size_t entries = result.ignored.size() - first_ignored;
      const std::string why = why_no_candidate(path, entries, result.ignored, first_ignored);
      result.ignored.push_back({path, why});
      result.unusable.emplace(*rank, why);
      continue;
    }
    auto [it, inserted] = rank_dir_names.emplace(*rank, name);
    if (!inserted) {
      fail("{}: {} and {} both hold rank {}; remove one of them", result.root.string(), it->second,
           name, *rank);
    }
    result.ranks.emplace(*rank, std::move(dir));
  }
  return result;
}

std::string ignored_summary(const Listing& listing) {
  std::vector<std::string> names;
  for (const Ignored& entry : listing.ignored) {
    if (entry.side_file) continue;
    std::error_code ec;
    fs::path rel = fs::relative(entry.path, listing.root, ec);
    names.push_back(ec || rel.empty() ? entry.path.string() : rel.string());
  }
  if (names.empty()) return "";
  std::string list;
  for (size_t i = 0; i < names.size() && i < kMaxNamesPerLine; ++i)
    list += (i > 0 ? ", " : "") + names[i];
  if (names.size() > kMaxNamesPerLine)
    list += fmt::format(" and {} more", names.size() - kMaxNamesPerLine);
  return fmt::format("{}: ignored {} {} that {} not checkpoints ({}); --log-level debug says why",
                     listing.root.string(), names.size(), names.size() == 1 ? "entry" : "entries",
                     names.size() == 1 ? "is" : "are", list);
}

}  // namespace ckptfs::source
