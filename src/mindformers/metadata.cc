#include "ckptfs/mindformers/metadata.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>

#include "ckptfs/error.h"
#include "ckptfs/scan/dtype.h"
#include "ckptfs/strategy/layout.h"
#include "ckptfs/util/decimal.h"
#include "ckptfs/util/json_int.h"
#include "ckptfs/util/open_path.h"
#include "ckptfs/util/quote.h"
#include "ckptfs/util/shape_text.h"

namespace ckptfs::mindformers {

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

constexpr size_t kMaxFailures = 20;

std::string read_text(const fs::path& path) { return util::read_regular(path, "file"); }

Json parse_json(const fs::path& path) {
  try {
    return Json::parse(read_text(path));
  } catch (const Json::parse_error& e) {
    fail("{}: not valid JSON at byte {}; the save did not finish or the file is damaged",
         path.string(), e.byte);
  } catch (const Json::exception& e) {
    // Valid JSON that the parser cannot hold, such as a number beyond a double's range.
    fail("{}: cannot be read ({}); the file is damaged", path.string(), json_error_text(e.what()));
  }
}

// Where a value sits, for messages: the file, and the parameter or key inside it.
struct Place {
  const std::string& file;
  std::string what;
};

[[noreturn]] void bad(const Place& at, std::string_view why) {
  fail("{}: {} {}", at.file, at.what, why);
}

int64_t int_of(const Json& value, const Place& at, int64_t lo, int64_t hi) {
  return util::json_int(value, lo, hi, [&](std::string_view why) { bad(at, why); });
}

std::vector<int64_t> ints_of(const Json& value, const Place& at, int64_t lo, int64_t hi) {
  return util::json_ints(value, lo, hi, [&](std::string_view why) { bad(at, why); });
}

const Json& member(const Json& object, std::string_view key, const std::string& file,
                   std::string_view param) {
  if (!object.is_object()) fail("{}: {}: expected a JSON object", file, param);
  auto it = object.find(key);
  if (it == object.end()) fail("{}: {}: \"{}\" is missing", file, param, key);
  return *it;
}

// MindSpore's dtype name (the spelling the safetensors scans use) of `text`, in any case.
std::optional<std::string> dtype_name(std::string_view text) {
  const auto same = [text](std::string_view name) {
    return name.size() == text.size() &&
           std::equal(name.begin(), name.end(), text.begin(), [](char a, char b) {
             return std::tolower(static_cast<unsigned char>(a)) ==
                    std::tolower(static_cast<unsigned char>(b));
           });
  };
  for (const scan::DenseType& t : scan::kDenseTypes)
    if (same(t.name)) return std::string(t.name);
  if (same("Int4")) return "Int4";
  return std::nullopt;
}

// MindFormers' tensor map: per dimension -1, an axis, or a list of axes (a multi-axis split).
std::vector<strategy::DimAxes> tensor_map_of(const Json& value, const Place& at) {
  if (!value.is_array()) bad(at, "is not a list");
  constexpr int64_t lo = -1, hi = 64;
  std::vector<strategy::DimAxes> map;
  for (const Json& dim : value) {
    strategy::DimAxes axes;
    if (dim.is_array()) {
      for (int64_t a : ints_of(dim, at, lo, hi))
        if (a != -1) axes.push_back(static_cast<int32_t>(a));
    } else if (const int64_t a = int_of(dim, at, lo, hi); a != -1) {
      axes.push_back(static_cast<int32_t>(a));
    }
    map.push_back(std::move(axes));
  }
  return map;
}

// "('<name>', (<slice index>,))", as Python's str() of the storage key tuple.
bool parse_key(std::string_view key, std::string& name, int64_t& index) {
  constexpr std::string_view kHead = "('", kMid = "', (", kTail = ",))";
  if (!key.starts_with(kHead) || !key.ends_with(kTail)) return false;
  const size_t mid = key.rfind(kMid);
  if (mid == std::string_view::npos || mid < kHead.size()) return false;
  name = std::string(key.substr(kHead.size(), mid - kHead.size()));
  const std::string_view digits =
      key.substr(mid + kMid.size(), key.size() - kTail.size() - mid - kMid.size());
  const std::optional<uint64_t> v = util::parse_decimal(digits);
  if (!v || digits.empty() || std::isspace(static_cast<unsigned char>(digits.front())) ||
      *v > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
    return false;
  index = static_cast<int64_t>(*v);
  return true;
}

bool is_opt_file(const std::string& name) {
  return name.starts_with("opt-") || name.find("-opt-") != std::string::npos;
}

template <typename T>
std::string le_bytes(T value) {
  std::string out(sizeof(T), '\0');
  std::memcpy(out.data(), &value, sizeof(T));
  if constexpr (std::endian::native == std::endian::big) std::reverse(out.begin(), out.end());
  return out;
}

// common.json's counters as the legacy (append_info) save writes them: Python ints become Int64
// scalars and the float loss_scale a Float32 scalar (MindSpore's Tensor() of each).
std::vector<Scalar> read_common(const fs::path& path, bool& unhealthy) {
  std::vector<Scalar> out;
  std::error_code ec;
  if (!fs::exists(path, ec)) return out;
  const std::string file = path.string();
  const Json doc = parse_json(path);
  if (!doc.is_object()) fail("{}: expected a JSON object", file);
  if (auto status = doc.find("ckpt_status"); status != doc.end() && status->is_number_integer())
    unhealthy = status->get<int64_t>() == 1;
  for (std::string_view key :
       {"epoch_num", "step_num", "global_step", "loss_scale", "global_batch_size"}) {
    auto it = doc.find(key);
    if (it == doc.end() || it->is_null()) continue;
    const Place at{file, std::string(key)};
    if (key == "loss_scale") {
      if (!it->is_number()) bad(at, "is not a number");
      out.push_back({std::string(key), "Float32", le_bytes(static_cast<float>(it->get<double>()))});
    } else {
      out.push_back({std::string(key), "Int64",
                     le_bytes(int_of(*it, at, std::numeric_limits<int64_t>::min(),
                                     std::numeric_limits<int64_t>::max()))});
    }
  }
  return out;
}

}  // namespace

std::optional<fs::path> find_iteration(const fs::path& dir, std::string_view step) {
  std::error_code ec;
  if (fs::is_regular_file(dir / kMetadataFile, ec)) {
    if (step != "latest")
      fail("{}: an iteration directory is one checkpoint; give its parent with --step {}",
           dir.string(), step);
    return dir;
  }
  const fs::path latest = dir / kLatestFile;
  if (!fs::exists(latest, ec)) return std::nullopt;
  std::optional<uint64_t> iteration;
  if (step == "latest") {
    iteration = util::parse_decimal(read_text(latest));
    if (!iteration)
      fail("{}: expected a decimal iteration number; give --step ITERATION", latest.string());
  } else {
    iteration = util::parse_decimal(step);
    if (!iteration)
      fail("--step {}: a MindFormers metadata checkpoint ({}) takes latest or an iteration number",
           step, latest.string());
  }
  const fs::path chosen = dir / fmt::format("iteration_{:08d}", *iteration);
  if (!fs::is_regular_file(chosen / kMetadataFile, ec))
    fail("{}: no {} there (iteration {} was not saved, or not completely)", chosen.string(),
         kMetadataFile, *iteration);
  return chosen;
}

Iteration read_iteration(const fs::path& dir) {
  Iteration it;
  it.dir = dir;
  const fs::path meta_path = dir / kMetadataFile;
  const std::string file = meta_path.string();
  const Json doc = parse_json(meta_path);
  const Json& params = member(doc, "state_dict_metadata", file, "the top level");
  const Json& storage = member(doc, "storage_data", file, "the top level");
  if (!params.is_object() || !storage.is_object())
    fail("{}: state_dict_metadata and storage_data must be JSON objects", file);

  it.strategy.origin = file;
  it.strategy.devices_per_stage = 0;
  std::map<std::string, size_t, std::less<>> by_name;
  std::vector<strategy::Layout> layouts;
  uint32_t stages = 0;
  for (const auto& [name, p] : params.items()) {
    const Place at{file, fmt::format("parameter {}:", file_text(name))};
    ParamMeta meta;
    meta.name = name;
    const Json& props = member(p, "properties", file, at.what);
    const Json& dtype = member(props, "dtype", file, at.what);
    if (!dtype.is_string()) bad(at, "dtype is not a string");
    const std::optional<std::string> d = dtype_name(dtype.get<std::string>());
    if (!d)
      bad(at, fmt::format("has dtype {}, which is no MindSpore tensor type",
                          file_text(dtype.get<std::string>())));
    meta.dtype = *d;
    meta.global_shape = ints_of(member(p, "global_shape", file, at.what), at, 0,
                                std::numeric_limits<int64_t>::max());
    const Json& layout = member(p, "layout", file, at.what);
    strategy::ParamLayout pl;
    std::vector<int64_t> rank_list;
    if (layout.is_null()) {
      pl.tensor_map.assign(meta.global_shape.size(), {});
    } else {
      pl.dev_matrix =
          ints_of(member(layout, "device_matrix", file, at.what), at, 1, strategy::kMaxRanks);
      pl.tensor_map = tensor_map_of(member(layout, "tensor_map", file, at.what), at);
      // An interleaved layout cuts a dimension into more pieces than its device axes (the
      // virtual "interleaved_parallel" axis): blocks are no longer one per device coordinate.
      if (auto i = layout.find("interleaved_parallel");
          i != layout.end() && i->is_boolean() && i->get<bool>())
        bad(at, "has an interleaved_parallel layout, which ckptfs does not read");
      if (auto r = layout.find("rank_list"); r != layout.end() && !r->is_null())
        rank_list = ints_of(*r, at, 0, strategy::kMaxRanks - 1);
    }
    int64_t devices = 1;
    for (int64_t a : pl.dev_matrix) {
      devices *= a;
      if (devices > strategy::kMaxRanks) bad(at, "spans more devices than ckptfs serves");
    }
    if (layout.is_null()) {
      // Not split: every rank of the job holds it; the other layouts tell how many there are.
      pl.dev_matrix = {0};
      devices = 0;
    }
    if (devices != 0) {
      if (it.strategy.devices_per_stage == 0) it.strategy.devices_per_stage = devices;
      if (devices != it.strategy.devices_per_stage)
        bad(at, fmt::format("has a device matrix of {} devices where other parameters have {}",
                            devices, it.strategy.devices_per_stage));
      if (!rank_list.empty()) {
        if (static_cast<int64_t>(rank_list.size()) != devices || rank_list[0] % devices != 0)
          bad(at, "has a rank_list that is not one pipeline stage's ranks");
        for (size_t i = 0; i < rank_list.size(); ++i)
          if (rank_list[i] != rank_list[0] + static_cast<int64_t>(i))
            bad(at, "has a rank_list that is not a contiguous range of ranks");
        meta.stage = static_cast<uint32_t>(rank_list[0] / devices);
      }
    }
    stages = std::max(stages, meta.stage + 1);
    by_name.emplace(name, it.params.size());
    it.params.push_back(std::move(meta));
    it.strategy.params[name].name = name;
    it.strategy.params[name].stages[it.params.back().stage] = std::move(pl);
  }
  if (it.params.empty()) fail("{}: state_dict_metadata lists no parameter", file);
  if (it.strategy.devices_per_stage == 0) it.strategy.devices_per_stage = 1;
  const int64_t n = it.strategy.devices_per_stage;
  if (static_cast<int64_t>(stages) * n > strategy::kMaxRanks)
    fail("{}: {} stages of {} devices are more ranks than ckptfs serves", file, stages, n);
  it.strategy.num_stages = stages;
  std::vector<bool> stage_seen(stages, false);

  // Layouts against shapes and chunks, now that the device count is known.
  for (ParamMeta& meta : it.params) {
    strategy::ParamLayout& pl = it.strategy.params[meta.name].stages.begin()->second;
    if (pl.dev_matrix == std::vector<int64_t>{0}) pl.dev_matrix = {n};
    stage_seen[meta.stage] = true;
    strategy::Layout layout = strategy::Layout::from(pl, meta.global_shape.size(), meta.name);
    // A layout the shape does not divide is refused here, naming the parameter.
    const std::vector<int64_t> slice = layout.slice_shape(meta.global_shape, meta.name);
    const auto& splits = layout.splits();
    int64_t blocks = 1;
    for (int64_t s : splits) blocks *= s;
    meta.blocks.resize(static_cast<size_t>(blocks));
    const Json& chunks = member(params[meta.name], "chunk", file, file_text(meta.name));
    if (!chunks.is_array())
      fail("{}: parameter {}: chunk is not a list", file, file_text(meta.name));
    for (const Json& chunk : chunks) {
      const Place at{file, fmt::format("parameter {}: a chunk's", file_text(meta.name))};
      const std::vector<int64_t> offset =
          ints_of(member(chunk, "global_offset", file, file_text(meta.name)), at, 0, blocks - 1);
      if (offset.size() != 1) bad(at, "global_offset is not one slice index");
      const std::vector<int64_t> local =
          ints_of(member(chunk, "local_shape", file, file_text(meta.name)), at, 0,
                  std::numeric_limits<int64_t>::max());
      if (local != slice)
        fail(
            "{}: parameter {}: a chunk of shape {} where the layout gives {} (an optimizer-sharded "
            "or otherwise unevenly cut parameter, which ckptfs does not read from metadata)",
            file, file_text(meta.name), shape_text(local), shape_text(slice));
    }
    layouts.push_back(std::move(layout));
  }
  for (uint32_t s = 0; s < stages; ++s)
    if (!stage_seen[s]) fail("{}: no parameter lives on pipeline stage {}", file, s);

  // Which files store which blocks, and the rank each file belongs to.
  std::map<std::string, int64_t> rank_of;
  for (const auto& [key, value] : storage.items()) {
    std::string name;
    int64_t k = 0;
    if (!parse_key(key, name, k))
      fail("{}: storage_data key {} is not of the form ('<parameter>', (<slice index>,))", file,
           file_text(key));
    auto found = by_name.find(name);
    if (found == by_name.end())
      fail("{}: storage_data key {} names a parameter state_dict_metadata does not list", file,
           file_text(key));
    ParamMeta& meta = it.params[found->second];
    const strategy::Layout& layout = layouts[found->second];
    if (k >= static_cast<int64_t>(meta.blocks.size()))
      fail("{}: storage_data key {}: parameter {} has only {} blocks", file, file_text(key),
           file_text(name), meta.blocks.size());
    const Json* list = &value;
    Json wrapped;
    if (value.is_object()) {  // one location, as older MindFormers wrote it
      wrapped = Json::array({value});
      list = &wrapped;
    }
    if (!list->is_array() || list->empty())
      fail("{}: storage_data key {}: expected a list of locations", file, file_text(key));
    for (const Json& where : *list) {
      const Place at{file, fmt::format("storage_data key {}:", file_text(key))};
      const Json& fname = member(where, "file_name", file, file_text(key));
      if (!fname.is_string()) bad(at, "file_name is not a string");
      const std::string f = fname.get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == ".." ||
          !f.ends_with(".safetensors"))
        bad(at,
            fmt::format("file_name {} is not a .safetensors file of the directory", file_text(f)));
      const int64_t r = int_of(member(where, "storage_rank", file, file_text(key)), at, 0,
                               strategy::kMaxRanks - 1);
      const int64_t local = r - static_cast<int64_t>(meta.stage) * n;
      if (local < 0 || local >= n)
        bad(at, fmt::format("storage_rank {} is not a rank of pipeline stage {}", r, meta.stage));
      const std::vector<int64_t> block = layout.block_of(local);
      int64_t flat = 0;
      for (size_t j = 0; j < block.size(); ++j) flat = flat * layout.splits()[j] + block[j];
      if (flat != k)
        bad(at, fmt::format("rank {} holds slice {} of {} by its layout, not slice {}", r, flat,
                            file_text(name), k));
      auto [at_rank, inserted] = rank_of.try_emplace(f, r);
      if (!inserted && at_rank->second != r)
        bad(at, fmt::format("file {} is given as rank {} here and as rank {} elsewhere",
                            file_text(f), r, at_rank->second));
      meta.blocks[static_cast<size_t>(k)].push_back(f);
    }
  }
  for (const ParamMeta& meta : it.params)
    for (size_t k = 0; k < meta.blocks.size(); ++k)
      if (meta.blocks[k].empty())
        fail("{}: parameter {}: no file stores slice {} (storage_data has no key ('{}', ({},)))",
             file, file_text(meta.name), k, meta.name.substr(0, kQuoteLimit), k);

