// The MindFormers metadata family's entry: detection, readers and view (family/family.h).
#include "ckptfs/mindformers/family.h"

#include <fmt/format.h>

#include "ckptfs/error.h"
#include "ckptfs/index/readers.h"
#include "ckptfs/mindformers/metadata.h"

namespace ckptfs::mindformers {

namespace {

std::optional<std::filesystem::path> detect(const std::filesystem::path& dir,
                                            const std::string& step) {
  return find_iteration(dir, step);
}

void refuse_src_strategy(const family::ViewInputs& in) {
  if (!in.src_strategy.empty())
    fail("{}: a MindFormers metadata checkpoint carries its layouts in {}; omit --src-strategy",
         in.found.string(), kMetadataFile);
}

// metadata.json gives the layouts and the storing files.
plan::Plan view(const family::ViewInputs& in, family::ViewText& text) {
  const std::filesystem::path& dir = in.found;
  refuse_src_strategy(in);
  const Iteration it = read_iteration(dir);
  text.chosen =
      fmt::format("{}: a MindFormers metadata checkpoint of {} files, {} ranks", dir.string(),
                  it.files.size(), it.strategy.devices_per_stage * it.strategy.num_stages);
  // A deduplicated save leaves optimizer files holding only global_step: normal, so not a warning.
  for (const std::string& name : it.unnamed)
    text.detail.push_back(
        fmt::format("{}: ignored, {} names no block in it", (dir / name).string(), kMetadataFile));
  const strategy::Strategy* dst = in.dst();
  std::vector<std::filesystem::path> paths;
  std::vector<int64_t> ranks;
  for (const StoredFile& f : it.files) {
    paths.push_back(f.path);
    ranks.push_back(f.rank);
  }
  std::vector<index::IndexedSource> files = in.scan(paths);
  validate(it, files);
  plan::ViewOptions views = in.views();
  for (const Scalar& s : it.scalars) views.ckpt_trailing.push_back({s.name, s.dtype, s.bytes});
  plan::Plan plan = plan::make_located_plan(std::move(files), ranks, it.strategy, dst, views);
  if (it.unhealthy)
    plan.warnings.push_back(fmt::format(
        "{}: {} marks this checkpoint unhealthy (ckpt_status 1); MindFormers' resume would skip "
        "it for an older healthy iteration (--step ITERATION)",
        dir.string(), kCommonFile));
  return plan;
}

// metadata.json's parameters with their global shapes.
family::ModelTensors tensors(const family::ViewInputs& in) {
  refuse_src_strategy(in);
  const Iteration it = read_iteration(in.found);
  family::ModelTensors out;
  out.what = fmt::format("a MindFormers metadata checkpoint ({})", in.found.string());
  for (const ParamMeta& p : it.params) out.tensors.push_back({p.name, p.global_shape});
  return out;
}

}  // namespace

const family::Family kFamily{
    "mindformers-metadata", detect, index::mindspore_readers, view, nullptr, tensors};

}  // namespace ckptfs::mindformers
