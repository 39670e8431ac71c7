#include "ckptfs/source/pinned_files.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdint>

namespace ckptfs::source {

std::string files_text(const Choice& choice) {
  std::string out = fmt::format("mixed {}\n", choice.mixed_allowed ? 1 : 0);
  for (const auto& [rank, path] : choice.files) out += fmt::format("{}\t{}\n", rank, path.string());
  return out;
}

std::optional<Choice> parse_files_text(std::string_view text) {
  Choice out;
  size_t begin = 0;
  bool first = true;
  while (begin < text.size()) {
    const size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) return std::nullopt;
    const std::string_view line = text.substr(begin, end - begin);
    begin = end + 1;
    if (first) {
      if (line != "mixed 0" && line != "mixed 1") return std::nullopt;
      out.mixed_allowed = line == "mixed 1";
      first = false;
      continue;
    }
    // The tab is looked for before from_chars is given its end (line.data() + npos would
    // point far outside the text).
    const size_t tab = line.find('\t');
    if (tab == std::string_view::npos || tab == 0) return std::nullopt;
    int64_t rank = 0;
    const auto [ptr, ec] = std::from_chars(line.data(), line.data() + tab, rank);
    if (ec != std::errc() || ptr != line.data() + tab || rank < 0) return std::nullopt;
    const std::string_view path = line.substr(tab + 1);
    if (path.empty() || path.front() != '/' || path.find('\0') != std::string_view::npos)
      return std::nullopt;
    if (!out.files.emplace(rank, std::filesystem::path(path)).second) return std::nullopt;
  }
  if (first || out.files.empty()) return std::nullopt;
  return out;
}

}  // namespace ckptfs::source
