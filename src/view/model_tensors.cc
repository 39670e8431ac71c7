#include "ckptfs/view/model_tensors.h"

#include <fmt/format.h>

#include <optional>
#include <set>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "ckptfs/plan/source_fit.h"
#include "ckptfs/source/discover.h"
#include "ckptfs/source/step_choice.h"
#include "ckptfs/strategy/layout.h"
#include "ckptfs/strategy/strategy.h"
#include "ckptfs/util/open_path.h"
#include "ckptfs/view/families.h"
#include "rank_dirs.h"

namespace ckptfs::view {

namespace {

using namespace detail;

const strategy::ParamLayout* layout_of(const strategy::Strategy& s, const std::string& name,
                                       uint32_t stage) {
  const strategy::StrategyParam* param = s.find(name);
  if (!param) return nullptr;
  const auto it = param->stages.find(stage);
  return it == param->stages.end() ? nullptr : &it->second;
}

family::ModelTensors from_rank_dirs(const family::Family& fam, const ViewArgs& args) {
  const source::Listing listing = source::list_sources(args.src_dir);
  const source::Choice choice =
      source::choose(listing, source::StepRequest::parse(args.step, /*allow_mixed=*/false));
  std::string src_strategy = args.src_strategy;
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
  std::vector<std::filesystem::path> paths;
  for (int64_t r : firsts) paths.push_back(choice.files.at(r));
  const std::vector<index::IndexedSource> scans =
      index_files(index_dir(args), args.shipped_index, paths, args.quiet, fam.readers());

  family::ModelTensors out;
  out.what = fmt::format("{}: {}", listing.root.string(), choice.summary);
  std::unordered_set<std::string_view> seen;
  for (size_t i = 0; i < scans.size(); ++i) {
    const uint32_t stage = static_cast<uint32_t>(i);
    for (const scan::Param& p : scans[i].scan.params) {
      if (!seen.insert(p.name).second) continue;
      const bool tensor = p.kind == scan::EntryKind::Tensor;
      if (!src) {
        out.tensors.push_back({p.name, p.shape, tensor});
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
      if (!tensor) {
        out.tensors.push_back({p.name, p.shape, false});
        continue;
      }
      const strategy::Layout l = strategy::Layout::from(*layout, p.shape.size(), p.name);
      out.tensors.push_back({p.name, l.global_shape(p.shape)});
    }
  }
  return out;
}

}  // namespace

family::ModelTensors model_tensors(const ViewArgs& args) {
  util::require_directory(args.src_dir, "source directory");
  const Detected detected = detect(args.src_dir, args.step);
  if (!detected.family->tensors) {
    refuse_model_file_options(args, detected.family->name);
    refuse_unused_unstack(args, false, detected.family->name);
    return from_rank_dirs(*detected.family, args);
  }
  const FamilyInputs inputs(*detected.family, detected.found, args);
  family::ModelTensors out = detected.family->tensors(inputs.in);
  if (!inputs.model_files_asked()) refuse_model_file_options(args, detected.family->name);
  refuse_unused_unstack(args, inputs.unstack_asked, detected.family->name);
  return out;
}

}  // namespace ckptfs::view
