// The Megatron-Core torch_dist family's entry (megatron/family.h).
#include "ckptfs/megatron/family.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ckptfs/dcp/family.h"
#include "ckptfs/megatron/megatron.h"

namespace ckptfs::megatron {

namespace {

namespace fs = std::filesystem;

// At most this many names in a summary line; the count says how many there are.
constexpr size_t kNamesShown = 8;

std::string names_text(const std::vector<std::string>& names) {
  if (names.size() <= kNamesShown) return fmt::format("{}", fmt::join(names, ", "));
  return fmt::format("{}, and {} more", fmt::join(names.begin(), names.begin() + kNamesShown, ", "),
                     names.size() - kNamesShown);
}

std::optional<fs::path> detect(const fs::path& dir, const std::string& step) {
  return find_iteration(dir, step);
}

scan::Readers readers() { return dcp::kFamily.readers(); }

std::vector<fs::path> index_files(const fs::path& found) { return dcp::kFamily.index_files(found); }

plan::Plan view(const family::ViewInputs& in, family::ViewText& text) {
  const std::string dir = in.found.string();
  dcp::refuse_src_strategy(in);
  dcp::Metadata md = dcp::read_metadata(in.found);
  size_t model = 0;
  for (const dcp::Tensor& t : md.tensors) model += is_optimizer(t.fqn) ? 0 : 1;
  text.chosen =
      fmt::format("{}: a Megatron-Core torch_dist checkpoint of {} model tensors in {} data files",
                  dir, model, md.files.size());
  std::vector<std::string> optimizer, objects;
  const bool unstack = in.unstack_layers && in.unstack_layers();
  plan::Plan plan = dcp::plan_dcp_view(
      in, std::move(md), dir, [&](dcp::Metadata& m, std::vector<index::IndexedSource>& files) {
        std::erase_if(m.tensors, [&](const dcp::Tensor& t) {
          if (!is_optimizer(t.fqn)) return false;
          optimizer.push_back(t.fqn);
          return true;
        });
        for (const dcp::Object& o : m.objects)
          (is_optimizer(o.fqn) ? optimizer : objects).push_back(o.fqn);
        m.objects.clear();
        if (unstack) unstack_layers(m, files);
      });
  std::error_code ec;
  if (fs::exists(in.found / kCommonName, ec))
    objects.insert(objects.begin(), std::string(kCommonName));
  if (!objects.empty())
    plan.warnings.push_back(fmt::format(
        "{}: {} items of common state and ShardedObjects are not served (never unpickled; "
        "`ckptfs inspect` on a data file lists them): {}",
        dir, objects.size(), names_text(objects)));
  if (!optimizer.empty())
    plan.warnings.push_back(fmt::format(
        "{}: {} optimizer items are not served (distributed-optimizer state is laid out by the "
        "optimizer's buffers, not by the model's tensors, so it cannot be cut by boxes): {}",
        dir, optimizer.size(), names_text(optimizer)));
  return plan;
}

// The tensors as the view serves them (unstacked, renamed), since a strategy lays those out.
family::ModelTensors tensors(const family::ViewInputs& in) {
  dcp::refuse_src_strategy(in);
  dcp::Metadata md = dcp::read_metadata(in.found);
  std::erase_if(md.tensors, [](const dcp::Tensor& t) { return is_optimizer(t.fqn); });
  if (in.unstack_layers && in.unstack_layers()) {
    std::vector<index::IndexedSource> no_files;
    unstack_layers(md, no_files);
  }
  return dcp::served_tensors(
      md, in, fmt::format("{}: a Megatron-Core torch_dist checkpoint", in.found.string()));
}

}  // namespace

const family::Family kFamily{"megatron-torch-dist", detect, readers, view, index_files, tensors};

}  // namespace ckptfs::megatron
