#include "ckptfs/strategy/writer.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "ckptfs/error.h"
#include "ckptfs/util/eintr.h"
#include "ckptfs/util/fd.h"
#include "ckptfs/util/posix_regex.h"
#include "ckptfs/util/quote.h"
#include "strategy.pb.h"

namespace ckptfs::strategy {

namespace {

namespace pb = mindspore::straspb;

// A rule's pattern must match the whole name (util/posix_regex.h).
std::vector<std::unique_ptr<util::PosixRegex>> compile(const std::vector<LayoutRule>& rules) {
  std::vector<std::unique_ptr<util::PosixRegex>> out;
  out.reserve(rules.size());
  for (const LayoutRule& rule : rules)
    out.push_back(std::make_unique<util::PosixRegex>(rule.pattern, rule.text));
  return out;
}

// `rule` splits `t` along `dim`: the layout, or one line saying why it cannot.
ParamLayout split_layout(const TensorShape& t, const LayoutRule& rule, int64_t devices) {
  const int64_t rank = static_cast<int64_t>(t.shape.size());
  const int64_t dim = *rule.dim < 0 ? *rule.dim + rank : *rule.dim;
  if (dim < 0 || dim >= rank)
    fail(
        "tensor {} (shape {}): {} names dimension {}, but the tensor has {} dimension{}; put a "
        "rule for it first (--replicate or another --split)",
        file_text(t.name), shape_text(t.shape), rule.text, *rule.dim, rank, rank == 1 ? "" : "s");
  if (t.shape[static_cast<size_t>(dim)] % devices != 0)
    fail(
        "tensor {} (shape {}): {} splits dimension {} of size {}, which does not divide by {} "
        "devices; put a rule for it first (--replicate or another --split)",
        file_text(t.name), shape_text(t.shape), rule.text, dim, t.shape[static_cast<size_t>(dim)],
        devices);
  ParamLayout layout;
  layout.dev_matrix = {devices};
  layout.tensor_map.resize(t.shape.size());
  // The mesh's only axis: map value 0 names the last (here the only) device axis (spec §3.1).
  layout.tensor_map[static_cast<size_t>(dim)] = DimAxes{0};
  return layout;
}

ParamLayout replicated_layout(const TensorShape& t, int64_t devices) {
  ParamLayout layout;
  layout.dev_matrix = {devices};
  layout.tensor_map.resize(t.shape.size());
  return layout;
}

// MindSpore's value per tensor dimension: -1 unsplit, else the device axis.
std::vector<int32_t> map_values(const ParamLayout& layout) {
  std::vector<int32_t> out;
  for (const DimAxes& axes : layout.tensor_map) out.push_back(axes.empty() ? -1 : axes[0]);
  return out;
}

// The operator strategy MindSpore records beside the layout: each dimension's split count.
std::vector<int64_t> split_counts(const ParamLayout& layout) {
  std::vector<int64_t> out;
  for (const DimAxes& axes : layout.tensor_map)
    out.push_back(axes.empty() ? 1 : layout.dev_matrix[0]);
  return out;
}

// read_strategy (and MindSpore) read "<digits>-<name>" as <name> of pipeline stage <digits>.
bool reads_as_staged(std::string_view name) {
  const size_t dash = name.find('-');
  return dash != std::string_view::npos && dash > 0 && name.find_first_not_of("0123456789") == dash;
}

std::string node_name(const std::string& param) { return "StrategyNew_" + param; }

void write_all(int fd, const std::string& bytes, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n =
        retry_eintr([&] { return ::write(fd, bytes.data() + done, bytes.size() - done); });
    if (n < 0) fail("{}: cannot write: {}", path, errno_text(errno));
    done += static_cast<size_t>(n);
  }
}

}  // namespace

void check_new_strategy(const NewStrategy& options) {
  if (options.devices < 1 || options.devices > kMaxRanks)
    fail("--devices {}: expected 1 to {}", options.devices, kMaxRanks);
  compile(options.rules);
}

std::vector<NewLayout> decide_layouts(const std::vector<TensorShape>& tensors,
                                      const NewStrategy& options) {
  check_new_strategy(options);
  if (tensors.empty()) fail("no tensor to write a layout for");
  const std::vector<std::unique_ptr<util::PosixRegex>> patterns = compile(options.rules);
  std::unordered_set<std::string_view> seen;
  std::vector<NewLayout> out;
  out.reserve(tensors.size());
  for (const TensorShape& t : tensors) {
    if (!seen.insert(t.name).second) fail("tensor {} is listed twice", file_text(t.name));
    if (reads_as_staged(t.name))
      fail(
          "tensor {}: a strategy file reads a name \"<digits>-<name>\" as <name> of that pipeline "
          "stage, so no strategy can lay this tensor out",
          file_text(t.name));
    NewLayout entry{t.name, t.shape, {}, -1};
    for (size_t i = 0; i < patterns.size() && entry.rule < 0; ++i)
      if (patterns[i]->matches(t.name)) entry.rule = static_cast<int>(i);
    if (entry.rule >= 0) {
      const LayoutRule& rule = options.rules[static_cast<size_t>(entry.rule)];
      entry.layout =
          rule.dim ? split_layout(t, rule, options.devices) : replicated_layout(t, options.devices);
    } else if (options.unmatched_replicate) {
      entry.layout = replicated_layout(t, options.devices);
    } else {
      fail(
          "tensor {} (shape {}) matches no rule; add a --split or --replicate rule for it, or "
          "--default replicate",
          file_text(t.name), shape_text(t.shape));
    }
    entry.layout.tensor_shape = t.shape;
    out.push_back(std::move(entry));
  }
  return out;
}

