#include "tensor_shapes.h"

#include <fmt/format.h>

#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <unordered_set>

#include "ckptfs/error.h"
#include "ckptfs/hfai/merge.h"
#include "ckptfs/index/store.h"
#include "ckptfs/mindformers/metadata.h"
#include "ckptfs/plan/source_fit.h"
#include "ckptfs/source/discover.h"
#include "ckptfs/source/step_choice.h"
#include "ckptfs/source/unified.h"
#include "ckptfs/strategy/layout.h"
#include "ckptfs/strategy/strategy.h"
#include "ckptfs/util/json_int.h"
#include "ckptfs/util/open_path.h"
#include "ckptfs/util/quote.h"

namespace ckptfs::cli {

namespace {

namespace fs = std::filesystem;

// Only tensors of one dimension or more are laid out; a scalar or a string has nothing to
// split, and is copied whole to every rank as an entry no strategy names.
void add(TensorList& out, const std::string& name, const std::vector<int64_t>& shape,
         bool tensor = true) {
  if (!tensor || shape.empty()) {
    ++out.left_out;
    return;
  }
  out.tensors.push_back({name, shape});
}

// A JSON file {"name": [dim, ...], ...}, for models whose files ckptfs does not read.
TensorList from_json(const std::string& path) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(util::read_regular(path, "shapes file"));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not a JSON shapes file: {}", path, json_error_text(e.what()));
  }
  if (!doc.is_object())
    fail("{}: expected a JSON object of tensor name -> shape, e.g. {{\"w\": [1024, 512]}}", path);
  TensorList out;
  out.what = fmt::format("{} ({} shapes)", path, doc.size());
  for (const auto& [name, shape] : doc.items()) {
    const std::vector<int64_t> dims =
        util::json_ints(shape, 0, std::numeric_limits<int64_t>::max(), [&](std::string_view why) {
          fail("{}: tensor {}: the shape {} (expected a list of sizes)", path, file_text(name),
               why);
        });
    add(out, name, dims);
  }
  return out;
}

TensorList from_hfai(const std::string& dir) {
  const std::vector<fs::path> files = hfai::part_files(dir);
  const std::vector<index::IndexedSource> parts = index::index_sources(nullptr, files);
  const hfai::Merged merged = hfai::merge(parts);
  TensorList out;
  out.what = fmt::format("an hfai checkpoint of {} PART files (its merged model)", files.size());
  for (const hfai::Tensor& t : merged.model) add(out, t.name, t.shape);
  return out;
}

TensorList from_metadata(const fs::path& dir) {
  const mindformers::Iteration it = mindformers::read_iteration(dir);
  TensorList out;
  out.what = fmt::format("a MindFormers metadata checkpoint ({})", dir.string());
  for (const mindformers::ParamMeta& p : it.params) add(out, p.name, p.global_shape);
  return out;
}

TensorList from_unified(const std::string& dir, const source::UnifiedDir& unified) {
  std::vector<fs::path> parts;
  // hyper_param.safetensors holds what the saved strategy did not lay out (step counters).
  for (const fs::path& file : unified.files)
    if (file.filename() != source::kHyperParamFile) parts.push_back(file);
  TensorList out;
  out.what = fmt::format("{}: a unified checkpoint of {} files", dir, unified.files.size());
  for (const index::IndexedSource& part : index::index_sources(nullptr, parts))
    for (const scan::Param& p : part.scan.params)
      add(out, p.name, p.shape, p.kind == scan::EntryKind::Tensor);
  return out;
}

const strategy::ParamLayout* layout_of(const strategy::Strategy& s, const std::string& name,
                                       uint32_t stage) {
  const strategy::StrategyParam* param = s.find(name);
  if (!param) return nullptr;
  const auto it = param->stages.find(stage);
  return it == param->stages.end() ? nullptr : &it->second;
}

TensorList from_rank_dirs(const std::string& dir, std::string src_strategy,
                          const std::string& step) {
  const source::Listing listing = source::list_sources(dir);
  const source::Choice choice =
      source::choose(listing, source::StepRequest::parse(step, /*allow_mixed=*/false));
  if (src_strategy.empty() && listing.mindformers_strategy)
    src_strategy = listing.mindformers_strategy->string();
  std::optional<strategy::Strategy> src;
  if (!src_strategy.empty()) src = strategy::read_strategy(src_strategy);

  // The first rank of each stage holds every name of its stage (spec §3.3).
  const int64_t devices = src ? src->devices_per_stage : 1;
  const int64_t stages = src ? src->num_stages : 1;
  std::set<int64_t> firsts;
  for (int64_t s = 0; s < stages; ++s) firsts.insert(s * devices);
  std::vector<int64_t> present;
  for (const auto& [rank, file] : choice.files) present.push_back(rank);
  plan::check_rank_count(present, src ? &*src : nullptr, listing.root.string(), listing.unusable,
                         &firsts);
  std::vector<fs::path> paths;
  for (int64_t r : firsts) paths.push_back(choice.files.at(r));
  const std::vector<index::IndexedSource> scans = index::index_sources(nullptr, paths);

  TensorList out;
  out.what = fmt::format("{}: {}", listing.root.string(), choice.summary);
  std::unordered_set<std::string_view> seen;
  for (size_t i = 0; i < scans.size(); ++i) {
    const uint32_t stage = static_cast<uint32_t>(i);
    for (const scan::Param& p : scans[i].scan.params) {
      if (!seen.insert(p.name).second) continue;
      if (!src) {
        add(out, p.name, p.shape, p.kind == scan::EntryKind::Tensor);
        continue;
      }
      // Names the source strategy does not lay out are whole in every rank's file, often with
      // rank-specific values (step counters, another network's parameters): no layout. A name
      // of several stages takes the layout of the first.
      const strategy::ParamLayout* layout = layout_of(*src, p.name, stage);
      if (!layout) {
        seen.erase(p.name);
        continue;
      }
      if (p.kind != scan::EntryKind::Tensor) {
        ++out.left_out;
        continue;
      }
      const strategy::Layout l = strategy::Layout::from(*layout, p.shape.size(), p.name);
      add(out, p.name, l.global_shape(p.shape));
    }
  }
  return out;
}

bool is_json_name(const std::string& path) {
  return path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
}

}  // namespace

TensorList tensor_shapes(const std::string& src, const std::string& src_strategy,
                         const std::string& step) {
  if (is_json_name(src)) {
    if (!src_strategy.empty())
      fail("{}: a shapes file gives global shapes already; omit --src-strategy", src);
    return from_json(src);
  }
  util::require_directory(src, "source directory");
  const auto no_strategy = [&](std::string_view why) {
    if (!src_strategy.empty()) fail("{}: {}; omit --src-strategy", src, why);
  };
  if (hfai::is_hfai_dir(src)) {
    no_strategy("an hfai checkpoint records no parallel layout");
    return from_hfai(src);
  }
  if (const auto iteration = mindformers::find_iteration(src, step)) {
    no_strategy("a MindFormers metadata checkpoint carries its global shapes in metadata.json");
    return from_metadata(*iteration);
  }
  if (const std::optional<source::UnifiedDir> unified = source::read_unified(src)) {
    no_strategy("a unified_safetensors directory is one full checkpoint");
    return from_unified(src, *unified);
  }
  return from_rank_dirs(src, src_strategy, step);
}

}  // namespace ckptfs::cli
