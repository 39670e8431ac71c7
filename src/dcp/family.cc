// The DCP family's entry and its merged view (dcp/family.h).
#include "ckptfs/dcp/family.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "ckptfs/error.h"
#include "ckptfs/plan/read_map.h"
#include "ckptfs/safetensors/format.h"

namespace ckptfs::dcp {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using plan::StridedContent;
using plan::VirtualFile;

// One stored chunk as its scan gives it: the view of its bytes and its box's corner.
struct Piece {
  const scan::Param* param = nullptr;
  std::vector<int64_t> offsets;
  std::shared_ptr<const StridedContent> view;  // the chunk's bytes, in its C order
};

std::shared_ptr<const StridedContent> view_of(uint32_t source, const scan::Param& p) {
  auto view = std::make_shared<StridedContent>();
  view->source = source;
  view->base = p.content[0].offset;
  view->element_size = p.element_size;
  view->storage_offset = p.storage_offset;
  view->shape = p.shape;
  view->strides = p.strides;
  return view;
}

// Where a tensor's bytes go, range by range in its C order: `count` elements of `piece` from
// element `first` of the chunk's own C order.
using Sink = std::function<void(const Piece& piece, uint64_t first, uint64_t count)>;

// Walks one tensor's bytes in C order. From the last dimension `split` along which some chunk is
// not whole on, every chunk holds whole rows: so for each index of the dimensions before it, the
// chunks holding that index, in order along `split`, each give one range of the output, a range
// of the chunk's own C order. One range per row and chunk along `split`: O(rows x chunks along
// `split`), nothing per element.
class Assembler {
 public:
  Assembler(const Tensor& t, Sink sink) : t_(t), sink_(std::move(sink)) {}

  uint64_t add(const std::vector<const Piece*>& pieces) {
    const size_t rank = t_.shape.size();
    split_ = -1;
    for (const Piece* p : pieces)
      for (size_t d = 0; d < rank; ++d)
        if (p->param->shape[d] != t_.shape[d]) split_ = std::max<int>(split_, static_cast<int>(d));
    if (split_ < 0) {
      if (pieces.size() != 1) refuse("{} chunks each hold the whole tensor", pieces.size());
      index_.assign(rank, 0);
      emit(*pieces[0]);
      return bytes_;
    }
    index_.assign(rank, 0);
    walk(0, pieces);
    return bytes_;
  }

 private:
  template <typename... Args>
  [[noreturn]] void refuse(fmt::format_string<Args...> what, Args&&... args) {
    fail(
        "tensor {}: {}: its chunks do not tile it; the checkpoint's data files do not match its {}",
        t_.fqn, fmt::format(what, std::forward<Args>(args)...), kMetadataName);
  }

  void walk(size_t d, const std::vector<const Piece*>& active) {
    if (static_cast<int>(d) == split_) return row(active);
    std::set<int64_t> cuts;
    for (const Piece* p : active) {
      cuts.insert(p->offsets[d]);
      cuts.insert(p->offsets[d] + p->param->shape[d]);
    }
    for (auto it = cuts.begin(); it != cuts.end() && std::next(it) != cuts.end(); ++it) {
      const int64_t a = *it, b = *std::next(it);
      std::vector<const Piece*> sub;
      for (const Piece* p : active)
        if (p->offsets[d] <= a && a < p->offsets[d] + p->param->shape[d]) sub.push_back(p);
      for (int64_t i = a; i < b; ++i) {
        index_[d] = i;
        walk(d + 1, sub);
      }
    }
  }

  // The chunks holding index_[0..split_) laid along split_.
  void row(std::vector<const Piece*> active) {
    const size_t s = static_cast<size_t>(split_);
    std::sort(active.begin(), active.end(),
              [s](const Piece* a, const Piece* b) { return a->offsets[s] < b->offsets[s]; });
    int64_t at = 0;
    for (const Piece* p : active) {
      if (p->offsets[s] != at) refuse("nothing holds index {} of dimension {}", at, s);
      emit(*p);
      at += p->param->shape[s];
    }
    if (at != t_.shape[s]) refuse("nothing holds index {} of dimension {}", at, s);
  }

  // The range of `piece` at index_ before split_ (the whole chunk when nothing is split).
  void emit(const Piece& piece) {
    const std::vector<int64_t>& shape = piece.param->shape;
    uint64_t first = 0, count = 1;  // elements, in the chunk's C order
    for (size_t d = 0; d < shape.size(); ++d) {
      const uint64_t extent = static_cast<uint64_t>(shape[d]);
      first *= extent;
      if (static_cast<int>(d) < split_)
        first += static_cast<uint64_t>(index_[d] - piece.offsets[d]);
      else
        count *= extent;
    }
    if (count == 0) return;
    bytes_ += count * piece.param->element_size;
    sink_(piece, first, count);
  }

