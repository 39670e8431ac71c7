#include "ckptfs/hfai/merge.h"

#include <algorithm>
#include <map>
#include <optional>
#include <system_error>

#include "ckptfs/error.h"

namespace ckptfs::hfai {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr char kVersion[] = "2.0.0";

bool is_dict(const json& v) { return v.is_object() && v.contains("$dict"); }
bool is_tuple(const json& v) { return v.is_object() && v.contains("$tuple"); }
bool is_tensor(const json& v) { return v.is_object() && v.contains("$tensor"); }

const json* get(const json& dict, const json& key) {
  for (const json& pair : dict["$dict"])
    if (pair[0] == key) return &pair[1];
  return nullptr;
}

std::string key_name(const json& key) {
  if (key.is_string()) return key.get<std::string>();
  if (key.is_number_integer()) return std::to_string(key.get<int64_t>());
  return key.dump();
}

// The file set being merged: its names and parsed trees.
struct Set {
  const std::vector<index::IndexedSource>& parts;
  std::vector<json> trees;

  std::string file(size_t r) const { return parts[r].file.path.string(); }
  const scan::Param& param(size_t r, const json& ref) const {
    return parts[r].scan.params.at(ref["$tensor"].get<size_t>());
  }
  Tensor view(size_t r, const json& ref, std::string name) const {
    const scan::Param& p = param(r, ref);
    return {std::move(name),
            std::string(p.dtype),
            p.element_size,
            p.shape,
            {{static_cast<uint32_t>(r), ref["$tensor"].get<uint32_t>()}}};
  }
};

// Large entries collected over the ranks: name -> (full shape, one chunk per rank seen).
struct Chunks {
  std::vector<int64_t> shape;
  std::vector<std::pair<size_t, json>> pieces;  // (rank, tensor ref)
};

// hfai's chunks for `name`, validated and merged into one tensor (§1.7).
Tensor concat(const Set& set, const std::string& what, const std::string& name, const Chunks& c) {
  const size_t n = set.parts.size();
  if (c.pieces.size() != n) {
    std::vector<bool> seen(n, false);
    for (const auto& [r, ref] : c.pieces) seen[r] = true;
    const size_t missing = std::find(seen.begin(), seen.end(), false) - seen.begin();
    fail("{}: large {} {} has no chunk in this file (it is chunked in {} of {} files)",
         set.file(missing < n ? missing : 0), what, name, c.pieces.size(), n);
  }
  uint64_t total = 1;
  for (int64_t d : c.shape) total *= static_cast<uint64_t>(d);
  const uint64_t per = (total + n - 1) / n;  // torch.chunk
  Tensor t;
  t.name = name;
  t.shape = c.shape;
  for (size_t i = 0; i < n; ++i) {
    const auto& [r, ref] = c.pieces[i];
    const scan::Param& p = set.param(r, ref);
    if (i == 0) {
      t.code = p.dtype;
      t.element_size = p.element_size;
    } else if (p.dtype != t.code) {
      fail("{}: the chunk of large {} {} is {}, the chunk in {} is {}", set.file(r), what, name,
           p.dtype, set.file(c.pieces[0].first), t.code);
    }
    const uint64_t want = std::min(per, total - std::min(total, i * per));
    if (p.shape.size() != 1 || (p.strides.size() == 1 && p.strides[0] != 1 && p.shape[0] > 1))
      fail("{}: the chunk of large {} {} is not a 1-D contiguous tensor", set.file(r), what, name);
    if (static_cast<uint64_t>(p.shape[0]) != want)
      fail(
          "{}: the chunk of large {} {} has {} elements; torch.chunk of {} elements into {} "
          "gives {} to this rank",
          set.file(r), what, name, p.shape[0], total, n, want);
    t.parts.push_back({static_cast<uint32_t>(r), ref["$tensor"].get<uint32_t>()});
  }
  return t;
}

// {"$tuple": [{"$size": shape}, tensor]}, hfai's (full shape, chunk) pair.
std::pair<std::vector<int64_t>, json> large_pair(const Set& set, size_t r, const json& v,
                                                 const std::string& name) {
  if (!is_tuple(v) || v["$tuple"].size() != 2 || !v["$tuple"][0].is_object() ||
      !v["$tuple"][0].contains("$size") || !is_tensor(v["$tuple"][1]))
    fail("{}: large entry {} is not a (torch.Size, tensor) pair", set.file(r), name);
  return {v["$tuple"][0]["$size"].get<std::vector<int64_t>>(), v["$tuple"][1]};
}

std::vector<Tensor> merge_model(const Set& set, size_t j, const std::string& prefix) {
  std::vector<Tensor> out;
  std::map<std::string, size_t> small;  // name -> rank
  std::vector<std::string> large_order;
  std::map<std::string, Chunks> large;
  for (size_t r = 0; r < set.parts.size(); ++r) {
    const json& entry = get(set.trees[r], "model")->at(j);
    if (!is_tuple(entry) || entry["$tuple"].size() != 2 || !is_dict(entry["$tuple"][0]) ||
        !is_dict(entry["$tuple"][1]))
      fail("{}: model[{}] is not a (state dict, large dict) pair", set.file(r), j);
    for (const json& pair : entry["$tuple"][0]["$dict"]) {
      const std::string name = key_name(pair[0]);
      if (!is_tensor(pair[1])) fail("{}: model entry {} is not a tensor", set.file(r), name);
      if (auto [it, fresh] = small.emplace(name, r); !fresh)
        fail("{}: model entry {} is also in {}; hfai would silently keep the later one",
             set.file(r), name, set.file(it->second));
      out.push_back(set.view(r, pair[1], prefix + name));
    }
    for (const json& pair : entry["$tuple"][1]["$dict"]) {
      const std::string name = key_name(pair[0]);
      auto [shape, ref] = large_pair(set, r, pair[1], name);
      auto [it, fresh] = large.try_emplace(name);
      if (fresh) {
        large_order.push_back(name);
        it->second.shape = shape;
      } else if (it->second.shape != shape) {
        fail("{}: large model entry {} has another full shape than in {}", set.file(r), name,
             set.file(it->second.pieces[0].first));
      }
      it->second.pieces.push_back({r, ref});
    }
  }
  for (const std::string& name : large_order) {
    if (small.contains(name))
      fail("{}: model entry {} is both a small entry and a large chunked one",
           set.file(small[name]), name);
    out.push_back(concat(set, "model entry", name, large[name]));
    out.back().name = prefix + name;
  }
  return out;
}

// The merged optimizer j: state tensors out, the rest (with references) into `extra`.
nlohmann::ordered_json merge_optimizer(const Set& set, size_t j, const std::string& prefix,
                                       std::vector<Tensor>& tensors) {
  const json& first = get(set.trees[0], "optimizer")->at(j);
  if (!is_tuple(first) || first["$tuple"].size() != 2 || !is_dict(first["$tuple"][0]))
    fail("{}: optimizer[{}] is not a (state dict, large dict) pair", set.file(0), j);
  // param id -> its state entries (key -> value), in merged order
  std::vector<std::pair<json, std::vector<std::pair<json, json>>>> state;
  std::map<std::string, std::pair<size_t, size_t>> where;  // id -> (index in state, rank)
  std::vector<std::string> large_order;
  std::map<std::string, Chunks> large;
  std::map<std::string, std::pair<json, json>> large_keys;
  for (size_t r = 0; r < set.parts.size(); ++r) {
    const json& entry = get(set.trees[r], "optimizer")->at(j);
    if (!is_tuple(entry) || entry["$tuple"].size() != 2 || !is_dict(entry["$tuple"][0]) ||
        !is_dict(entry["$tuple"][1]))
      fail("{}: optimizer[{}] is not a (state dict, large dict) pair", set.file(r), j);
    const json* st = get(entry["$tuple"][0], "state");
    if (!st || !is_dict(*st)) fail("{}: optimizer[{}] has no state dict", set.file(r), j);
    for (const json& pair : (*st)["$dict"]) {
      const std::string id = key_name(pair[0]);
      if (!is_dict(pair[1])) fail("{}: optimizer state {} is not a dict", set.file(r), id);
      if (auto it = where.find(id); it != where.end())
        fail("{}: optimizer state {} is also in {}; hfai would silently keep the later one",
             set.file(r), id, set.file(it->second.second));
      where[id] = {state.size(), r};
      std::vector<std::pair<json, json>> values;
      for (const json& kv : pair[1]["$dict"]) {
        json value = kv[1];
        if (is_tensor(value)) {
          const std::string name = prefix + "state." + id + "." + key_name(kv[0]);
          tensors.push_back(set.view(r, value, name));
          value = {{"$tensor", "optimizer.safetensors:" + name}};
        }
        values.push_back({kv[0], value});
      }
      state.push_back({pair[0], std::move(values)});
    }
    for (const json& pair : entry["$tuple"][1]["$dict"]) {
      if (!is_tuple(pair[0]) || pair[0]["$tuple"].size() != 2)
        fail("{}: large optimizer key {} is not a (param id, state key) pair", set.file(r),
             pair[0].dump());
      const std::string key = key_name(pair[0]["$tuple"][0]) + "." + key_name(pair[0]["$tuple"][1]);
      auto [shape, ref] = large_pair(set, r, pair[1], key);
      auto [it, fresh] = large.try_emplace(key);
      if (fresh) {
        large_order.push_back(key);
        it->second.shape = shape;
        large_keys[key] = {pair[0]["$tuple"][0], pair[0]["$tuple"][1]};
      }
      it->second.pieces.push_back({r, ref});
    }
  }
  for (const std::string& key : large_order) {
    const auto& [id_json, state_key] = large_keys[key];
    const std::string id = key_name(id_json);
    auto it = where.find(id);
    if (it == where.end()) {
      where[id] = {state.size(), 0};
      state.push_back({id_json, {}});
      it = where.find(id);
    }
    auto& values = state[it->second.first].second;
    for (const auto& kv : values)
      if (kv.first == state_key)
        fail("{}: optimizer state {} key {} is both a small entry and a large chunked one",
             set.file(it->second.second), id, key_name(state_key));
    const std::string name = prefix + "state." + key;
    tensors.push_back(concat(set, "optimizer state", key, large[key]));
    tensors.back().name = name;
    values.push_back({state_key, {{"$tensor", "optimizer.safetensors:" + name}}});
  }
  // Rank 0's share dict with the merged state in place of its own.
  nlohmann::ordered_json out = {{"$dict", nlohmann::ordered_json::array()}};
  for (const json& pair : first["$tuple"][0]["$dict"]) {
    if (pair[0] != "state") {
      out["$dict"].push_back({pair[0], pair[1]});
      continue;
    }
    nlohmann::ordered_json merged = {{"$dict", nlohmann::ordered_json::array()}};
    for (const auto& [id, values] : state) {
      nlohmann::ordered_json d = {{"$dict", nlohmann::ordered_json::array()}};
      for (const auto& [k, v] : values) d["$dict"].push_back({k, v});
      merged["$dict"].push_back({id, d});
    }
    out["$dict"].push_back({"state", merged});
  }
  return out;
}

// Tensors among the user's values move to others.safetensors; the rest stays.
nlohmann::ordered_json take_tensors(const Set& set, const json& v, const std::string& path,
                                    std::vector<Tensor>& tensors) {
  if (is_tensor(v)) {
    tensors.push_back(set.view(0, v, path));
    return {{"$tensor", "others.safetensors:" + path}};
  }
  if (v.is_array()) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (size_t i = 0; i < v.size(); ++i)
      out.push_back(take_tensors(set, v[i], path + "." + std::to_string(i), tensors));
    return out;
  }
  if (is_dict(v)) {
    nlohmann::ordered_json out = {{"$dict", nlohmann::ordered_json::array()}};
    for (const json& pair : v["$dict"])
      out["$dict"].push_back(
          {pair[0], take_tensors(set, pair[1], path + "." + key_name(pair[0]), tensors)});
    return out;
  }
  if (v.is_object() && (v.contains("$tuple") || v.contains("$set"))) {
    const std::string k = v.contains("$tuple") ? "$tuple" : "$set";
    return {{k, take_tensors(set, v[k], path, tensors)}};
  }
  return v;
}

}  // namespace

