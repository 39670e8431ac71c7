// `ckptfs strategy show PATH [--json]`: the parameter layouts of a strategy file or directory.
// `ckptfs strategy new SRC --devices N [--split REGEX=DIM]... [--replicate REGEX]... -o OUT`:
// a strategy file for a checkpoint saved without one (writer.h).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckptfs/error.h"
#include "ckptfs/strategy/strategy.h"
#include "ckptfs/strategy/writer.h"
#include "ckptfs/util/quote.h"
#include "commands.h"
#include "tensor_shapes.h"

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

struct NewOptions {
  std::string src;
  std::string output;
  int64_t devices = 0;
  std::vector<std::string> splits, replicates;
  std::string unmatched = "replicate";
  std::string src_strategy;
  std::string step = "latest";
  std::string rename;
  bool unstack_layers = false;
  CLI::Option* split_option = nullptr;
  CLI::Option* replicate_option = nullptr;
};

// "REGEX=DIM", split at the last '=' (a pattern may hold one; a dimension never does).
strategy::LayoutRule split_rule(const std::string& text) {
  const std::string shown = fmt::format("--split '{}'", text);
  const size_t eq = text.rfind('=');
  int64_t dim = 0;
  const char* end = text.data() + text.size();
  if (eq == std::string::npos || eq == 0 ||
      std::from_chars(text.data() + eq + 1, end, dim).ptr != end || eq + 1 == text.size())
    fail(
        "{}: expected REGEX=DIM, a pattern and a dimension (negative: from the end), e.g. "
        "--split '.*\\.wq\\.weight=0'",
        shown);
  return {shown, text.substr(0, eq), dim};
}

// The rules in the order given on the command line, --split and --replicate interleaved:
// the first that matches a name decides, so their order is the user's to choose.
std::vector<strategy::LayoutRule> rules_in_order(const CLI::App& command, const NewOptions& o) {
  std::vector<strategy::LayoutRule> rules;
  size_t split = 0, replicate = 0;
  for (const CLI::Option* option : command.parse_order()) {
    if (option == o.split_option && split < o.splits.size()) {
      rules.push_back(split_rule(o.splits[split++]));
    } else if (option == o.replicate_option && replicate < o.replicates.size()) {
      const std::string& pattern = o.replicates[replicate++];
      rules.push_back({fmt::format("--replicate '{}'", pattern), pattern, std::nullopt});
    }
  }
  return rules;
}

// "1 tensor", "2 tensors".
std::string count_of(size_t n, std::string_view noun) {
  return fmt::format("{} {}{}", n, noun, n == 1 ? "" : "s");
}

// What was written and which rule decided what, so that a rule matching nothing (a typo) or
// more than meant is seen at once.
void report_new(const NewOptions& o, const TensorList& list,
                const std::vector<strategy::LayoutRule>& rules,
                const std::vector<strategy::NewLayout>& layouts) {
  std::vector<size_t> matched(rules.size(), 0);
  size_t unmatched = 0, split = 0;
  for (const strategy::NewLayout& l : layouts) {
    (l.rule < 0 ? unmatched : matched[static_cast<size_t>(l.rule)])++;
    for (const strategy::DimAxes& axes : l.layout.tensor_map) split += axes.empty() ? 0 : 1;
  }
  fmt::print("{}: {} on {} ({} split, {} replicated) from {}\n", o.output,
             count_of(layouts.size(), "tensor"), count_of(static_cast<size_t>(o.devices), "device"),
             split, layouts.size() - split, list.what);
  for (size_t i = 0; i < rules.size(); ++i) {
    fmt::print("  {}: {}\n", rules[i].text, count_of(matched[i], "tensor"));
    if (matched[i] == 0)
      spdlog::warn("{} matches no tensor (a pattern must match the whole name)", rules[i].text);
  }
  if (unmatched > 0)
    fmt::print("  no rule (--default replicate): {}\n", count_of(unmatched, "tensor"));
  if (list.left_out > 0)
    fmt::print("  no layout (scalars, strings: whole on every rank): {}\n",
               fmt::format("{} {}", list.left_out, list.left_out == 1 ? "entry" : "entries"));
}

