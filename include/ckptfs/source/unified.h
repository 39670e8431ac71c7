// MindSpore's unified_safetensors output (spec mindspore-safetensors.md §2.4): one full
// checkpoint in part<i>.safetensors files, hyper_param.safetensors (the entries no strategy
// names) and param_name_map.json saying which part holds each parameter. Reads only the map.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ckptfs::source {

inline constexpr char kParamNameMap[] = "param_name_map.json";
inline constexpr char kHyperParamFile[] = "hyper_param.safetensors";

struct UnifiedDir {
  // The files the map names, part<i> in numeric order, then hyper_param.safetensors if present.
  std::vector<std::filesystem::path> files;
  std::map<std::string, std::string> weight_map;  // parameter -> file name in the directory
};

// nullopt when `dir` holds no param_name_map.json. Reads the map in either form MindSpore
// writes: flat {name: file} (2.4, 2.5) or {"metadata": {...}, "weight_map": {name: file}}
// (>= 2.6). Throws Error naming the map for malformed JSON, a value that is not the name of a
// regular *.safetensors file in `dir`, and a map naming no file.
std::optional<UnifiedDir> read_unified(const std::filesystem::path& dir);

}  // namespace ckptfs::source
