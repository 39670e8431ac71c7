#include "ckptfs/plan/model_files.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>

#include "ckptfs/error.h"
#include "ckptfs/safetensors/format.h"

namespace ckptfs::plan {

uint64_t parse_shard_size(const std::string& text) {
  std::string lower;
  for (char c : text) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "none") return 0;
  static const std::pair<std::string_view, double> kUnits[] = {{"kib", 1024.0},
                                                               {"mib", 1024.0 * 1024},
                                                               {"gib", 1024.0 * 1024 * 1024},
                                                               {"tib", 1024.0 * 1024 * 1024 * 1024},
                                                               {"kb", 1e3},
                                                               {"mb", 1e6},
                                                               {"gb", 1e9},
                                                               {"tb", 1e12},
                                                               {"b", 1.0}};
  double unit = 1.0;
  std::string_view number = lower;
  for (const auto& [suffix, scale] : kUnits)
    if (number.ends_with(suffix)) {
      number.remove_suffix(suffix.size());
      unit = scale;
      break;
    }
  double value = 0;
  const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value,
                                         std::chars_format::fixed);
  const double bytes = value * unit;
  if (number.empty() || ec != std::errc() || end != number.data() + number.size() ||
      !std::isfinite(bytes) || bytes < 0 || bytes >= 1.8e19)
    fail(
        "--shard-size {}: expected a size such as 5GB, 2GiB or 1000000 (bytes), or 0 or none "
        "for one model.safetensors",
        text);
  return static_cast<uint64_t>(bytes);
}

std::vector<std::vector<size_t>> split_shards(std::span<const uint64_t> sizes, uint64_t max) {
  if (max == 0) {
    std::vector<size_t> all(sizes.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    return {std::move(all)};
  }
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> current;
  uint64_t current_size = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] > max) {
      shards.push_back({i});
      continue;
    }
    if (current_size + sizes[i] > max) {
      shards.push_back(std::move(current));
      current.clear();
      current_size = 0;
    }
    current.push_back(i);
    current_size += sizes[i];
  }
  if (!current.empty() || shards.empty()) shards.push_back(std::move(current));
  return shards;
}

std::string shard_file_name(size_t k, size_t n) {
  return fmt::format("model-{:05d}-of-{:05d}.safetensors", k, n);
}

std::string shard_index_json(std::span<const ModelEntry> model,
                             const std::vector<std::vector<size_t>>& shards) {
  nlohmann::json map = nlohmann::json::object();  // keys sorted: what sort_keys gives
  uint64_t total = 0;
  for (size_t k = 0; k < shards.size(); ++k)
    for (size_t i : shards[k]) {
      map[model[i].name] = shard_file_name(k + 1, shards.size());
      total += model[i].nbytes;
    }
  const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", map}};
  try {
    return index.dump(2, ' ', /*ensure_ascii=*/true) + "\n";
  } catch (const nlohmann::json::exception&) {
    fail("model.safetensors.index.json: a tensor name is not UTF-8; rename it with --rename");
  }
}

namespace {

VirtualFile safetensors_file(std::span<const ModelEntry> model, const std::vector<size_t>& which) {
  std::vector<safetensors::HeaderEntry> header;
  header.reserve(which.size());
  for (size_t i : which)
    header.push_back({model[i].name, model[i].code, model[i].shape, model[i].nbytes});
  const std::vector<size_t> order = safetensors::sort_like_writer(header);
  static const std::vector<std::pair<std::string, std::string>> kMetadata{{"format", "pt"}};
  VirtualFile::Builder builder;
  builder.add_bytes(safetensors::encode_header(header, kMetadata));
  for (size_t k : order) model[which[k]].add_content(builder);
  return builder.finish();
}

void add_root_file(Plan& plan, std::string name, VirtualFile file) {
  TargetFile target;
  target.rank = kRootRank;
  target.name = std::move(name);
  target.file = std::move(file);
  plan.targets.push_back(std::move(target));
}

}  // namespace

void add_model_files(Plan& plan, std::span<const ModelEntry> model, uint64_t shard_size) {
  std::vector<uint64_t> sizes;
  sizes.reserve(model.size());
  for (const ModelEntry& e : model) sizes.push_back(e.nbytes);
  const std::vector<std::vector<size_t>> shards = split_shards(sizes, shard_size);
  if (shards.size() == 1) {
    add_root_file(plan, "model.safetensors", safetensors_file(model, shards[0]));
    return;
  }
  for (size_t k = 0; k < shards.size(); ++k)
    add_root_file(plan, shard_file_name(k + 1, shards.size()), safetensors_file(model, shards[k]));
  VirtualFile::Builder index;
  index.add_bytes(shard_index_json(model, shards));
  add_root_file(plan, "model.safetensors.index.json", index.finish());
}

}  // namespace ckptfs::plan