void run_new(const CLI::App& command, const NewOptions& o) {
  if (o.unmatched != "replicate" && o.unmatched != "error")
    fail("--default {}: expected replicate or error", o.unmatched);
  // Rules are checked before any source is read: a typo is refused at once.
  strategy::NewStrategy options;
  options.devices = o.devices;
  options.rules = rules_in_order(command, o);
  options.unmatched_replicate = o.unmatched == "replicate";
  strategy::check_new_strategy(options);
  const TensorList list = tensor_shapes(o.src, o.src_strategy, o.step, o.rename, o.unstack_layers);
  if (list.tensors.empty())
    fail("{}: no tensor of 1 or more dimensions to lay out ({})", o.src, list.what);
  const std::vector<strategy::NewLayout> layouts = strategy::decide_layouts(list.tensors, options);
  strategy::write_strategy_file(o.output, layouts);
  report_new(o, list, options.rules, layouts);
}

}  // namespace

void add_strategy_command(CLI::App& app) {
  CLI::App* command =
      app.add_subcommand("strategy", "Inspect parallel strategy files, or write one");
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

  auto o = std::make_shared<NewOptions>();
  CLI::App* add = command->add_subcommand(
      "new",
      "Write a strategy file for a checkpoint saved without one (PyTorch, hfai): N devices, each "
      "tensor split N ways along one dimension or replicated, by the first rule matching its "
      "name; usable as --dst-strategy (and as --src-strategy for checkpoints saved in that "
      "layout). Refuses a split that does not divide, naming the tensor and the rule");
  add->add_option("SRC", o->src,
                  "Where the tensors' names and global shapes come from: a checkpoint directory "
                  "as mount takes it, or a .json file {\"name\": [dim, ...], ...}")
      ->required();
  add->add_option("--devices", o->devices, "Number of devices (ranks) to lay the tensors out on")
      ->required();
  o->split_option = add->add_option("--split", o->splits,
                                    "REGEX=DIM: split the tensors whose whole name matches REGEX "
                                    "(a POSIX extended regular expression, as grep -E takes) "
                                    "along dimension DIM (negative: from the end) into N equal "
                                    "blocks; repeatable")
                        ->expected(1)
                        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  o->replicate_option = add->add_option("--replicate", o->replicates,
                                        "REGEX: the tensors whose whole name matches it are whole "
                                        "on every device; repeatable")
                            ->expected(1)
                            ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  add->add_option("--default", o->unmatched,
                  "A tensor no rule matches: replicate, or error (refuse it, naming it)")
      ->capture_default_str();
  add->add_option("--src-strategy", o->src_strategy,
                  "For rank_<N>/ directories of a sharded checkpoint: the strategy it was saved "
                  "with, for the global shapes");
  add->add_option("--step", o->step,
                  "Which checkpoint of each rank (as mount's --step) or MindFormers iteration")
      ->capture_default_str();
  add->add_option("--rename", o->rename,
                  "The rename map the view will be mounted with (mount's --rename): the strategy "
                  "then names the tensors as the view serves them");
  add->add_flag("--unstack-layers", o->unstack_layers,
                "The view will be mounted with --unstack-layers (Megatron-Core): the strategy then "
                "lays out each layer's tensors");
  add->add_option("-o,--output", o->output,
                  "The strategy file to write: JSON if the name ends in .json, else protobuf "
                  "(MindSpore's .ckpt strategy format)")
      ->required();
  add->footer(
      "Rules apply in the order given, --split and --replicate interleaved; the first whose "
      "pattern matches the whole tensor name decides. Scalars and strings get no layout: every "
      "rank has them whole.\nExample (4-way tensor parallel):\n  ckptfs strategy new ckpt/ "
      "--devices 4 --split '.*\\.(wq|wk|wv|w1|w3)\\.weight=0' --split "
      "'.*\\.(wo|w2)\\.weight=1' --replicate '.*' -o tp4.ckpt_strategy");
  add->callback([add, o] { run_new(*add, *o); });
}

}  // namespace ckptfs::cli