  const Tensor& t_;
  Sink sink_;
  int split_ = -1;
  std::vector<int64_t> index_;
  uint64_t bytes_ = 0;
};

// Each tensor's stored chunks, by fqn, from the scans' trees.
std::map<std::string, std::vector<Piece>> pieces_by_tensor(
    const std::vector<index::IndexedSource>& files) {
  std::map<std::string, std::vector<Piece>> out;
  for (uint32_t f = 0; f < files.size(); ++f) {
    const scan::FileScan& scan = files[f].scan;
    const json tree = json::parse(scan.tree, nullptr, false);
    const json* chunks = tree.is_object() && tree.contains("chunks") ? &tree["chunks"] : nullptr;
    if (!chunks || !chunks->is_array() || chunks->size() != scan.params.size())
      fail("{}: its scan does not list its chunks; remove the index cache entry and mount again",
           files[f].file.path.string());
    for (size_t i = 0; i < scan.params.size(); ++i) {
      const json& c = (*chunks)[i];
      const scan::Param& p = scan.params[i];
      if (!c.is_object() || !c.contains("offsets") || !c["offsets"].is_array() ||
          c["offsets"].size() != p.shape.size() || !p.view || p.content.size() != 1)
        fail("{}: its scan of {} is not a DCP chunk; remove the index cache entry and mount again",
             files[f].file.path.string(), p.name);
      out[p.name].push_back({&p, c["offsets"].get<std::vector<int64_t>>(), view_of(f, p)});
    }
  }
  return out;
}

}  // namespace