bool is_hfai_dir(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("PART_", 0) == 0 && e.path().extension() == ".pt") return true;
  }
  return false;
}

std::vector<fs::path> part_files(const fs::path& dir) {
  std::map<uint64_t, std::string> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("PART_", 0) != 0 || e.path().extension() != ".pt") continue;
    const std::string digits = name.substr(5, name.size() - 8);
    uint64_t r = 0;
    bool ok = digits.size() >= 3 && digits.size() <= 9;
    for (char c : digits) ok = ok && c >= '0' && c <= '9', r = r * 10 + (c - '0');
    // PART_{r:03d}: 3 digits, more only when needed, never a leading zero beyond the width.
    if (!ok || digits != fmt::format("{:03d}", r))
      fail("{}: {} is not a PART file name hfai writes (PART_000.pt, PART_001.pt, ...)",
           dir.string(), name);
    found[r] = name;
  }
  if (ec) fail("{}: cannot list: {}", dir.string(), ec.message());
  if (found.empty()) fail("{}: no PART_*.pt files", dir.string());
  std::vector<fs::path> out;
  for (uint64_t r = 0; r < found.size(); ++r) {
    if (!found.contains(r))
      fail("{}: PART_{:03d}.pt is missing ({} PART files found, numbered up to {})", dir.string(),
           r, found.size(), found.rbegin()->first);
    out.push_back(dir / found[r]);
  }
  return out;
}

