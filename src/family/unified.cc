// The unified_safetensors family's entry: detection, readers and view (family/family.h).
#include "ckptfs/family/unified.h"

#include <fmt/format.h>

#include <map>
#include <set>
#include <string_view>

#include "ckptfs/error.h"
#include "ckptfs/index/readers.h"
#include "ckptfs/source/unified.h"

namespace ckptfs::family {

namespace {

std::optional<std::filesystem::path> detect(const std::filesystem::path& dir, const std::string&) {
  if (!source::read_unified(dir)) return std::nullopt;
  return dir;
}

void refuse_src_strategy(const ViewInputs& in) {
  if (!in.src_strategy.empty())
    fail(
        "{}: a unified_safetensors directory ({} beside part*.safetensors) is one full "
        "checkpoint; omit --src-strategy",
        in.src_dir.string(), source::kParamNameMap);
}

// One full checkpoint in several files.
plan::Plan view(const ViewInputs& in, ViewText& text) {
  const std::string dir = in.src_dir.string();
  const std::optional<source::UnifiedDir> unified = source::read_unified(in.found);
  if (!unified) fail("{}: {} is gone", dir, source::kParamNameMap);  // removed since detected
  refuse_src_strategy(in);
  text.chosen = fmt::format("{}: a unified checkpoint of {} files", dir, unified->files.size());
  const strategy::Strategy* dst = in.dst();
  std::vector<index::IndexedSource> parts = in.scan(unified->files);
  // The map must agree with the files, or a parameter would silently come from nowhere.
  std::map<std::string, std::set<std::string_view>> held;
  for (const index::IndexedSource& part : parts)
    for (const scan::Param& p : part.scan.params)
      held[part.file.path.filename().string()].insert(p.name);
  for (const auto& [name, file] : unified->weight_map)
    if (!held[file].count(name))
      fail("{}: {} names parameter {} in {}, which does not hold it", dir, source::kParamNameMap,
           name, file);
  return plan::make_unified_plan(std::move(parts), dst, in.views());
}

// Every part, as a view reads them.
std::vector<std::filesystem::path> parts(const std::filesystem::path& found) {
  const std::optional<source::UnifiedDir> unified = source::read_unified(found);
  if (!unified) fail("{}: {} is gone", found.string(), source::kParamNameMap);
  return unified->files;
}

// The parts' tensors; hyper_param.safetensors holds what the saved strategy did not lay out
// (step counters).
ModelTensors tensors(const ViewInputs& in) {
  refuse_src_strategy(in);
  std::vector<std::filesystem::path> files = parts(in.found);
  ModelTensors out;
  out.what = fmt::format("{}: a unified checkpoint of {} files", in.src_dir.string(), files.size());
  std::erase_if(files, [](const std::filesystem::path& f) {
    return f.filename() == source::kHyperParamFile;
  });
  for (const index::IndexedSource& part : in.scan(files))
    for (const scan::Param& p : part.scan.params)
      out.tensors.push_back({p.name, p.shape, p.kind == scan::EntryKind::Tensor});
  return out;
}

}  // namespace

const Family kUnified{
    "unified_safetensors", detect, index::mindspore_readers, view, parts, tensors};

}  // namespace ckptfs::family