  std::error_code ec;
  for (const auto& [name, rank] : rank_of) {
    const fs::path path = dir / name;
    if (auto kind = util::wrong_kind(path, S_IFREG))
      fail("{}: {} names {}, which is {}, not a regular file", path.string(), kMetadataFile, name,
           *kind);
    if (!fs::is_regular_file(path, ec))
      fail("{}: {} names {}, which is missing; copy the whole iteration directory", path.string(),
           kMetadataFile, file_text(name));
    it.files.push_back({path, rank});
  }
  std::stable_sort(it.files.begin(), it.files.end(), [](const StoredFile& a, const StoredFile& b) {
    const bool ao = is_opt_file(a.path.filename().string());
    const bool bo = is_opt_file(b.path.filename().string());
    return std::tie(a.rank, ao) < std::tie(b.rank, bo);
  });
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.ends_with(".safetensors") && !rank_of.count(name)) it.unnamed.push_back(name);
  }
  if (ec) fail("{}: cannot list it: {}", dir.string(), ec.message());
  std::sort(it.unnamed.begin(), it.unnamed.end());
  it.scalars = read_common(dir / kCommonFile, it.unhealthy);
  return it;
}

void validate(const Iteration& it, const std::vector<index::IndexedSource>& scans) {
  std::map<std::string, const scan::FileScan*> by_file;
  for (size_t i = 0; i < it.files.size() && i < scans.size(); ++i)
    by_file[it.files[i].path.filename().string()] = &scans[i].scan;
  std::vector<std::string> failures;
  size_t more = 0;
  auto note = [&](std::string line) {
    if (failures.size() < kMaxFailures)
      failures.push_back(std::move(line));
    else
      ++more;
  };
  for (const ParamMeta& meta : it.params) {
    const strategy::Layout layout =
        strategy::Layout::from(it.strategy.params.at(meta.name).stages.begin()->second,
                               meta.global_shape.size(), meta.name);
    const std::vector<int64_t> slice = layout.slice_shape(meta.global_shape, meta.name);
    std::set<std::string> checked;
    for (const std::vector<std::string>& files : meta.blocks)
      for (const std::string& f : files) {
        if (!checked.insert(f).second) continue;
        const std::string path = (it.dir / f).string();
        auto scan = by_file.find(f);
        if (scan == by_file.end()) continue;  // read_iteration already required it
        const auto& ps = scan->second->params;
        auto p = std::find_if(ps.begin(), ps.end(),
                              [&](const scan::Param& q) { return q.name == meta.name; });
        if (p == ps.end())
          note(fmt::format("{}: parameter {} is missing, but {} says this file stores it", path,
                           meta.name, kMetadataFile));
        else if (p->shape != slice || p->dtype != meta.dtype)
          note(fmt::format("{}: parameter {} is {} {} here, but {} gives {} {}", path, meta.name,
                           p->dtype, shape_text(p->shape), kMetadataFile, meta.dtype,
                           shape_text(slice)));
      }
  }
  if (failures.empty()) return;
  if (more) failures.push_back(fmt::format("... and {} more", more));
  fail("{}", fmt::join(failures, "\n"));
}

}  // namespace ckptfs::mindformers
