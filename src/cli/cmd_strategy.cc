// `ckptfs strategy show PATH [--json]`: the parameter layouts of a strategy file or directory.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckptfs/strategy/strategy.h"
#include "commands.h"

namespace ckptfs::cli {

namespace {

using strategy::DimAxes;
using strategy::ParamLayout;
using Json = nlohmann::ordered_json;

struct ShowOptions {
  std::string path;
  bool json = false;
};

// One output entry: a parameter and the stages sharing one layout. A parameter whose stages
// disagree (possible only in merged files) gets one entry per distinct layout.
struct Entry {
  const std::string* name;
  std::vector<uint32_t> stages;
  const ParamLayout* layout;
};

std::vector<Entry> entries_of(const strategy::Strategy& s) {
  std::vector<Entry> out;
  for (const auto& [name, param] : s.params) {
    const size_t first = out.size();
    for (const auto& stage_layout : param.stages) {
      // Named, not a structured binding: clang 14 cannot capture those in a lambda.
      const uint32_t stage = stage_layout.first;
      const ParamLayout& layout = stage_layout.second;
      auto same = std::find_if(out.begin() + first, out.end(),
                               [&](const Entry& e) { return *e.layout == layout; });
      if (same != out.end()) {
        same->stages.push_back(stage);
      } else {
        out.push_back({&name, {stage}, &layout});
      }
    }
  }
  return out;
}

// MindSpore's notation: -1 for an unsplit dimension, the axis for one, a list for several.
Json dim_json(const DimAxes& axes) {
  if (axes.empty()) return -1;
  if (axes.size() == 1) return axes[0];
  return Json(axes);
}

std::string dim_text(const DimAxes& axes) {
  if (axes.empty()) return "-1";
  if (axes.size() == 1) return std::to_string(axes[0]);
  return fmt::format("[{}]", fmt::join(axes, ","));
}

std::string map_text(const std::vector<DimAxes>& map) {
  std::vector<std::string> dims;
  for (const DimAxes& axes : map) dims.push_back(dim_text(axes));
  return fmt::format("[{}]", fmt::join(dims, ","));
}

// Settings ckptfs refuses or ignores are shown so that a refusal can be traced to its cause.
std::string extras_text(const ParamLayout& layout) {
  std::string out;
  if (layout.field != 0) out += fmt::format(" field={}", layout.field);
  if (!layout.param_split_shape.empty())
    out += fmt::format(" param_split_shape=[{}] indices_offset=[{}]",
                       fmt::join(layout.param_split_shape, ","),
                       fmt::join(layout.indices_offset, ","));
  if (!layout.tensor_shape.empty())
    out += fmt::format(" tensor_shape=[{}]", fmt::join(layout.tensor_shape, ","));
  return out;
}

void print_json(const strategy::Strategy& s) {
  Json params = Json::array();
  for (const Entry& e : entries_of(s)) {
    const ParamLayout& layout = *e.layout;
    Json map = Json::array();
    for (const DimAxes& axes : layout.tensor_map) map.push_back(dim_json(axes));
    Json param = {{"name", *e.name},
                  {"stages", e.stages},
                  {"dev_matrix", layout.dev_matrix},
                  {"tensor_map", map},
                  {"opt_weight_shard_step", layout.opt_shard_step},
                  {"opt_weight_shard_size", layout.opt_shard_size}};
    if (layout.field != 0) param["field"] = layout.field;
    if (!layout.param_split_shape.empty()) {
      param["param_split_shape"] = layout.param_split_shape;
      param["indices_offset"] = layout.indices_offset;
    }
    if (!layout.tensor_shape.empty()) param["tensor_shape"] = layout.tensor_shape;
    params.push_back(std::move(param));
  }
  // One parameter per line: readable, and still one JSON document.
  fmt::print("{{\n  \"devices_per_stage\": {},\n  \"num_stages\": {},\n  \"params\": [",
             s.devices_per_stage, s.num_stages);
  for (size_t i = 0; i < params.size(); ++i)
    fmt::print("{}\n    {}", i == 0 ? "" : ",", params[i].dump());
  fmt::print("\n  ]\n}}\n");
}

void print_text(const strategy::Strategy& s) {
  const std::vector<Entry> entries = entries_of(s);
  std::vector<std::vector<std::string>> rows{
      {"NAME", "STAGES", "DEV_MATRIX", "TENSOR_MAP", "OPT_STEP", "OPT_SIZE"}};
  for (const Entry& e : entries) {
    const ParamLayout& layout = *e.layout;
    rows.push_back({*e.name, fmt::format("[{}]", fmt::join(e.stages, ",")),
                    fmt::format("[{}]", fmt::join(layout.dev_matrix, ",")),
                    map_text(layout.tensor_map), std::to_string(layout.opt_shard_step),
                    std::to_string(layout.opt_shard_size) + extras_text(layout)});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows)
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());

  fmt::print("devices per stage: {}, stages: {}, parameters: {}\n", s.devices_per_stage,
             s.num_stages, s.params.size());
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c + 1 < row.size(); ++c) line += fmt::format("{:<{}}  ", row[c], width[c]);
    line += row.back();
    fmt::print("{}\n", line);
  }
}

}  // namespace

void add_strategy_command(CLI::App& app) {
  CLI::App* command = app.add_subcommand("strategy", "Inspect parallel strategy files");
  command->require_subcommand(1);

  auto options = std::make_shared<ShowOptions>();
  CLI::App* show = command->add_subcommand(
      "show", "Print every parameter's stages, device matrix, tensor map and optimizer shard");
  show->add_option("PATH", options->path,
                   "Protobuf strategy file, .json strategy file, or a directory of per-stage "
                   "strategy files")
      ->required();
  show->add_flag("--json", options->json, "Print one JSON object instead of a table");
  show->callback([options] {
    const strategy::Strategy s = strategy::read_strategy(options->path);
    if (options->json) {
      print_json(s);
    } else {
      print_text(s);
    }
  });
}

}  // namespace ckptfs::cli