namespace {

using Pieces = std::map<std::string, std::vector<Piece>>;

// The chunks of `t` that hold bytes; none for a tensor of no elements.
std::vector<const Piece*> stored_chunks(const Pieces& pieces, const Tensor& t,
                                        const std::string& dir) {
  std::vector<const Piece*> stored;
  uint64_t n = 1;
  for (int64_t s : t.shape) n *= static_cast<uint64_t>(s);
  if (n == 0) return stored;
  if (const auto it = pieces.find(t.fqn); it != pieces.end())
    for (const Piece& p : it->second)
      if (p.param->elements() != 0 && p.param->shape.size() == t.shape.size()) stored.push_back(&p);
  if (stored.empty()) fail("{}: tensor {} has no stored chunk in the data files", dir, t.fqn);
  return stored;
}

// Walks `t`'s bytes in C order into `sink`, checking that its chunks gave every one.
void assemble(const Tensor& t, const std::vector<const Piece*>& stored, const std::string& dir,
              Sink sink) {
  if (stored.empty()) return;
  uint64_t n = t.element_size;
  for (int64_t s : t.shape) n *= static_cast<uint64_t>(s);
  const uint64_t added = Assembler(t, std::move(sink)).add(stored);
  if (added != n)
    fail("{}: tensor {}: its chunks hold {} bytes where it has {}; the data files do not match {}",
         dir, t.fqn, added, n, kMetadataName);
}

// The chunks as one grid when they tile `t` as one (a DTensor's shards always do), else null and
// the Assembler walks (and checks) them range by range: a grid costs O(chunks) memory where ranges
// cost O(rows x chunks) for a column-split tensor.
std::shared_ptr<const plan::GridContent> as_grid(const Tensor& t,
                                                 const std::vector<const Piece*>& stored) {
  if (stored.size() < 2) return nullptr;
  auto grid = std::make_shared<plan::GridContent>();
  grid->element_size = t.element_size;
  grid->shape = t.shape;
  size_t cells = 1;
  for (size_t d = 0; d < t.shape.size(); ++d) {
    std::set<int64_t> cuts{0, t.shape[d]};
    for (const Piece* p : stored) {
      cuts.insert(p->offsets[d]);
      cuts.insert(p->offsets[d] + p->param->shape[d]);
    }
    if (*cuts.begin() != 0 || *cuts.rbegin() != t.shape[d]) return nullptr;
    grid->cuts.emplace_back(cuts.begin(), cuts.end());
    cells *= cuts.size() - 1;
  }
  if (cells != stored.size()) return nullptr;
  grid->cells.resize(cells);
  for (const Piece* p : stored) {
    if (p->view->element_size != t.element_size) return nullptr;
    size_t cell = 0;
    for (size_t d = 0; d < t.shape.size(); ++d) {
      const std::vector<int64_t>& c = grid->cuts[d];
      const auto at = std::lower_bound(c.begin(), c.end(), p->offsets[d]);
      const auto i = static_cast<size_t>(at - c.begin());
      if (at == c.end() || *at != p->offsets[d] || i + 1 == c.size() ||
          c[i + 1] != p->offsets[d] + p->param->shape[d])
        return nullptr;
      cell = cell * (c.size() - 1) + i;
    }
    if (grid->cells[cell]) return nullptr;
    grid->cells[cell] = p->view;
  }
  return grid;
}

// The merged model: every tensor under its served name, read in C order from its chunks.
std::vector<plan::ModelEntry> merged_model(const Pieces& pieces, const Metadata& metadata,
                                           const std::vector<std::string>& names,
                                           const std::string& dir) {
  std::vector<plan::ModelEntry> model;
  model.reserve(metadata.tensors.size());
  for (size_t i = 0; i < metadata.tensors.size(); ++i) {
    const Tensor& t = metadata.tensors[i];
    uint64_t n = t.element_size;
    for (int64_t s : t.shape) n *= static_cast<uint64_t>(s);
    model.push_back({names[i], t.code, t.shape, n, [&pieces, &t, &dir](VirtualFile::Builder& b) {
                       const std::vector<const Piece*> stored = stored_chunks(pieces, t, dir);
                       if (auto grid = as_grid(t, stored)) {
                         const uint64_t bytes = grid->nbytes();
                         b.add_grid(std::move(grid), 0, bytes);
                         return;
                       }
                       assemble(t, stored, dir,
                                [&b](const Piece& piece, uint64_t first, uint64_t count) {
                                  const uint64_t e = piece.view->element_size;
                                  b.add_strided(piece.view, first * e, (first + count) * e);
                                });
                     }});
  }
  return model;
}

// Whether a chunk's view reads its storage element after element.
bool c_order(const scan::Param& p) {
  int64_t expect = 1;
  for (size_t k = p.shape.size(); k-- > 0; expect *= p.shape[k])
    if (p.shape[k] != 1 && p.strides[k] != expect) return false;
  return true;
}

// The whole tensor as the grid of its chunks when they tile it as one (then any strides), else
// as one strided view: its chunk's own, or a C-order storage made of the chunks' ranges (each
// must then be stored in C order).
plan::FullTensor full_tensor(const Pieces& pieces, const Tensor& t, const std::string& dir) {
  const std::vector<const Piece*> stored = stored_chunks(pieces, t, dir);
  const std::string dtype(safetensors::dtype_by_code(t.code)->mindspore);
  if (auto grid = as_grid(t, stored)) return {t.fqn, dtype, t.shape, nullptr, std::move(grid)};
  auto content = std::make_shared<StridedContent>();
  if (stored.size() == 1 && stored[0]->param->shape == t.shape) {
    *content = *stored[0]->view;
  } else {
    content->element_size = t.element_size;
    content->shape = t.shape;
    content->strides.assign(t.shape.size(), 1);
    for (size_t k = t.shape.size(); k-- > 1;)
      content->strides[k - 1] = content->strides[k] * t.shape[k];
    auto ranges = std::make_shared<std::vector<plan::StoragePiece>>();
    uint64_t start = 0;
    assemble(t, stored, dir, [&](const Piece& piece, uint64_t first, uint64_t count) {
      const scan::Param& p = *piece.param;
      if (!c_order(p))
        fail(
            "{}: tensor {}: its chunk at [{}] is stored with strides [{}], not in C order, which "
            "--dst-strategy cannot cut yet; mount without it for the merged view",
            dir, t.fqn, fmt::join(piece.offsets, ","), fmt::join(p.strides, ","));
      const uint64_t n = count * p.element_size;
      ranges->push_back({start, piece.view->source,
                         p.content[0].offset + (p.storage_offset + first) * p.element_size, n});
      start += n;
    });
    content->pieces = std::move(ranges);
  }
  return {t.fqn, dtype, t.shape, std::move(content), nullptr};
}

}  // namespace

plan::Plan make_dcp_plan(std::vector<index::IndexedSource> files, const Metadata& metadata,
                         const std::string& dir, const strategy::Strategy* dst,
                         const plan::ViewOptions& views,
                         const plan::ModelFileOptions& model_files) {
  plan::Plan plan;
  plan.sources = std::move(files);
  for (size_t r = 0; r < plan.sources.size(); ++r)
    plan.source_ranks.push_back(static_cast<int64_t>(r));
  for (const Tensor& t : metadata.tensors)
    if (!safetensors::dtype_by_code(t.code))
      fail("{}: tensor {} is of type {}, which a safetensors file cannot hold", dir, t.fqn, t.code);
  std::vector<std::string> names;
  names.reserve(metadata.tensors.size());
  for (const Tensor& t : metadata.tensors) names.push_back(t.fqn);
  if (model_files.rename) names = model_files.rename->apply_all(names);
  const Pieces pieces = pieces_by_tensor(plan.sources);
  if (dst) {
    std::vector<plan::FullTensor> model;
    for (size_t i = 0; i < metadata.tensors.size(); ++i) {
      model.push_back(full_tensor(pieces, metadata.tensors[i], dir));
      model.back().name = names[i];
    }
    plan::add_full_views(plan, model, *dst, views);
  } else {
    plan::add_model_files(plan, merged_model(pieces, metadata, names, dir), model_files.shard_size);
  }

  if (!metadata.objects.empty()) {
    std::vector<std::string> objects;
    for (const Object& o : metadata.objects) objects.push_back(o.fqn);
    plan.warnings.push_back(
        fmt::format("{}: {} non-tensor items are not served (DCP BYTE_IO objects, never "
                    "unpickled): {}",
                    dir, objects.size(), fmt::join(objects, ", ")));
  }
  return plan;
}

