// The views of a merged hfai checkpoint: safetensors files in the reference writer's layout with
// {"format":"pt"}, each tensor read from its chunks or its strided record, and extra.json.
#include "ckptfs/hfai/view.h"

#include <algorithm>
#include <memory>
#include <set>
#include <string_view>

#include "ckptfs/error.h"
#include "ckptfs/plan/read_map.h"
#include "ckptfs/safetensors/format.h"

namespace ckptfs::hfai {

namespace {

using plan::FullTensor;
using plan::Plan;
using plan::StoragePiece;
using plan::StridedContent;
using plan::TargetFile;
using plan::ViewOptions;
using plan::VirtualFile;

bool c_contiguous(const scan::Param& p) {
  int64_t expect = 1;
  for (size_t k = p.shape.size(); k-- > 0;) {
    if (p.shape[k] != 1 && p.strides[k] != expect) return false;
    expect *= p.shape[k];
  }
  return true;
}

void add_content(VirtualFile::Builder& builder, const std::vector<index::IndexedSource>& sources,
                 const Tensor& t) {
  for (const Part& part : t.parts) {
    const scan::Param& p = sources[part.source].scan.params[part.param];
    const uint64_t start = p.content[0].offset + p.storage_offset * p.element_size;
    if (p.nbytes() == 0) continue;
    if (c_contiguous(p)) {
      builder.add_source_range(part.source, start, p.nbytes());
      continue;
    }
    auto content = std::make_shared<StridedContent>();
    content->source = part.source;
    content->base = p.content[0].offset;
    content->element_size = p.element_size;
    content->storage_offset = p.storage_offset;
    content->shape = p.shape;
    content->strides = p.strides;
    builder.add_strided(content, 0, content->nbytes());
  }
}

VirtualFile safetensors_file(const std::vector<index::IndexedSource>& sources,
                             const std::vector<Tensor>& tensors, const std::string& file) {
  std::vector<safetensors::HeaderEntry> header;
  for (const Tensor& t : tensors) {
    const std::optional<safetensors::Dtype> d = safetensors::dtype_by_code(t.code);
    if (!d) fail("{}: tensor {} is of type {}, which {} cannot hold", file, t.name, t.code, file);
    uint64_t n = t.element_size;
    for (int64_t s : t.shape) n *= static_cast<uint64_t>(s);
    header.push_back({t.name, d->code, t.shape, n});
  }
  for (size_t i = 1; i < tensors.size(); ++i)
    for (size_t k = 0; k < i; ++k)
      if (tensors[k].name == tensors[i].name)
        fail("{}: two tensors named {}", file, tensors[i].name);
  const std::vector<size_t> order = safetensors::sort_like_writer(header);
  static const std::vector<std::pair<std::string, std::string>> kMetadata{{"format", "pt"}};
  VirtualFile::Builder builder;
  builder.add_bytes(safetensors::encode_header(header, kMetadata));
  for (size_t i : order) add_content(builder, sources, tensors[i]);
  return builder.finish();
}

// The whole tensor as one strided view: its record, or its chunks laid end to end.
std::shared_ptr<const StridedContent> whole(const std::vector<index::IndexedSource>& sources,
                                            const Tensor& t) {
  auto content = std::make_shared<StridedContent>();
  content->element_size = t.element_size;
  content->shape = t.shape;
  const scan::Param& first = sources[t.parts[0].source].scan.params[t.parts[0].param];
  if (t.parts.size() == 1 && first.shape == t.shape) {
    content->source = t.parts[0].source;
    content->base = first.content[0].offset;
    content->storage_offset = first.storage_offset;
    content->strides = first.strides;
    return content;
  }
  // Chunks: 1-D and contiguous (merge checked), C order of the full shape.
  content->strides.assign(t.shape.size(), 1);
  for (size_t k = t.shape.size(); k-- > 1;)
    content->strides[k - 1] = content->strides[k] * t.shape[k];
  auto pieces = std::make_shared<std::vector<StoragePiece>>();
  uint64_t start = 0;
  for (const Part& part : t.parts) {
    const scan::Param& p = sources[part.source].scan.params[part.param];
    const uint64_t n = p.nbytes();
    pieces->push_back(
        {start, part.source, p.content[0].offset + p.storage_offset * p.element_size, n});
    start += n;
  }
  content->pieces = std::move(pieces);
  return content;
}

}  // namespace

namespace {

// The merged model under its served names: model_files.rename's, else hfai's.
std::vector<Tensor> renamed_model(const Merged& merged, const plan::ModelFileOptions& model_files) {
  std::vector<Tensor> model = merged.model;
  if (!model_files.rename) return model;
  std::vector<std::string> names;
  names.reserve(model.size());
  for (const Tensor& t : model) names.push_back(t.name);
  names = model_files.rename->apply_all(names);
  for (size_t i = 0; i < model.size(); ++i) model[i].name = std::move(names[i]);
  return model;
}

// The model's files at the root, save_pretrained's way (plan::add_model_files).
void add_model(Plan& plan, const std::vector<Tensor>& model, uint64_t shard_size) {
  std::vector<plan::ModelEntry> entries;
  entries.reserve(model.size());
  std::set<std::string_view> seen;
  for (const Tensor& t : model) {
    const std::optional<safetensors::Dtype> d = safetensors::dtype_by_code(t.code);
    if (!d)
      fail("model.safetensors: tensor {} is of type {}, which model.safetensors cannot hold",
           t.name, t.code);
    if (!seen.insert(t.name).second) fail("model.safetensors: two tensors named {}", t.name);
    uint64_t n = t.element_size;
    for (int64_t s : t.shape) n *= static_cast<uint64_t>(s);
    entries.push_back({t.name, std::string(d->code), t.shape, n,
                       [&plan, &t](VirtualFile::Builder& b) { add_content(b, plan.sources, t); }});
  }
  plan::add_model_files(plan, entries, shard_size);
}

}  // namespace

Plan make_hfai_plan(std::vector<index::IndexedSource> parts, const Merged& merged,
                    const strategy::Strategy* dst, const ViewOptions& views,
                    const plan::ModelFileOptions& model_files) {
  Plan plan;
  plan.sources = std::move(parts);
  for (size_t r = 0; r < plan.sources.size(); ++r)
    plan.source_ranks.push_back(static_cast<int64_t>(r));
  if (!dst && (!views.ranks.empty() || views.by_stage))
    fail("an hfai checkpoint is shown as one merged model; {} needs a --dst-strategy to cut it by",
         views.by_stage ? "--by-stage" : "--ranks");
  const std::vector<Tensor> served = renamed_model(merged, model_files);
  if (dst) {
    std::vector<FullTensor> model;
    for (const Tensor& t : served) {
      const std::optional<safetensors::Dtype> d = safetensors::dtype_by_code(t.code);
      if (!d)
        fail("tensor {} is of type {}, which a MindSpore checkpoint cannot hold", t.name, t.code);
      model.push_back(
          {t.name, std::string(d->mindspore), t.shape, whole(plan.sources, t), nullptr});
    }
    plan::add_full_views(plan, model, *dst, views);
  }
  auto add = [&](std::string name, VirtualFile file) {
    TargetFile t;
    t.rank = plan::kRootRank;
    t.name = std::move(name);
    t.file = std::move(file);
    plan.targets.push_back(std::move(t));
  };
  if (!dst) add_model(plan, served, model_files.shard_size);
  if (!merged.optimizer.empty())
    add("optimizer.safetensors",
        safetensors_file(plan.sources, merged.optimizer, "optimizer.safetensors"));
  if (!merged.others.empty())
    add("others.safetensors", safetensors_file(plan.sources, merged.others, "others.safetensors"));
  VirtualFile::Builder extra;
  extra.add_bytes(merged.extra.dump(1) + "\n");
  add("extra.json", extra.finish());
  return plan;
}

}  // namespace ckptfs::hfai