Merged merge(const std::vector<index::IndexedSource>& parts) {
  Set set{parts, {}};
  const size_t n = parts.size();
  for (size_t r = 0; r < n; ++r) {
    if (parts[r].scan.format != scan::SourceFormat::TorchZip)
      fail("{}: not a torch.save file", set.file(r));
    set.trees.push_back(json::parse(parts[r].scan.tree));
    const json& t = set.trees.back();
    if (!is_dict(t))
      fail("{}: the saved object is not a dict, so not an hfai PART file", set.file(r));
    const json* shards = get(t, "__nshards__");
    if (!shards || !shards->is_number_integer())
      fail("{}: no __nshards__, so not an hfai PART file", set.file(r));
    if (shards->get<int64_t>() != static_cast<int64_t>(n))
      fail("{}: __nshards__ is {} but the directory holds {} PART files", set.file(r),
           shards->get<int64_t>(), n);
    const json* version = get(t, "__version__");
    if ((r == 0 && !version) || (version && *version != kVersion))
      fail("{}: __version__ is {}; only hfai checkpoint format {} is read", set.file(r),
           version ? version->dump() : "absent (hfai 1.0.0)", kVersion);
    for (const char* key : {"model", "optimizer"}) {
      const json* v = get(t, key);
      if (!v || !v->is_array()) fail("{}: no {} list", set.file(r), key);
      if (r > 0 && v->size() != get(set.trees[0], key)->size())
        fail("{}: {} {} entries, {} has {}", set.file(r), v->size(), key, set.file(0),
             get(set.trees[0], key)->size());
    }
  }
  Merged out;
  const size_t models = get(set.trees[0], "model")->size();
  for (size_t j = 0; j < models; ++j) {
    std::vector<Tensor> m = merge_model(set, j, models == 1 ? "" : std::to_string(j) + ".");
    out.model.insert(out.model.end(), std::make_move_iterator(m.begin()),
                     std::make_move_iterator(m.end()));
  }
  out.extra = {{"$dict", nlohmann::ordered_json::array()}};
  for (const json& pair : set.trees[0]["$dict"]) {
    if (pair[0] == "model") continue;
    if (pair[0] == "optimizer") {
      nlohmann::ordered_json list = nlohmann::ordered_json::array();
      const size_t opts = pair[1].size();
      for (size_t j = 0; j < opts; ++j)
        list.push_back(
            merge_optimizer(set, j, opts == 1 ? "" : std::to_string(j) + ".", out.optimizer));
      out.extra["$dict"].push_back({"optimizer", opts == 1 ? list[0] : list});
      continue;
    }
    out.extra["$dict"].push_back(
        {pair[0], take_tensors(set, pair[1], key_name(pair[0]), out.others)});
  }
  return out;
}

}  // namespace ckptfs::hfai
