#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "ckptfs/dcp/dcp.h"
#include "ckptfs/error.h"
#include "ckptfs/torchzip/pickle.h"
#include "ckptfs/util/open_path.h"
#include "ckptfs/util/quote.h"
#include "ckptfs/util/shape_text.h"
#include "geometry.h"

namespace ckptfs::dcp {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::string_view kModule = "torch.distributed.checkpoint.metadata.";

// Reads the unpickled tree (torchzip/pickle.h's encoding), failing with one line naming the
// file and what was expected.
struct Tree {
  const std::string& name;

  template <typename... Args>
  [[noreturn]] void bad(fmt::format_string<Args...> format, Args&&... args) const {
    fail("{}: not a DCP metadata file: {}", name, fmt::format(format, std::forward<Args>(args)...));
  }

  std::string cls(const json& j) const {
    if (!j.is_object() || !j.contains("$object")) return "";
    return j["$object"].get<std::string>();
  }
  bool is(const json& j, std::string_view short_name) const {
    const std::string c = cls(j);
    return c.size() == kModule.size() + short_name.size() && c.starts_with(kModule) &&
           c.ends_with(short_name);
  }
  // The fields of a dataclass object's state dict.
  std::map<std::string, const json*> fields(const json& object, std::string_view what) const {
    std::map<std::string, const json*> out;
    if (!object.contains("state")) return out;
    const json& state = object["state"];
    if (!state.is_object() || !state.contains("$dict")) bad("{} has no field dict", what);
    for (const json& pair : state["$dict"]) {
      if (!pair[0].is_string()) bad("{} has a field name that is not a string", what);
      out[pair[0].get<std::string>()] = &pair[1];
    }
    return out;
  }
  const json& field(const std::map<std::string, const json*>& f, const std::string& key,
                    std::string_view what) const {
    auto it = f.find(key);
    if (it == f.end()) bad("{} has no field {}", what, key);
    return *it->second;
  }
  std::vector<int64_t> size(const json& j, std::string_view what) const {
    if (!j.is_object() || !j.contains("$size")) bad("{} is not a torch.Size", what);
    std::vector<int64_t> out;
    for (const json& d : j["$size"]) out.push_back(d.get<int64_t>());
    return out;
  }
  const json& dict(const json& j, std::string_view what) const {
    if (!j.is_object() || !j.contains("$dict")) bad("{} is not a dict", what);
    return j["$dict"];
  }
  uint64_t count(const json& j, std::string_view what) const {
    if (!j.is_number_integer() || j.get<int64_t>() < 0) bad("{} is not a count", what);
    return j.get<uint64_t>();
  }
};

uint64_t fnv1a(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325;
  for (char c : bytes) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3;
  return h;
}

std::string key_text(const std::string& fqn, const std::optional<std::vector<int64_t>>& offsets) {
  return offsets ? fmt::format("{} at {}", file_text(fqn), shape_text(*offsets)) : file_text(fqn);
}

}  // namespace

uint64_t Chunk::elements() const {
  uint64_t n = 1;
  for (int64_t s : sizes) n *= static_cast<uint64_t>(s);
  return n;
}

