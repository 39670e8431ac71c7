#include "ckptfs/strategy/strategy.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>

#include "ckptfs/error.h"
#include "ckptfs/util/json_int.h"
#include "ckptfs/util/open_path.h"
#include "ckptfs/util/quote.h"
#include "strategy.pb.h"

namespace ckptfs::strategy {

struct NameIndex::Table {
  size_t entries = 0;  // params.size() when built
  std::unordered_map<std::string_view, const StrategyParam*> by_name;
};

NameIndex::NameIndex() = default;
NameIndex::NameIndex(const NameIndex&) {}

NameIndex& NameIndex::operator=(const NameIndex&) {
  std::lock_guard lock(mu_);
  table_.store(nullptr);
  if (owned_) retired_.push_back(std::move(owned_));
  return *this;
}

NameIndex::~NameIndex() = default;

const StrategyParam* NameIndex::find(const Params& params, std::string_view name) const {
  const Table* table = table_.load(std::memory_order_acquire);
  if (table == nullptr || table->entries != params.size()) {
    std::lock_guard lock(mu_);
    table = owned_.get();
    if (table == nullptr || table->entries != params.size()) {
      auto fresh = std::make_unique<Table>();
      fresh->entries = params.size();
      fresh->by_name.reserve(params.size());
      for (const auto& [key, param] : params) fresh->by_name.emplace(key, &param);
      // The old table stays alive while a reader may hold it: it is only replaced, never
      // freed, before the strategy goes (a size change is a bug's rarity, not a hot path).
      if (owned_) retired_.push_back(std::move(owned_));
      owned_ = std::move(fresh);
      table = owned_.get();
      table_.store(table, std::memory_order_release);
    }
  }
  auto it = table->by_name.find(name);
  return it == table->by_name.end() ? nullptr : it->second;
}

namespace {

namespace fs = std::filesystem;
namespace pb = mindspore::straspb;
// Keys sorted (std::map): nlohmann's ordered_json finds each key by a linear search, so parsing
// a strategy of n parameters would cost O(n^2) (tens of seconds at 32k parameters). The one
// fact that depends on file order, the FIRST strategy item (whose stage is the file's, and
// MindSpore's two writers order keys differently, §2.3), comes from first_strategy_item().
using Json = nlohmann::json;

// The first key of the top-level "parallel_strategy_item" object in file order, or "" if there
// is none; a SAX pass that builds nothing.
class FirstItem : public nlohmann::json_sax<Json> {
 public:
  std::string found;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    ++depth_;
    return true;
  }
  bool key(string_t& key) override {
    if (depth_ == 1) in_items_ = key == "parallel_strategy_item";
    if (depth_ == 2 && in_items_) {
      found = key;
      return false;  // all that was wanted
    }
    return true;
  }
  bool end_object() override {
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override {
    ++depth_;
    return true;
  }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }

