#include "ckptfs/plan/rename_map.h"

#include <cerrno>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "ckptfs/error.h"
#include "ckptfs/util/quote.h"

namespace ckptfs::plan {

namespace {

std::vector<std::string_view> fields(std::string_view line) {
  std::vector<std::string_view> out;
  size_t at = 0;
  while (at < line.size()) {
    const size_t start = line.find_first_not_of(" \t\r", at);
    if (start == std::string_view::npos) break;
    const size_t end = std::min(line.find_first_of(" \t\r", start), line.size());
    out.push_back(line.substr(start, end - start));
    at = end;
  }
  return out;
}

// A REPLACEMENT's escapes checked against the REGEX's group count.
void check_replacement(std::string_view replacement, size_t groups, const std::string& where) {
  for (size_t i = 0; i < replacement.size(); ++i) {
    if (replacement[i] != '\\') continue;
    if (i + 1 == replacement.size() ||
        (replacement[i + 1] != '\\' && (replacement[i + 1] < '0' || replacement[i + 1] > '9')))
      fail("{}: a backslash in REPLACEMENT must start \\0 ... \\9 or \\\\", where);
    if (replacement[i + 1] != '\\' && static_cast<size_t>(replacement[i + 1] - '0') > groups)
      fail("{}: \\{} names no group of REGEX (it has {})", where, replacement[i + 1], groups);
    ++i;
  }
}

}  // namespace

std::shared_ptr<const RenameMap> RenameMap::read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  if (in) text << in.rdbuf();
  if (!in || in.bad())
    fail("{}: cannot read the rename map ({}); give --rename a readable file", path,
         errno_text(errno));
  return parse(text.str(), path);
}

std::shared_ptr<const RenameMap> RenameMap::parse(std::string_view text, const std::string& file) {
  auto map = std::make_shared<RenameMap>();
  map->file_ = file;
  size_t number = 0;
  for (size_t at = 0; at <= text.size();) {
    const size_t end = std::min(text.find('\n', at), text.size());
    const std::string_view line = text.substr(at, end - at);
    at = end + 1;
    ++number;
    const std::vector<std::string_view> f = fields(line);
    if (f.empty() || f[0].starts_with('#')) continue;
    const std::string where = fmt::format("{}:{}", file, number);
    if (f.size() != 2)
      fail(
          "{}: expected REGEX REPLACEMENT, found {} fields (a rule holds no whitespace; write "
          "[[:space:]] in REGEX)",
          where, f.size());
    Rule rule;
    rule.regex = std::make_unique<util::PosixRegex>(std::string(f[0]), where, /*groups=*/true);
    check_replacement(f[1], rule.regex->groups(), where);
    rule.replacement = f[1];
    rule.line = number;
    map->rules_.push_back(std::move(rule));
  }
  return map;
}

std::string RenameMap::apply(std::string_view key) const {
  for (const Rule& rule : rules_) {
    const std::optional<std::vector<regmatch_t>> m = rule.regex->match(key);
    if (!m) continue;
    std::string out;
    const std::string& r = rule.replacement;
    for (size_t i = 0; i < r.size(); ++i) {
      if (r[i] != '\\') {
        out += r[i];
      } else if (r[++i] == '\\') {
        out += '\\';
      } else {
        const regmatch_t g = (*m)[static_cast<size_t>(r[i] - '0')];
        if (g.rm_so >= 0) out.append(key.substr(g.rm_so, g.rm_eo - g.rm_so));
      }
    }
    if (out.empty())
      fail("{}:{}: renames tensor {} to an empty name; fix that rule's REPLACEMENT", file_,
           rule.line, file_text(key));
    return out;
  }
  return std::string(key);
}

std::vector<std::string> RenameMap::apply_all(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  std::unordered_map<std::string_view, size_t> served;  // name -> index into keys
  served.reserve(keys.size());
  for (const std::string& key : keys) out.push_back(apply(key));
  for (size_t i = 0; i < out.size(); ++i) {
    const auto [it, fresh] = served.emplace(out[i], i);
    if (!fresh)
      fail("{}: tensors {} and {} would both be served as {}; make the rules tell them apart",
           file_, file_text(keys[it->second]), file_text(keys[i]), file_text(out[i]));
  }
  return out;
}

}  // namespace ckptfs::plan
