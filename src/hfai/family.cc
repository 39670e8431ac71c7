// The hfai family's entry: detection, readers and view (family/family.h).
#include <fmt/format.h>

#include "ckptfs/error.h"
#include "ckptfs/hfai/view.h"
#include "ckptfs/index/readers.h"

namespace ckptfs::hfai {

namespace {

std::optional<std::filesystem::path> detect(const std::filesystem::path& dir, const std::string&) {
  if (!is_hfai_dir(dir)) return std::nullopt;
  return dir;
}

void refuse_src_strategy(const family::ViewInputs& in) {
  if (!in.src_strategy.empty())
    fail(
        "{}: an hfai checkpoint records no parallel layout (its PART files merge into one full "
        "model); omit --src-strategy",
        in.src_dir.string());
}

// The merged model, optimizer and values at the root, or with --dst-strategy the model cut per
// target rank.
plan::Plan view(const family::ViewInputs& in, family::ViewText& text) {
  const std::string dir = in.src_dir.string();
  refuse_src_strategy(in);
  const std::vector<std::filesystem::path> files = part_files(in.found);
  text.chosen = fmt::format("{}: an hfai checkpoint of {} PART files", dir, files.size());
  const strategy::Strategy* dst = in.dst();
  plan::ViewOptions views = in.views();
  const plan::ModelFileOptions model_files = in.model_files();
  std::vector<index::IndexedSource> parts = in.scan(files);
  const Merged merged = merge(parts);
  return make_hfai_plan(std::move(parts), merged, dst, views, model_files);
}

// The merged model's tensors, in hfai's merged order.
family::ModelTensors tensors(const family::ViewInputs& in) {
  refuse_src_strategy(in);
  const std::vector<std::filesystem::path> files = part_files(in.found);
  const Merged merged = merge(in.scan(files));
  family::ModelTensors out;
  out.what = fmt::format("an hfai checkpoint of {} PART files (its merged model)", files.size());
  // A strategy lays out the names the view serves.
  std::vector<std::string> names;
  for (const Tensor& t : merged.model) names.push_back(t.name);
  if (const plan::ModelFileOptions model_files = in.model_files(); model_files.rename)
    names = model_files.rename->apply_all(names);
  for (size_t i = 0; i < names.size(); ++i)
    out.tensors.push_back({names[i], merged.model[i].shape});
  return out;
}

}  // namespace

const family::Family kFamily{"hfai", detect, index::mindspore_readers, view, nullptr, tensors};

}  // namespace ckptfs::hfai