namespace {

const scan::FileReader kDataReader{
    scan::SourceFormat::Dcp,
    claims_data_file,
    [](int fd, const std::string& name, const scan::ReadOptions&) {
      return scan_data_file_beside(fd, name);
    },
};
const scan::FileReader* const kReaders[] = {&kDataReader};

scan::Readers readers() { return kReaders; }

// A cached scan of a data file is keyed by that file alone: one taken against another .metadata
// (a checkpoint saved again over this one with data files of the same size and time) is taken
// again here.
void rescan_stale(std::vector<index::IndexedSource>& files, const Metadata& md) {
  for (uint32_t f = 0; f < files.size(); ++f) {
    const json tree = json::parse(files[f].scan.tree, nullptr, false);
    const json* m = tree.is_object() && tree.contains("metadata") ? &tree["metadata"] : nullptr;
    if (m && m->is_object() && m->value("digest", json()) == json(md.digest) &&
        m->value("bytes", json()) == json(md.bytes))
      continue;
    files[f].scan = scan_data_file(files[f].file.fd.get(), files[f].file.path.string(), md, f);
  }
}

plan::Plan view(const family::ViewInputs& in, family::ViewText& text) {
  const std::string dir = in.src_dir.string();
  refuse_src_strategy(in);
  Metadata md = read_metadata(in.found);
  text.chosen = fmt::format("{}: a PyTorch DCP checkpoint of {} tensors in {} data files", dir,
                            md.tensors.size(), md.files.size());
  return plan_dcp_view(in, std::move(md), dir);
}

// Every tensor's global shape, from .metadata alone.
family::ModelTensors tensors(const family::ViewInputs& in) {
  refuse_src_strategy(in);
  const Metadata md = read_metadata(in.found);
  return served_tensors(md, in,
                        fmt::format("{}: a PyTorch DCP checkpoint of {} tensors",
                                    in.src_dir.string(), md.tensors.size()));
}

}  // namespace

family::ModelTensors served_tensors(const Metadata& metadata, const family::ViewInputs& in,
                                    std::string what) {
  std::vector<std::string> names;
  for (const Tensor& t : metadata.tensors) names.push_back(t.fqn);
  if (const plan::ModelFileOptions model_files = in.model_files(); model_files.rename)
    names = model_files.rename->apply_all(names);
  family::ModelTensors out;
  out.what = std::move(what);
  for (size_t i = 0; i < metadata.tensors.size(); ++i)
    out.tensors.push_back({names[i], metadata.tensors[i].shape});
  return out;
}

void refuse_src_strategy(const family::ViewInputs& in) {
  if (!in.src_strategy.empty())
    fail("{}: a DCP checkpoint records its layout in {}; omit --src-strategy", in.src_dir.string(),
         kMetadataName);
}

plan::Plan plan_dcp_view(const family::ViewInputs& in, Metadata md, const std::string& dir,
                         const Adjust& adjust) {
  refuse_src_strategy(in);
  const strategy::Strategy* dst = in.dst();
  const plan::ViewOptions views = in.views();
  const plan::ModelFileOptions model_files = in.model_files();
  if (!dst && !views.safetensors)
    fail("{}: a DCP checkpoint is served as model.safetensors only; omit --view ckpt", dir);
  if (!dst && (!views.ranks.empty() || views.by_stage))
    fail("{}: a DCP checkpoint is shown as one merged model; {} needs a --dst-strategy", dir,
         views.by_stage ? "--by-stage" : "--ranks");
  std::vector<fs::path> paths;
  for (const std::string& file : md.files) paths.push_back(in.found / file);
  std::vector<index::IndexedSource> files = in.scan(paths);
  rescan_stale(files, md);
  if (adjust) adjust(md, files);
  return make_dcp_plan(std::move(files), md, dir, dst, views, model_files);
}

const family::Family kFamily{"pytorch-dcp", detect, readers, view, index_files, tensors};

}  // namespace ckptfs::dcp