std::string encode_protobuf(const std::vector<NewLayout>& layouts) {
  pb::ParallelStrategyMap map;
  map.set_current_stage(1);  // a save counter; MindSpore writes 1 (spec §2.2)
  for (const NewLayout& l : layouts) {
    pb::ParallelStrategyItem* item = map.add_parallel_strategy_item();
    item->set_node_name(node_name(l.name));
    pb::ParallelStrategys* strategys = item->mutable_parallel_strategys();
    strategys->set_stage(0);
    pb::ParallelStrategy* input = strategys->add_parallel_strategy();
    for (int64_t count : split_counts(l.layout)) input->add_dim(static_cast<uint32_t>(count));
  }
  for (const NewLayout& l : layouts) {
    pb::ParallelLayoutItem* item = map.add_parallel_layout_item();
    item->set_param_name(l.name);
    pb::ParallelLayouts* out = item->mutable_parallel_layouts();
    pb::DevMatrix* dev = out->add_dev_matrix();
    for (int64_t d : l.layout.dev_matrix) dev->add_dim(static_cast<uint32_t>(d));
    pb::TensorMap* tensor_map = out->add_tensor_map();
    for (int32_t v : map_values(l.layout)) tensor_map->add_dim(v);
    // MindSpore's reader needs these even when empty, and the optimizer fields set (§2.6).
    out->add_param_split_shape();
    out->add_indices_offset();
    out->set_field(0);
    out->set_opt_weight_shard_step(0);
    out->set_opt_weight_shard_size(0);
  }
  return map.SerializeAsString();
}

std::string encode_json(const std::vector<NewLayout>& layouts) {
  using Json = nlohmann::ordered_json;
  // One entry per line, written piecewise: a document of 10^5 tensors is read by people too.
  std::string out = "{\n  \"current_stage\": 1,\n  \"parallel_strategy_item\": {";
  for (size_t i = 0; i < layouts.size(); ++i) {
    const NewLayout& l = layouts[i];
    const Json item = {{"stage", 0}, {"parallel_strategy", Json::array({split_counts(l.layout)})}};
    out += fmt::format("{}\n    {}: {}", i == 0 ? "" : ",", Json(node_name(l.name)).dump(),
                       item.dump());
  }
  out += "\n  },\n  \"parallel_layout_item\": {";
  for (size_t i = 0; i < layouts.size(); ++i) {
    const NewLayout& l = layouts[i];
    const Json layout = {{"dev_matrix", l.layout.dev_matrix}, {"tensor_map", map_values(l.layout)},
                         {"tensor_shape", l.shape},           {"field", 0},
                         {"opt_weight_shard_step", 0},        {"opt_weight_shard_size", 0}};
    out += fmt::format("{}\n    {}: {}", i == 0 ? "" : ",", Json(l.name).dump(), layout.dump());
  }
  out += "\n  }\n}\n";
  return out;
}

void write_strategy_file(const std::filesystem::path& path, const std::vector<NewLayout>& layouts) {
  const std::string name = path.filename().string();
  const bool json = name.size() >= 5 && name.compare(name.size() - 5, 5, ".json") == 0;
  const std::string bytes = json ? encode_json(layouts) : encode_protobuf(layouts);
  const std::string file = path.string();
  // Created with the umask's permissions, as any new file of the user's.
  const std::string temp = fmt::format("{}.tmp.{}", file, ::getpid());
  const UniqueFd fd(retry_eintr(
      [&] { return ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666); }));
  if (!fd) fail("{}: cannot create {}: {}", file, temp, errno_text(errno));
  try {
    write_all(fd.get(), bytes, temp);
    if (::fsync(fd.get()) != 0) fail("{}: cannot write: {}", temp, errno_text(errno));
    if (::rename(temp.c_str(), file.c_str()) != 0)
      fail("{}: cannot rename {} to it: {}", file, temp, errno_text(errno));
  } catch (...) {
    ::unlink(temp.c_str());
    throw;
  }
}

}  // namespace ckptfs::strategy