Metadata parse_metadata(std::string_view bytes, const std::string& name) {
  const torchzip::Unpickled object = torchzip::unpickle(
      bytes, name, [](std::string_view) { return std::nullopt; }, torchzip::Allow::DcpMetadata);
  const Tree t{name};
  const json& root = object.tree;
  // Megatron-Core v0.8-v0.15 pickle their subclass of it, whose extra fields are not needed here.
  if (!t.is(root, "Metadata") &&
      t.cls(root) != "megatron.core.dist_checkpointing.strategies.torch.MCoreMetadata")
    t.bad("the pickle holds {}, not {}Metadata",
          root.is_object() && root.contains("$object") ? root["$object"].get<std::string>()
                                                       : std::string("another value"),
          kModule);
  const auto top = t.fields(root, "Metadata");
  Metadata md;
  md.bytes = bytes.size();
  md.digest = fnv1a(bytes);

  // Tensors and objects by name, as state_dict_metadata lists them.
  std::map<std::string, size_t> tensor_at, object_at;
  for (const json& pair :
       t.dict(t.field(top, "state_dict_metadata", "Metadata"), "state_dict_metadata")) {
    if (!pair[0].is_string()) t.bad("a state_dict_metadata key is not a string");
    const std::string fqn = pair[0].get<std::string>();
    const json& entry = pair[1];
    if (tensor_at.contains(fqn) || object_at.contains(fqn))
      fail("{}: {} is listed twice in state_dict_metadata", name, file_text(fqn));
    if (t.is(entry, "BytesStorageMetadata")) {
      object_at[fqn] = md.objects.size();
      md.objects.push_back({fqn, {}});
      continue;
    }
    if (!t.is(entry, "TensorStorageMetadata"))
      t.bad("{} is described by {}", file_text(fqn), entry.dump().substr(0, 80));
    const std::string what = "tensor " + file_text(fqn);
    const auto f = t.fields(entry, what);
    Tensor& tensor = md.tensors.emplace_back();
    tensor.fqn = fqn;
    tensor_at[fqn] = md.tensors.size() - 1;
    tensor.shape = t.size(t.field(f, "size", what), what + "'s size");
    const json& props = t.field(f, "properties", what);
    if (!t.is(props, "TensorProperties") || !props.contains("state") ||
        !props["state"].contains("$tuple") || props["state"]["$tuple"].size() != 5)
      t.bad("{} has properties that are not TensorProperties' (dtype, layout, ...) tuple", what);
    const json& fields = props["state"]["$tuple"];
    const json& dtype = fields[0];
    if (!dtype.is_object() || !dtype.contains("$global"))
      t.bad("{} has a dtype that is not a torch dtype", what);
    const std::string dtype_name = dtype["$global"].get<std::string>();  // "torch.float32"
    const torchzip::DtypeInfo* info = dtype_name.starts_with("torch.")
                                          ? torchzip::dtype_by_torch_name(dtype_name.substr(6))
                                          : nullptr;
    if (!info)
      fail("{}: tensor {} has dtype {}, which ckptfs does not read", name, file_text(fqn),
           file_text(dtype_name));
    tensor.code = info->code;
    tensor.element_size = info->element_size;
    const json& layout = fields[1];
    if (!layout.is_object() || !layout.contains("args") || layout["args"].size() != 1 ||
        layout["args"][0] != "torch.strided")
      fail("{}: tensor {} is not a dense (torch.strided) tensor; only dense tensors are read", name,
           file_text(fqn));
    const json& chunks = t.field(f, "chunks", what);
    if (!chunks.is_array()) t.bad("{}'s chunks are not a list", what);
    for (const json& c : chunks) {
      if (!t.is(c, "ChunkStorageMetadata")) t.bad("{} has a chunk of another class", what);
      const auto cf = t.fields(c, "a chunk");
      Chunk& chunk = tensor.chunks.emplace_back();
      chunk.offsets = t.size(t.field(cf, "offsets", "a chunk"), what + "'s chunk offsets");
      chunk.sizes = t.size(t.field(cf, "sizes", "a chunk"), what + "'s chunk sizes");
    }
  }

  // Storage entries: MetadataIndex(fqn, offset, index) -> _StorageInfo(path, offset, length).
  struct Entry {
    std::string path;
    uint64_t offset, length;
    bool used = false;
  };
  std::map<std::pair<std::string, std::optional<std::vector<int64_t>>>, Entry> entries;
  for (const json& pair : t.dict(t.field(top, "storage_data", "Metadata"), "storage_data")) {
    if (!t.is(pair[0], "MetadataIndex")) t.bad("a storage_data key is not a MetadataIndex");
    const auto k = t.fields(pair[0], "a MetadataIndex");
    const json& fqn_j = t.field(k, "fqn", "a MetadataIndex");
    if (!fqn_j.is_string()) t.bad("a MetadataIndex fqn is not a string");
    std::optional<std::vector<int64_t>> offsets;
    // An object's key (offset None) may leave the field out of its state.
    if (auto o = k.find("offset"); o != k.end() && !o->second->is_null())
      offsets = t.size(*o->second, "a MetadataIndex offset");
    const std::string fqn = fqn_j.get<std::string>();
    const json& v = pair[1];
    if (t.cls(v) != "torch.distributed.checkpoint.filesystem._StorageInfo")
      t.bad("the storage entry of {} is not a _StorageInfo", key_text(fqn, offsets));
    const auto s = t.fields(v, "a _StorageInfo");
    if (auto it = s.find("transform_descriptors");
        it != s.end() && !it->second->is_null() && !it->second->empty())
      fail(
          "{}: the item of {} is stored through transforms {} (compressed): ckptfs reads only "
          "uncompressed DCP items; save without the FileSystemWriter extension",
          name, key_text(fqn, offsets), it->second->dump());
    const json& path = t.field(s, "relative_path", "a _StorageInfo");
    if (!path.is_string()) t.bad("the storage entry of {} has no path", key_text(fqn, offsets));
    const std::string p = path.get<std::string>();
    if (p.empty() || p == "." || p == ".." || p.find('/') != std::string::npos ||
        p.find('\0') != std::string::npos)
      fail("{}: the item of {} is in {}, which is not a file name of this directory", name,
           key_text(fqn, offsets), file_text(p));
    Entry e{p, t.count(t.field(s, "offset", "a _StorageInfo"), "a storage offset"),
            t.count(t.field(s, "length", "a _StorageInfo"), "a storage length")};
    if (!entries.emplace(std::make_pair(fqn, offsets), e).second)
      fail("{}: two storage entries for {}", name, key_text(fqn, offsets));
  }
  for (const auto& [key, e] : entries) md.files.push_back(e.path);
  std::sort(md.files.begin(), md.files.end());
  md.files.erase(std::unique(md.files.begin(), md.files.end()), md.files.end());
  auto take = [&](const std::string& fqn, const std::optional<std::vector<int64_t>>& offsets) {
    auto it = entries.find({fqn, offsets});
    if (it == entries.end())
      fail("{}: {} has no storage entry: the checkpoint is incomplete", name,
           offsets ? "tensor " + key_text(fqn, offsets) : "object " + file_text(fqn));
    it->second.used = true;
    const auto file = std::lower_bound(md.files.begin(), md.files.end(), it->second.path);
    return Storage{static_cast<uint32_t>(file - md.files.begin()), it->second.offset,
                   it->second.length};
  };
  for (Tensor& tensor : md.tensors) {
    check_chunks(name, tensor);
    for (Chunk& c : tensor.chunks) c.storage = take(tensor.fqn, c.offsets);
  }
  for (Object& o : md.objects) o.storage = take(o.fqn, std::nullopt);
  for (const auto& [key, e] : entries)
    if (!e.used)
      fail("{}: a storage entry for {}, which state_dict_metadata does not list as such", name,
           key_text(key.first, key.second));
  return md;
}

Metadata read_metadata(const fs::path& dir) {
  const fs::path path = dir / kMetadataName;
  std::error_code ec;
  if (const uintmax_t size = fs::file_size(path, ec); !ec && size > kMaxMetadataBytes)
    fail("{}: {} bytes, more than the limit of {} for a DCP metadata file", path.string(), size,
         kMaxMetadataBytes);
  return parse_metadata(util::read_regular(path, "DCP metadata file"), path.string());
}

bool is_dcp_dir(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / kMetadataName, ec);
}

}  // namespace ckptfs::dcp
