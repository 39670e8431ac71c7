#include "ckptfs/source/unified.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>
#include <tuple>

#include "ckptfs/error.h"
#include "ckptfs/util/open_path.h"
#include "ckptfs/util/quote.h"

namespace ckptfs::source {

namespace fs = std::filesystem;

namespace {

// part<i>.safetensors by i, anything else after them by name.
std::tuple<bool, uint64_t, std::string> part_key(const std::string& name) {
  constexpr std::string_view kPart = "part", kSuffix = ".safetensors";
  std::string_view digits(name);
  if (digits.starts_with(kPart) && digits.ends_with(kSuffix)) {
    digits = digits.substr(kPart.size(), digits.size() - kPart.size() - kSuffix.size());
    if (!digits.empty() && digits.size() < 19 &&
        std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return {false, std::stoull(std::string(digits)), name};
  }
  return {true, 0, name};
}

}  // namespace

std::optional<UnifiedDir> read_unified(const fs::path& dir) {
  const fs::path map_path = dir / kParamNameMap;
  std::error_code ec;
  if (!fs::exists(map_path, ec)) return std::nullopt;
  const std::string text = util::read_regular(map_path, "file");
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail("{}: byte offset {}: not valid JSON ({})", map_path.string(), e.byte > 0 ? e.byte - 1 : 0,
         json_error_text(e.what()));
  } catch (const nlohmann::json::exception& e) {  // e.g. a number beyond a double's range
    fail("{}: not valid JSON ({})", map_path.string(), json_error_text(e.what()));
  }
  // >= 2.6 wraps the map; 2.4 and 2.5 write it flat.
  const nlohmann::json* map = &doc;
  if (doc.is_object() && doc.contains("weight_map")) map = &doc["weight_map"];
  if (!map->is_object())
    fail("{}: expected {{name: file}} or {{\"weight_map\": {{name: file}}}}", map_path.string());

  UnifiedDir out;
  std::set<std::string> files;
  for (const auto& [name, value] : map->items()) {
    if (!value.is_string())
      fail("{}: parameter {} maps to a JSON {}, not a file name", map_path.string(), name,
           value.type_name());
    const std::string file = value.get<std::string>();
    if (!file.ends_with(".safetensors") || file.find('/') != std::string::npos)
      fail("{}: parameter {} maps to \"{}\", not a *.safetensors file of {}", map_path.string(),
           name, file, dir.string());
    if (files.insert(file).second) {
      const fs::path path = dir / file;
      if (auto kind = util::wrong_kind(path, S_IFREG))
        fail("{}: parameter {} is in {}, which is {}, not a regular file", map_path.string(), name,
             path.string(), *kind);
      if (!fs::is_regular_file(path, ec))
        fail("{}: parameter {} is in {}, which is missing", map_path.string(), name, path.string());
    }
    out.weight_map.emplace(name, file);
  }
  if (files.empty()) fail("{}: names no parameter", map_path.string());
  std::vector<std::string> ordered(files.begin(), files.end());
  std::sort(ordered.begin(), ordered.end(),
            [](const std::string& a, const std::string& b) { return part_key(a) < part_key(b); });
  for (const std::string& f : ordered) out.files.push_back(dir / f);
  if (!files.count(kHyperParamFile) && fs::is_regular_file(dir / kHyperParamFile, ec))
    out.files.push_back(dir / kHyperParamFile);
  return out;
}

}  // namespace ckptfs::source