 private:
  int depth_ = 0;
  bool in_items_ = false;
};

std::string first_strategy_item(const std::string& text) {
  FirstItem sax;
  Json::sax_parse(text, &sax, nlohmann::detail::input_format_t::json, false);
  return sax.found;
}

// One strategy file as written, before stages are merged.
struct FileStrategy {
  std::string file;
  std::optional<uint32_t> first_stage;  // stage of the first strategy item, if any
  std::vector<std::pair<std::string, OperatorStrategy>> operators;
  std::vector<std::pair<std::string, ParamLayout>> layouts;  // names as written
};

std::string read_bytes(const fs::path& path) { return util::read_regular(path, "strategy file"); }

// --- protobuf -------------------------------------------------------------------------------

// Classic form: one TensorMap, one value per dimension. Layout-API form (≥2.6): one TensorMap per
// dimension, plus an empty one for 1-D tensors so that the count exceeds one (§2.2).
std::vector<DimAxes> tensor_map_of(const pb::ParallelLayouts& layouts) {
  std::vector<DimAxes> map;
  if (layouts.tensor_map_size() == 1) {
    for (int32_t value : layouts.tensor_map(0).dim())
      map.push_back(value == -1 ? DimAxes{} : DimAxes{value});
    return map;
  }
  for (const pb::TensorMap& dim : layouts.tensor_map()) {
    if (dim.dim_size() == 0) continue;
    if (dim.dim_size() == 1 && dim.dim(0) == -1) {
      map.emplace_back();
    } else {
      map.emplace_back(dim.dim().begin(), dim.dim().end());
    }
  }
  return map;
}

FileStrategy parse_protobuf(const std::string& bytes, const std::string& file) {
  pb::ParallelStrategyMap map;
  if (!map.ParsePartialFromString(bytes))
    fail("{}: not a protobuf strategy file (ParallelStrategyMap does not parse)", file);
  if (!map.IsInitialized())
    fail("{}: not a complete protobuf strategy file, missing required field(s): {}", file,
         map.InitializationErrorString());

  FileStrategy out;
  out.file = file;
  for (const pb::ParallelStrategyItem& item : map.parallel_strategy_item()) {
    OperatorStrategy op;
    op.stage = item.parallel_strategys().stage();
    for (const pb::ParallelStrategy& input : item.parallel_strategys().parallel_strategy())
      op.inputs.emplace_back(input.dim().begin(), input.dim().end());
    if (!out.first_stage) out.first_stage = op.stage;
    out.operators.emplace_back(item.node_name(), std::move(op));
  }
  for (const pb::ParallelLayoutItem& item : map.parallel_layout_item()) {
    const pb::ParallelLayouts& in = item.parallel_layouts();
    if (in.dev_matrix_size() == 0)
      fail("{}: parameter {}: layout has no dev_matrix", file, file_text(item.param_name()));
    if (in.tensor_map_size() == 0)
      fail("{}: parameter {}: layout has no tensor_map", file, file_text(item.param_name()));
    ParamLayout layout;
    layout.dev_matrix.assign(in.dev_matrix(0).dim().begin(), in.dev_matrix(0).dim().end());
    layout.tensor_map = tensor_map_of(in);
    if (in.param_split_shape_size() > 0)
      layout.param_split_shape.assign(in.param_split_shape(0).dim().begin(),
                                      in.param_split_shape(0).dim().end());
    if (in.indices_offset_size() > 0)
      layout.indices_offset.assign(in.indices_offset(0).dim().begin(),
                                   in.indices_offset(0).dim().end());
    layout.field = in.field();
    layout.opt_shard_step = in.opt_weight_shard_step();
    layout.opt_shard_size = in.opt_weight_shard_size();
    out.layouts.emplace_back(item.param_name(), std::move(layout));
  }
  return out;
}

// --- JSON -----------------------------------------------------------------------------------

// Where a JSON value sits, for messages.
struct JsonPlace {
  const std::string& file;
  std::string_view param;
  std::string_view key;
};

[[noreturn]] void json_fail(const JsonPlace& at, std::string_view what) {
  fail("{}: parameter {}: \"{}\" {}", at.file, file_text(at.param), at.key, what);
}

int64_t json_int(const Json& value, const JsonPlace& at, int64_t lo, int64_t hi) {
  return util::json_int(value, lo, hi, [&](std::string_view why) { json_fail(at, why); });
}

std::vector<int64_t> json_ints(const Json& value, const JsonPlace& at, int64_t lo, int64_t hi) {
  return util::json_ints(value, lo, hi, [&](std::string_view why) { json_fail(at, why); });
}

const Json& json_required(const Json& object, const JsonPlace& at) {
  auto it = object.find(at.key);
  if (it == object.end())
    fail("{}: parameter {}: required key \"{}\" is missing", at.file, file_text(at.param), at.key);
  return *it;
}

// MindSpore writes one integer per dimension; a nested list (our own `strategy show --json`
// form) names the axes of a multi-axis dimension.
std::vector<DimAxes> json_tensor_map(const Json& value, const JsonPlace& at) {
  constexpr int64_t kMin = std::numeric_limits<int32_t>::min();
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (!value.is_array()) json_fail(at, "is not a list");
  std::vector<DimAxes> map;
  for (const Json& dim : value) {
    if (dim.is_array()) {
      DimAxes axes;
      for (int64_t a : json_ints(dim, at, kMin, kMax)) axes.push_back(static_cast<int32_t>(a));
      if (axes == DimAxes{-1}) axes.clear();
      map.push_back(std::move(axes));
    } else {
      const int64_t a = json_int(dim, at, kMin, kMax);
      map.push_back(a == -1 ? DimAxes{} : DimAxes{static_cast<int32_t>(a)});
    }
  }
  return map;
}

ParamLayout json_layout(const Json& object, const std::string& file, std::string_view param) {
  constexpr int64_t kI32Min = std::numeric_limits<int32_t>::min();
  constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();
  constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();
  constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
  if (!object.is_object())
    fail("{}: parameter {}: layout is not a JSON object", file, file_text(param));
  auto place = [&](std::string_view key) { return JsonPlace{file, param, key}; };
  auto required = [&](std::string_view key) -> const Json& {
    return json_required(object, place(key));
  };

  ParamLayout layout;
  layout.dev_matrix = json_ints(required("dev_matrix"), place("dev_matrix"), 0,
                                std::numeric_limits<uint32_t>::max());
  layout.tensor_map = json_tensor_map(required("tensor_map"), place("tensor_map"));
  layout.field =
      static_cast<int32_t>(json_int(required("field"), place("field"), kI32Min, kI32Max));
  layout.opt_shard_step = static_cast<int32_t>(json_int(
      required("opt_weight_shard_step"), place("opt_weight_shard_step"), kI32Min, kI32Max));
  layout.opt_shard_size = static_cast<int32_t>(json_int(
      required("opt_weight_shard_size"), place("opt_weight_shard_size"), kI32Min, kI32Max));
  if (auto it = object.find("tensor_shape"); it != object.end())
    layout.tensor_shape = json_ints(*it, place("tensor_shape"), 0, kI64Max);
  const bool has_split = object.contains("param_split_shape");
  const bool has_offset = object.contains("indices_offset");
  if (has_split != has_offset)
    fail("{}: parameter {}: \"param_split_shape\" and \"indices_offset\" must come together", file,
         param);
  if (has_split) {
    layout.param_split_shape =
        json_ints(object["param_split_shape"], place("param_split_shape"), kI64Min, kI64Max);
    layout.indices_offset =
        json_ints(object["indices_offset"], place("indices_offset"), kI64Min, kI64Max);
  }
  return layout;
}

FileStrategy parse_json(const std::string& text, const std::string& file) {
  Json doc;
  try {
    doc = Json::parse(text);
  } catch (const Json::exception& e) {
    fail("{}: not a JSON strategy file: {}", file, json_error_text(e.what()));
  }
  if (!doc.is_object()) fail("{}: not a JSON strategy file: top level is not an object", file);

  FileStrategy out;
  out.file = file;
  if (auto items = doc.find("parallel_strategy_item"); items != doc.end()) {
    if (!items->is_object()) fail("{}: \"parallel_strategy_item\" is not a JSON object", file);
    const std::string first = first_strategy_item(text);
    for (const auto& [node, item] : items->items()) {
      if (!item.is_object())
        fail("{}: strategy item {} is not a JSON object", file, file_text(node));
      const JsonPlace stage_at{file, node, "stage"};
      OperatorStrategy op;
      op.stage = static_cast<uint32_t>(json_int(json_required(item, stage_at), stage_at, 0,
                                                std::numeric_limits<uint32_t>::max()));
      if (auto inputs = item.find("parallel_strategy"); inputs != item.end()) {
        const JsonPlace at{file, node, "parallel_strategy"};
        if (!inputs->is_array()) json_fail(at, "is not a list of lists");
        for (const Json& input : *inputs) {
          std::vector<uint32_t> dims;
          for (int64_t d : json_ints(input, at, 0, std::numeric_limits<uint32_t>::max()))
            dims.push_back(static_cast<uint32_t>(d));
          op.inputs.push_back(std::move(dims));
        }
      }
      if (node == first) out.first_stage = op.stage;
      out.operators.emplace_back(node, std::move(op));
    }
  }
  if (auto items = doc.find("parallel_layout_item"); items != doc.end()) {
    if (!items->is_object()) fail("{}: \"parallel_layout_item\" is not a JSON object", file);
    for (const auto& [name, object] : items->items())
      out.layouts.emplace_back(name, json_layout(object, file, name));
  }
  return out;
}

bool is_json_name(const fs::path& path) {
  const std::string name = path.filename().string();
  return name.size() >= 5 && name.compare(name.size() - 5, 5, ".json") == 0;
}

FileStrategy parse_file(const fs::path& path) {
  const std::string file = path.string();
  const std::string bytes = read_bytes(path);
  if (bytes.empty()) fail("{}: strategy file is empty", file);
  return is_json_name(path) ? parse_json(bytes, file) : parse_protobuf(bytes, file);
}

// --- merging --------------------------------------------------------------------------------

// "<digits>-<name>" -> (stage, name). MindSpore splits at every "-", which breaks on parameter
// names containing one; only a leading all-digit prefix is a stage here.
std::optional<std::pair<uint32_t, std::string_view>> split_stage(std::string_view name) {
  const size_t dash = name.find('-');
  if (dash == std::string_view::npos || dash == 0) return std::nullopt;
  const std::string_view prefix = name.substr(0, dash);
  if (!std::all_of(prefix.begin(), prefix.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  uint32_t stage = 0;
  auto [end, ec] = std::from_chars(prefix.data(), prefix.data() + prefix.size(), stage);
  if (ec != std::errc() || end != prefix.data() + prefix.size()) return std::nullopt;
  return std::pair{stage, name.substr(dash + 1)};
}

class Merger {
 public:
  explicit Merger(std::string origin) { out_.origin = std::move(origin); }

  // Layout items of `f` belong to `file_stage` unless their name carries a stage prefix.
  void add(const FileStrategy& f, uint32_t file_stage) {
    for (const auto& [node, op] : f.operators) out_.operators.emplace(node, op);
    for (const auto& [written, layout] : f.layouts) {
      uint32_t stage = file_stage;
      std::string_view name = written;
      if (auto split = split_stage(written)) std::tie(stage, name) = *split;
      if (name.empty())
        fail("{}: layout item {} has an empty parameter name", f.file, file_text(written));
      check_devices(f.file, written, layout);

      StrategyParam& param = out_.params[std::string(name)];
      param.name = std::string(name);
      auto [it, inserted] = param.stages.emplace(stage, layout);
      if (!inserted && !(it->second == layout))
        fail("{}: parameter {} is listed twice for stage {} with different layouts", f.file,
             file_text(name), stage);
    }
  }

  Strategy finish() && {
    if (out_.params.empty()) fail("{}: strategy has no parameter layouts", out_.origin);
    std::set<uint32_t> stages;
    for (const auto& [name, param] : out_.params)
      for (const auto& [stage, layout] : param.stages) stages.insert(stage);
    if (*stages.rbegin() + 1 != stages.size())
      fail("{}: pipeline strategy does not contain all stages: has stages [{}], expected 0..{}",
           out_.origin, fmt::join(stages, ","), *stages.rbegin());
    out_.num_stages = static_cast<uint32_t>(stages.size());
    if (static_cast<int64_t>(stages.size()) > kMaxRanks / devices_)
      fail("{}: {} stages of {} devices are more than the {} ranks ckptfs serves", out_.origin,
           stages.size(), devices_, kMaxRanks);
    out_.devices_per_stage = devices_;
    return std::move(out_);
  }

 private:
  // Global rank = stage * N + local needs one device count for every layout (§3.3, §7).
  void check_devices(const std::string& file, std::string_view name, const ParamLayout& layout) {
    if (layout.dev_matrix.empty())
      fail("{}: parameter {}: dev_matrix is empty", file, file_text(name));
    int64_t product = 1;
    for (int64_t d : layout.dev_matrix) {
      if (d <= 0)
        fail("{}: parameter {}: dev_matrix [{}] has a non-positive axis", file, file_text(name),
             fmt::join(layout.dev_matrix, ","));
      if (product > kMaxRanks / d)
        fail(
            "{}: parameter {}: dev_matrix [{}] spans more than {} devices, which ckptfs does "
            "not serve; check that this is the right strategy file",
            file, file_text(name), fmt::join(layout.dev_matrix, ","), kMaxRanks);
      product *= d;
    }
    if (ref_param_.empty()) {
      devices_ = product;
      ref_file_ = file;
      ref_param_ = std::string(name);
    } else if (product != devices_) {
      fail(
          "{}: parameter {}: dev_matrix [{}] spans {} devices, but parameter {} in {} spans {}; "
          "every layout must span the same devices per stage",
          file, file_text(name), fmt::join(layout.dev_matrix, ","), product, file_text(ref_param_),
          ref_file_, devices_);
    }
  }

  Strategy out_;
  int64_t devices_ = 1;
  std::string ref_file_, ref_param_;
};

Strategy read_directory(const fs::path& dir) {
  std::vector<fs::path> protobufs, jsons;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    const fs::path ext = entry.path().extension();
    if (ext != ".ckpt" && ext != ".json") continue;
    // A stage's file that cannot be read must not be left out silently (symlinks followed).
    if (auto kind = util::wrong_kind(entry.path(), S_IFREG))
      util::refuse_kind(entry.path(), "strategy file", *kind, S_IFREG);
    (ext == ".ckpt" ? protobufs : jsons).push_back(entry.path());
  }
  if (!protobufs.empty() && !jsons.empty())
    fail("{}: strategy directory mixes *.ckpt and *.json files", dir.string());
  std::vector<fs::path>& files = protobufs.empty() ? jsons : protobufs;
  if (files.empty()) fail("{}: strategy directory holds no *.ckpt or *.json files", dir.string());
  std::sort(files.begin(), files.end());

  Merger merger(dir.string());
  std::set<uint32_t> merged;
  for (const fs::path& path : files) {
    FileStrategy f = parse_file(path);
    if (!f.first_stage)
      fail("{}: strategy file has no parallel_strategy_item, so its pipeline stage is unknown",
           f.file);
    if (f.layouts.empty()) fail("{}: strategy file has no parallel_layout_item", f.file);
    if (!merged.insert(*f.first_stage).second) {
      spdlog::debug("{}: stage {} already merged, skipping", f.file, *f.first_stage);
      continue;
    }
    merger.add(f, *f.first_stage);
  }
  return std::move(merger).finish();
}

}  // namespace

Strategy read_strategy(const std::filesystem::path& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return read_directory(path);
  if (::lstat(path.c_str(), &st) != 0) fail("{}: strategy file does not exist", path.string());
  // Anything else but a regular file (a FIFO, a device, a symlink loop) read_bytes refuses.

  FileStrategy f = parse_file(path);
  if (f.layouts.empty()) fail("{}: strategy file has no parallel_layout_item", f.file);
  Merger merger(path.string());
  merger.add(f, f.first_stage.value_or(0));
  return std::move(merger).finish();
}

}  // namespace ckptfs::strategy
