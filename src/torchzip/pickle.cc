#include "ckptfs/torchzip/pickle.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <deque>
#include <memory>
#include <span>
#include <unordered_map>

#include "ckptfs/error.h"
#include "ckptfs/util/quote.h"
#include "ckptfs/util/view_reach.h"

namespace ckptfs::torchzip {

namespace {

constexpr std::array<DtypeInfo, 19> kDtypes{{
    {"float64", "DoubleStorage", "F64", 8},
    {"float32", "FloatStorage", "F32", 4},
    {"float16", "HalfStorage", "F16", 2},
    {"bfloat16", "BFloat16Storage", "BF16", 2},
    {"int64", "LongStorage", "I64", 8},
    {"int32", "IntStorage", "I32", 4},
    {"int16", "ShortStorage", "I16", 2},
    {"int8", "CharStorage", "I8", 1},
    {"uint8", "ByteStorage", "U8", 1},
    {"bool", "BoolStorage", "BOOL", 1},
    {"complex64", "ComplexFloatStorage", "C64", 8},
    {"complex128", "ComplexDoubleStorage", "C128", 16},
    {"uint16", "", "U16", 2},
    {"uint32", "", "U32", 4},
    {"uint64", "", "U64", 8},
    {"float8_e4m3fn", "", "F8_E4M3", 1},
    {"float8_e5m2", "", "F8_E5M2", 1},
    {"float8_e4m3fnuz", "", "F8_E4M3FNUZ", 1},
    {"float8_e5m2fnuz", "", "F8_E5M2FNUZ", 1},
}};

enum class Kind : uint8_t {
  None,
  Bool,
  Int,
  Float,
  Str,
  Bytes,
  List,
  Tuple,
  Dict,
  Set,
  Size,
  Global,
  Storage,
  Tensor,
  Device,
  Object  // DCP metadata only: an instance of an allowed class (objects_)
};

// What a global resolves to. Dtype and StorageClass carry an index into kDtypes.
enum class Fn : uint8_t {
  OrderedDict,
  RebuildV2,
  RebuildV3,
  RebuildOld,
  RebuildParameter,
  RebuildParameterWithState,
  RebuildFromType,
  Size,
  StorageClass,
  UntypedStorage,
  Dtype,
  TensorType,
  Device,
  CodecsEncode,
  // DCP metadata only (Allow::DcpMetadata): a dataclass made by NEWOBJ and filled by BUILD,
  // and the three objects made by REDUCE (an enum member, a layout, a path).
  DcpClass,
  DcpEnum,
  DcpEnumByName,  // builtins.getattr, allowed only as getattr(an allowed enum, a member's name)
  DcpLayout,
  DcpPath
};

struct Global {
  Fn fn;
  uint32_t dtype = 0;
  std::string name;  // module.name, for messages and the tree
};

struct Storage {
  std::string key;
  int32_t dtype = -1;  // -1: UntypedStorage
  uint64_t numel = 0;
  uint64_t bytes = 0;
};

// A container: list, tuple, set, Size (items) or dict (items as key, value, key, value...).
struct Container {
  std::vector<uint32_t> items;
  // Dicts with items: canonical key -> position of the key. Made on first use: most containers
  // are tuples, and an empty hash map costs more than the rest of the container.
  std::unique_ptr<std::unordered_map<std::string, size_t>> index;
  bool ordered = false;  // made by collections.OrderedDict
};

// A DCP metadata object: its class, and its state (BUILD) or its REDUCE arguments.
struct Object {
  std::string cls;              // module.name
  uint32_t state = UINT32_MAX;  // UINT32_MAX: no BUILD (yet)
  uint32_t args = UINT32_MAX;   // a tuple, for objects made by REDUCE
};

// The globals DCP's .metadata pickle uses (torch 2.6, Python 3.11), by module.
constexpr std::string_view kDcpMetadataModule = "torch.distributed.checkpoint.metadata";
// TensorProperties' memory format, an enum: its members by value.
constexpr std::array<std::string_view, 3> kDcpMemoryFormats{
    "TORCH_CONTIGUOUS_FORMAT", "TORCH_CHANNELS_LAST", "TORCH_PRESERVE_FORMAT"};
constexpr std::array<std::string_view, 7> kDcpMetadataClasses{
    "Metadata",      "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
    "MetadataIndex", "TensorProperties",      "StorageMeta"};
// Megatron-Core's torch_dist saves (spec §3.5) may add every rank's SavePlan to .metadata
// (all_local_plans, v0.11+), and v0.8-v0.15 pickle its Metadata and SavePlan subclasses.
constexpr std::string_view kDcpPlannerModule = "torch.distributed.checkpoint.planner";
constexpr std::array<std::string_view, 4> kDcpPlannerClasses{"SavePlan", "WriteItem",
                                                             "TensorWriteData", "BytesIOWriteData"};
// planner.WriteItemType's members by value.
constexpr std::array<std::string_view, 3> kDcpWriteItemTypes{"TENSOR", "SHARD", "BYTE_IO"};
constexpr std::string_view kMcoreModule = "megatron.core.dist_checkpointing.strategies.torch";
constexpr std::array<std::string_view, 2> kMcoreClasses{"MCoreMetadata", "MCoreSavePlan"};

struct Value {
  Kind kind;
  uint64_t payload;  // int bits, double bits, bool, or an index into the matching table
};

// What the machine charges against its memory budget for each thing it keeps: its bytes with
// the allocator's rounding, and for what lives in a growing vector, the spare room and the copy
// it holds while it moves. Measured against peak RSS (scripts/bench_parsers.py), the charges run a
// little above what a real state_dict's pickle makes the process hold.
constexpr uint64_t kValueCost = sizeof(Value);          // reserved up front: never copied to grow
constexpr uint64_t kContainerCost = sizeof(Container);  // in a deque: no spare room
constexpr uint64_t kItemCost = 3 * sizeof(uint32_t);    // a vector moving to twice its size
constexpr uint64_t kStringCost = 3 * sizeof(std::string);    // plus its length
constexpr uint64_t kHashEntryCost = 80;                      // node, bucket, key object
constexpr uint64_t kTensorCost = 3 * sizeof(PickledTensor);  // plus its dimensions' bytes
// The result tree: a JSON value in its parent; for strings their text; for the containers the
// tree writes as {"$dict": [...]}-style objects, that object's map and node; for each dict item,
// its [key, value] array.
constexpr uint64_t kTreeScalarCost = 32;
constexpr uint64_t kTreeStringCost = 64;  // plus its length (twice for bytes, written in hex)
constexpr uint64_t kTreeContainerCost = 160;
constexpr uint64_t kTreePairCost = 64;

class Machine {
 public:
  Machine(std::string_view data, const std::string& name, const RecordSize& record_size,
          Allow allow)
      : data_(data),
        name_(name),
        record_size_(record_size),
        allow_(allow),
        budget_(kMemoryFloor + kMemoryPerByte * data.size()) {
    // Every opcode makes at most one value: room for all of them costs address space only, and
    // spares the copies a doubling vector makes (three times its size while it moves).
    values_.reserve(std::min<size_t>(data.size(), kMaxObjects));
  }

  Unpickled run() {
    Unpickled out;
    for (;;) {
      if (pos_ >= data_.size()) error("the pickle ends without STOP");
      op_at_ = pos_;
      const uint8_t op = static_cast<uint8_t>(data_[pos_++]);
      if (op == '.') break;
      step(op, out);
    }
    if (stack_.size() != 1 || !marks_.empty())
      error("STOP with {} values and {} marks on the stack, expected one value and none",
            stack_.size(), marks_.size());
    Tree tree{*this, out, {}, 0};
    out.tree = tree.convert(stack_.back(), 0);
    return out;
  }

 private:
  template <typename... Args>
  [[noreturn]] void error(fmt::format_string<Args...> format, Args&&... args) const {
    fail("{}: {} byte offset {}: {}", name_, allow_ == Allow::TorchSave ? "data.pkl" : "pickle",
         op_at_, fmt::format(format, std::forward<Args>(args)...));
  }

  // The largest number a message may quote (ckptfs/util/quote.h): the pickle's bytes and a
  // storage record's are both in the archive, which is at least as large as either.
  uint64_t quote_bound(uint64_t record_bytes) const {
    return std::max<uint64_t>(data_.size(), record_bytes);
  }

  // --- reading arguments ---
  const char* take(uint64_t n) {
    if (n > data_.size() - pos_)
      error("an argument of {} bytes runs past the pickle's end", file_number(n, data_.size()));
    const char* p = data_.data() + pos_;
    pos_ += n;
    return p;
  }
  uint64_t le(unsigned n) {
    const char* p = take(n);
    uint64_t v = 0;
    for (unsigned i = 0; i < n; ++i) v |= uint64_t{static_cast<uint8_t>(p[i])} << (8 * i);
    return v;
  }
  std::string_view line() {
    const size_t end = data_.find('\n', pos_);
    if (end == std::string_view::npos || end - pos_ > 1024) error("GLOBAL without a short line");
    std::string_view s = data_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }

  // --- memory ---
  // Every object, string, item and tree node is charged as it is made, so a pickle that would
  // take memory out of proportion to its own size (a byte per empty dict, a few hundred bytes
  // each once held) is refused early, whatever it holds.
  void charge(uint64_t bytes) {
    used_ += bytes;
    if (used_ > budget_)
      error(
          "its objects would take more than {} MiB of memory, the limit for a pickle of {} "
          "bytes ({} MiB + {} bytes per byte); the file is damaged or not a torch.save "
          "checkpoint, and is not read",
          budget_ >> 20, data_.size(), kMemoryFloor >> 20, kMemoryPerByte);
  }

  // --- values ---
  uint32_t make(Kind kind, uint64_t payload = 0) {
    if (values_.size() >= kMaxObjects) error("more than {} objects", kMaxObjects);
    charge(kValueCost);
    values_.push_back({kind, payload});
    return static_cast<uint32_t>(values_.size() - 1);
  }
  uint32_t make_string(Kind kind, std::string s) {
    charge(kStringCost + s.size());
    strings_.push_back(std::move(s));
    return make(kind, strings_.size() - 1);
  }
  uint32_t make_container(Kind kind, std::vector<uint32_t> items = {}) {
    charge(kContainerCost + kItemCost * items.size());
    containers_.emplace_back().items = std::move(items);
    return make(kind, containers_.size() - 1);
  }
  void add_items(uint32_t id, std::span<const uint32_t> items) {
    charge(kItemCost * items.size());
    auto& dst = box(id).items;
    dst.insert(dst.end(), items.begin(), items.end());
  }
  const Value& v(uint32_t id) const { return values_[id]; }
  Container& box(uint32_t id) { return containers_[v(id).payload]; }
  const std::string& str(uint32_t id) const { return strings_[v(id).payload]; }
  bool is(uint32_t id, Kind kind) const { return v(id).kind == kind; }

  void push(uint32_t id) {
    if (stack_.size() >= kMaxStack) error("stack deeper than {}", kMaxStack);
    stack_.push_back(id);
  }
  uint32_t pop() {
    if (stack_.size() <= floor()) error("pop from an empty stack");
    const uint32_t id = stack_.back();
    stack_.pop_back();
    return id;
  }
  uint32_t& top() {
    if (stack_.size() <= floor()) error("no value on the stack");
    return stack_.back();
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  std::vector<uint32_t> pop_mark() {
    if (marks_.empty()) error("no MARK to pop to");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<uint32_t> items(stack_.begin() + static_cast<ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return items;
  }

  std::string utf8(const char* p, uint64_t n) {
    std::string s(p, n);
    // Well-formed UTF-8: no overlongs, surrogates or code points past U+10FFFF.
    for (size_t i = 0; i < n;) {
      const auto c = static_cast<uint8_t>(s[i]);
      size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
      if (len == 0 || i + len > n) error("a string that is not valid UTF-8");
      uint32_t cp = len == 1 ? c : c & (0x7F >> len);
      for (size_t k = 1; k < len; ++k) {
        const auto d = static_cast<uint8_t>(s[i + k]);
        if ((d & 0xC0) != 0x80) error("a string that is not valid UTF-8");
        cp = (cp << 6) | (d & 0x3F);
      }
      static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
      if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        error("a string that is not valid UTF-8");
      i += len;
    }
    return s;
  }

  uint32_t int_value(int64_t x) { return make(Kind::Int, static_cast<uint64_t>(x)); }
  uint32_t long_value(uint64_t n) {
    if (n > 8)
      error("an integer of {} bytes; only 64-bit integers are supported",
            file_number(n, data_.size()));
    const char* p = take(n);
    uint64_t u = 0;
    for (uint64_t i = 0; i < n; ++i) u |= uint64_t{static_cast<uint8_t>(p[i])} << (8 * i);
    if (n > 0 && n < 8 && (static_cast<uint8_t>(p[n - 1]) & 0x80)) u |= ~uint64_t{0} << (8 * n);
    return int_value(static_cast<int64_t>(u));
  }

  // --- dict keys ---
  // A canonical byte string per hashable value, so equal keys (as Python compares them, for
  // the types a checkpoint uses) collide. Tuples cache theirs.
  std::string key_of(uint32_t id, size_t depth = 0) {
    if (depth > 16) error("a dict key nested deeper than 16");
    const Value& x = v(id);
    // fmt, not "i" + std::to_string(...): GCC 12 warns (-Wrestrict) on those inlined inserts.
    switch (x.kind) {
      case Kind::None:
        return "n";
      case Kind::Bool:  // True == 1 as a key, as in Python
      case Kind::Int:
        return fmt::format("i{}", static_cast<int64_t>(x.payload));
      case Kind::Float: {
        const double d = std::bit_cast<double>(x.payload);
        if (d == std::floor(d) && std::fabs(d) < 9.2e18)
          return fmt::format("i{}", static_cast<int64_t>(d));
        return fmt::format("f{}", x.payload);
      }
      case Kind::Str:
        return fmt::format("s{}:{}", str(id).size(), str(id));
      case Kind::Bytes:
        return fmt::format("b{}:{}", str(id).size(), str(id));
      case Kind::Global:
        return "g" + globals_[x.payload].name;
      case Kind::Object:  // frozen dataclasses (MetadataIndex): two equal ones stay two keys
        return fmt::format("o{}", id);
      case Kind::Tuple:
      case Kind::Size: {
        auto it = key_cache_.find(id);
        if (it != key_cache_.end()) return it->second;
        std::string k = fmt::format("t{}(", box(id).items.size());
        for (uint32_t item : box(id).items) {
          k += key_of(item, depth + 1);
          k += ',';
          if (k.size() > (uint64_t{1} << 20)) error("a dict key longer than 1 MiB");
        }
        k += ')';
        charge(kHashEntryCost + k.size());
        return key_cache_.emplace(id, std::move(k)).first->second;
      }
      default:
        error("an unhashable dict key");
    }
  }

  void set_item(uint32_t dict, uint32_t key, uint32_t value) {
    if (!is(dict, Kind::Dict)) error("SETITEM(S) on something that is not a dict");
    Container& d = box(dict);
    if (!d.index) d.index = std::make_unique<std::unordered_map<std::string, size_t>>();
    auto [it, inserted] = d.index->try_emplace(key_of(key), d.items.size());
    if (inserted) {
      charge(kHashEntryCost + it->first.size() + 2 * kItemCost);
      d.items.push_back(key);
      d.items.push_back(value);
    } else {
      d.items[it->second + 1] = value;  // a repeated key keeps its place, takes the new value
    }
  }

  // --- globals ---
  uint32_t global(std::string_view module, std::string_view name) {
    const std::string full = fmt::format("{}.{}", module, name);
    auto make_global = [&](Fn fn, uint32_t dtype = 0) {
      charge(kStringCost + full.size());
      globals_.push_back({fn, dtype, full});
      return make(Kind::Global, globals_.size() - 1);
    };
    if (allow_ == Allow::DcpMetadata) {
      if (module == kDcpMetadataModule) {
        for (std::string_view cls : kDcpMetadataClasses)
          if (name == cls) return make_global(Fn::DcpClass);
        if (name == "_MEM_FORMAT_ENCODING") return make_global(Fn::DcpEnum);
      }
      if (module == "torch.distributed.checkpoint.filesystem" &&
          (name == "_StorageInfo" || name == "_StoragePrefix"))
        return make_global(Fn::DcpClass);
      if (module == kDcpPlannerModule) {
        for (std::string_view cls : kDcpPlannerClasses)
          if (name == cls) return make_global(Fn::DcpClass);
        if (name == "WriteItemType") return make_global(Fn::DcpEnum);
      }
      if (module == kMcoreModule)
        for (std::string_view cls : kMcoreClasses)
          if (name == cls) return make_global(Fn::DcpClass);
      if (module == "torch.serialization" && name == "_get_layout")
        return make_global(Fn::DcpLayout);
      if (module == "pathlib" && name == "PosixPath") return make_global(Fn::DcpPath);
      // Python 3.11.2 (Debian 12's) pickles an enum member as getattr(its class, its name).
      if (module == "builtins" && name == "getattr") return make_global(Fn::DcpEnumByName);
      if (module == "torch") {
        if (name == "Size") return make_global(Fn::Size);
        for (uint32_t i = 0; i < kDtypes.size(); ++i)
          if (name == kDtypes[i].torch_name) return make_global(Fn::Dtype, i);
      }
      error(
          "unsupported object {} (a DCP .metadata holds only DCP's metadata and save-plan "
          "classes, Megatron-Core's MCoreMetadata and MCoreSavePlan, torch.Size, dtypes, a "
          "layout and a path; nothing is executed)",
          file_text(full));
    }
    if (module == "collections" && name == "OrderedDict") return make_global(Fn::OrderedDict);
    if (module == "torch._utils") {
      if (name == "_rebuild_tensor_v2") return make_global(Fn::RebuildV2);
      if (name == "_rebuild_tensor_v3") return make_global(Fn::RebuildV3);
      if (name == "_rebuild_tensor") return make_global(Fn::RebuildOld);
      if (name == "_rebuild_parameter") return make_global(Fn::RebuildParameter);
      if (name == "_rebuild_parameter_with_state")
        return make_global(Fn::RebuildParameterWithState);
    }
    if (module == "torch._tensor" && name == "_rebuild_from_type_v2")
      return make_global(Fn::RebuildFromType);
    if (module == "torch") {
      if (name == "Size") return make_global(Fn::Size);
      if (name == "Tensor") return make_global(Fn::TensorType);
      if (name == "device") return make_global(Fn::Device);
      if (name == "UntypedStorage") return make_global(Fn::UntypedStorage);
      for (uint32_t i = 0; i < kDtypes.size(); ++i) {
        if (name == kDtypes[i].torch_name) return make_global(Fn::Dtype, i);
        if (!kDtypes[i].storage_class.empty() && name == kDtypes[i].storage_class)
          return make_global(Fn::StorageClass, i);
      }
    }
    if (module == "torch.storage" && name == "UntypedStorage")
      return make_global(Fn::UntypedStorage);
    if (module == "torch.nn.parameter" && name == "Parameter") return make_global(Fn::TensorType);
    if (module == "_codecs" && name == "encode") return make_global(Fn::CodecsEncode);
    error(
        "unsupported object {} (only tensors, torch.Size, dtypes and plain containers and "
        "scalars are read; nothing is executed)",
        file_text(full));
  }
  const Global& as_global(uint32_t id) const { return globals_[v(id).payload]; }

  // --- persistent ids: ('storage', class, key, location, numel) ---
  uint32_t storage(uint32_t pid) {
    if (!is(pid, Kind::Tuple)) error("BINPERSID of something that is not a tuple");
    const std::vector<uint32_t> t = box(pid).items;
    if (t.size() != 5 || !is(t[0], Kind::Str) || str(t[0]) != "storage" ||
        !is(t[1], Kind::Global) || !is(t[2], Kind::Str) || !is(t[3], Kind::Str) ||
        !is(t[4], Kind::Int))
      error("a persistent id that is not ('storage', class, key, location, numel)");
    const Global& cls = as_global(t[1]);
    if (cls.fn != Fn::StorageClass && cls.fn != Fn::UntypedStorage)
      error("a persistent id naming {}, not a storage class", file_text(cls.name));
    const int32_t dtype = cls.fn == Fn::StorageClass ? static_cast<int32_t>(cls.dtype) : -1;
    const std::string& key = str(t[2]);
    const auto numel = static_cast<int64_t>(v(t[4]).payload);
    if (numel < 0) error("storage {} has a negative size", file_text(key));
    auto found = storage_ids_.find(key);
    if (found != storage_ids_.end()) {
      const Storage& s = storages_[found->second];
      if (s.dtype != dtype || s.numel != static_cast<uint64_t>(numel))
        error("storage {} is referenced with two different types or sizes", file_text(key));
      return make(Kind::Storage, found->second);
    }
    const std::optional<uint64_t> bytes = record_size_(key);
    if (!bytes)
      error("storage {} has no record {} in the archive", file_text(key), file_text("data/" + key));
    const unsigned __int128 need =
        static_cast<unsigned __int128>(numel) * (dtype < 0 ? 1 : kDtypes[dtype].element_size);
    if (need != *bytes)
      error("storage {} ({} of {} elements) needs {} bytes but record {} holds {}", file_text(key),
            dtype < 0 ? "UntypedStorage" : kDtypes[dtype].storage_class,
            file_number(static_cast<uint64_t>(numel), quote_bound(*bytes)),
            file_number(static_cast<uint64_t>(std::min<unsigned __int128>(need, UINT64_MAX)),
                        quote_bound(*bytes)),
            file_text("data/" + key), *bytes);
    charge(2 * (kHashEntryCost + key.size()));
    storages_.push_back({key, dtype, static_cast<uint64_t>(numel), *bytes});
    storage_ids_.emplace(key, storages_.size() - 1);
    return make(Kind::Storage, storages_.size() - 1);
  }

  // --- calls ---
  std::vector<int64_t> ints(uint32_t id, const char* what) {
    if (!is(id, Kind::Tuple) && !is(id, Kind::Size) && !is(id, Kind::List))
      error("{} is not a tuple of integers", what);
    std::vector<int64_t> out;
    for (uint32_t item : box(id).items) {
      if (!is(item, Kind::Int)) error("{} is not a tuple of integers", what);
      out.push_back(static_cast<int64_t>(v(item).payload));
    }
    return out;
  }

  uint32_t tensor(const std::vector<uint32_t>& a, size_t argc, int dtype_arg, const char* fn) {
    if (!is(a[0], Kind::Storage)) error("{}: the first argument is not a storage", fn);
    const Storage& s = storages_[v(a[0]).payload];
    if (!is(a[1], Kind::Int)) error("{}: the storage offset is not an integer", fn);
    const auto offset = static_cast<int64_t>(v(a[1]).payload);
    PickledTensor t;
    t.storage_key = s.key;
    t.shape = ints(a[2], "the tensor's size");
    t.stride = ints(a[3], "the tensor's stride");
    if (argc > 4 && is(a[4], Kind::Bool)) t.requires_grad = v(a[4]).payload != 0;
    uint32_t dtype;
    if (dtype_arg >= 0) {
      if (!is(a[dtype_arg], Kind::Global) || as_global(a[dtype_arg]).fn != Fn::Dtype)
        error("{}: the dtype argument is not a torch dtype", fn);
      dtype = as_global(a[dtype_arg]).dtype;
    } else {
      if (s.dtype < 0)
        error("{}: storage {} is untyped but no dtype is given", fn, file_text(s.key));
      dtype = static_cast<uint32_t>(s.dtype);
    }
    t.dtype = &kDtypes[dtype];
    if (offset < 0) error("tensor on storage {}: negative storage offset", file_text(s.key));
    if (t.shape.size() != t.stride.size())
      error("tensor on storage {}: size has {} dimensions, stride {}", file_text(s.key),
            t.shape.size(), t.stride.size());
    for (size_t k = 0; k < t.shape.size(); ++k)
      if (t.shape[k] < 0 || t.stride[k] < 0)
        error("tensor on storage {}: negative size or stride", file_text(s.key));
    const std::optional<ViewReach> reach =
        view_reach(t.shape, t.stride, static_cast<uint64_t>(offset), t.dtype->element_size);
    if (!reach) error("tensor on storage {}: too many elements", file_text(s.key));
    if (reach->end > s.bytes)
      error(
          "tensor on storage {} (offset {}, size {}, stride {}) reaches past the {} bytes "
          "of record {}",
          file_text(s.key), file_number(static_cast<uint64_t>(offset), quote_bound(s.bytes)),
          file_shape(t.shape, quote_bound(s.bytes)), file_shape(t.stride, quote_bound(s.bytes)),
          s.bytes, file_text("data/" + s.key));
    t.storage_offset = static_cast<uint64_t>(offset);
    charge(kTensorCost + s.key.size() + 16 * t.shape.size());
    tensors_.push_back(std::move(t));
    return make(Kind::Tensor, tensors_.size() - 1);
  }

  uint32_t call(uint32_t callable, uint32_t args_id) {
    if (!is(callable, Kind::Global)) error("REDUCE on something that is not an allowed global");
    if (!is(args_id, Kind::Tuple)) error("REDUCE with arguments that are not a tuple");
    const Global g = as_global(callable);
    const std::vector<uint32_t> a = box(args_id).items;
    const size_t n = a.size();
    auto bad = [&]() -> uint32_t { error("{} called with unexpected arguments", g.name); };
    switch (g.fn) {
      case Fn::OrderedDict: {
        const uint32_t d = make_container(Kind::Dict);
        box(d).ordered = true;
        if (n == 0) return d;
        if (n != 1 || !is(a[0], Kind::List)) return bad();
        const std::vector<uint32_t> pairs = box(a[0]).items;
        for (uint32_t p : pairs) {
          if (!is(p, Kind::Tuple) || box(p).items.size() != 2) return bad();
          set_item(d, box(p).items[0], box(p).items[1]);
        }
        return d;
      }
      case Fn::RebuildV2:
        if (n != 6 && n != 7) return bad();
        return tensor(a, n, -1, "_rebuild_tensor_v2");
      case Fn::RebuildV3:
        if (n != 7 && n != 8) return bad();
        return tensor(a, n, 6, "_rebuild_tensor_v3");
      case Fn::RebuildOld:
        if (n != 4) return bad();
        return tensor(a, n, -1, "_rebuild_tensor");
      case Fn::RebuildParameter:
      case Fn::RebuildParameterWithState:
        if (n != (g.fn == Fn::RebuildParameter ? 3u : 4u) || !is(a[0], Kind::Tensor)) return bad();
        return a[0];
      case Fn::RebuildFromType: {
        // (func, type, args, state): a tensor subclass; only plain tensors and parameters.
        if (n != 4 || !is(a[0], Kind::Global) || !is(a[1], Kind::Global) ||
            as_global(a[1]).fn != Fn::TensorType)
          return bad();
        const Fn inner = as_global(a[0]).fn;
        if (inner != Fn::RebuildV2 && inner != Fn::RebuildV3 && inner != Fn::RebuildOld &&
            inner != Fn::RebuildParameter)
          return bad();
        return call(a[0], a[2]);
      }
      case Fn::Size: {
        if (n != 1) return bad();
        ints(a[0], "torch.Size's argument");
        return make_container(Kind::Size, box(a[0]).items);
      }
      case Fn::Device:
        if (n < 1 || n > 2 || !is(a[0], Kind::Str)) return bad();
        return make_string(Kind::Device, n == 2 && is(a[1], Kind::Int)
                                             ? fmt::format("{}:{}", str(a[0]),
                                                           static_cast<int64_t>(v(a[1]).payload))
                                             : str(a[0]));
      case Fn::CodecsEncode: {
        // Protocol 2 pickles bytes as _codecs.encode(latin-1 text, 'latin1').
        if (n != 2 || !is(a[0], Kind::Str) || !is(a[1], Kind::Str) || str(a[1]) != "latin1")
          return bad();
        std::string bytes;
        const std::string& s = str(a[0]);
        for (size_t i = 0; i < s.size(); ++i) {
          const auto c = static_cast<uint8_t>(s[i]);
          if (c < 0x80) {
            bytes += static_cast<char>(c);
          } else if (c == 0xC2 || c == 0xC3) {
            bytes += static_cast<char>(((c & 0x03) << 6) | (static_cast<uint8_t>(s[++i]) & 0x3F));
          } else {
            return bad();
          }
        }
        return make_string(Kind::Bytes, std::move(bytes));
      }
      case Fn::DcpEnum:
        if (n != 1 || !is(a[0], Kind::Int)) return bad();
        return make_object(g.name, args_id);
      case Fn::DcpEnumByName: {
        // Made as the value form above: the enum's class with its member's value.
        if (n != 2 || !is(a[0], Kind::Global) || as_global(a[0]).fn != Fn::DcpEnum ||
            !is(a[1], Kind::Str))
          return bad();
        const bool write_item = as_global(a[0]).name.starts_with(kDcpPlannerModule);
        const std::span<const std::string_view> members =
            write_item ? std::span<const std::string_view>(kDcpWriteItemTypes)
                       : std::span<const std::string_view>(kDcpMemoryFormats);
        const auto member = std::find(members.begin(), members.end(), str(a[1]));
        if (member == members.end()) return bad();
        // WriteItemType numbers its members from 1 (enum.auto), _MEM_FORMAT_ENCODING from 0.
        const uint32_t value = int_value(member - members.begin() + (write_item ? 1 : 0));
        return make_object(as_global(a[0]).name, make_container(Kind::Tuple, {value}));
      }
      case Fn::DcpLayout:
        if (n != 1 || !is(a[0], Kind::Str)) return bad();
        return make_object(g.name, args_id);
      case Fn::DcpPath:
        for (uint32_t part : a)
          if (!is(part, Kind::Str)) return bad();
        return make_object(g.name, args_id);
      default:
        error("{} cannot be called", g.name);
    }
  }

  uint32_t make_object(const std::string& cls, uint32_t args) {
    charge(sizeof(Object) + cls.size());
    objects_.push_back({cls, UINT32_MAX, args});
    return make(Kind::Object, objects_.size() - 1);
  }

  // --- the dispatch loop ---
  void step(uint8_t op, Unpickled& out) {
    switch (op) {
      case 0x80: {  // PROTO
        out.protocol = static_cast<int>(le(1));
        if (out.protocol > 5) error("pickle protocol {} is not supported", out.protocol);
        return;
      }
      case 0x95:  // FRAME
        le(8);
        return;
      case 'c': {  // GLOBAL
        const std::string module(line());
        const std::string name(line());
        return push(global(module, name));
      }
      case 0x93: {  // STACK_GLOBAL
        const uint32_t name = pop(), module = pop();
        if (!is(name, Kind::Str) || !is(module, Kind::Str))
          error("STACK_GLOBAL of values that are not strings");
        return push(global(str(module), str(name)));
      }
      case 'q':
        return memo_put(le(1));
      case 'r':
        return memo_put(le(4));
      case 0x94:
        return memo_put(memo_count_);
      case 'h':
        return memo_get(le(1));
      case 'j':
        return memo_get(le(4));
      case '(':
        if (marks_.size() >= kMaxMarks) error("more than {} nested MARKs", kMaxMarks);
        marks_.push_back(stack_.size());
        return;
      case ')':
        return push(make_container(Kind::Tuple));
      case 0x85:
      case 0x86:
      case 0x87: {
        std::vector<uint32_t> items(op - 0x84);
        for (size_t i = items.size(); i-- > 0;) items[i] = pop();
        return push(make_container(Kind::Tuple, std::move(items)));
      }
      case 't':
        return push(make_container(Kind::Tuple, pop_mark()));
      case ']':
        return push(make_container(Kind::List));
      case '}':
        return push(make_container(Kind::Dict));
      case 0x8F:
        return push(make_container(Kind::Set));
      case 'a': {
        const uint32_t item = pop();
        if (!is(top(), Kind::List)) error("APPEND to something that is not a list");
        return add_items(top(), {&item, 1});
      }
      case 'e':
      case 0x90: {  // APPENDS, ADDITEMS
        std::vector<uint32_t> items = pop_mark();
        if (!is(top(), op == 'e' ? Kind::List : Kind::Set))
          error("{} to something that is not a {}", op == 'e' ? "APPENDS" : "ADDITEMS",
                op == 'e' ? "list" : "set");
        return add_items(top(), items);
      }
      case 's': {
        const uint32_t value = pop(), key = pop();
        return set_item(top(), key, value);
      }
      case 'u': {
        std::vector<uint32_t> items = pop_mark();
        if (items.size() % 2 != 0) error("SETITEMS with an odd number of items");
        const uint32_t dict = top();
        for (size_t i = 0; i < items.size(); i += 2) set_item(dict, items[i], items[i + 1]);
        return;
      }
      case 'N':
        return push(make(Kind::None));
      case 0x88:
        return push(make(Kind::Bool, 1));
      case 0x89:
        return push(make(Kind::Bool, 0));
      case 'K':
        return push(int_value(static_cast<int64_t>(le(1))));
      case 'M':
        return push(int_value(static_cast<int64_t>(le(2))));
      case 'J':
        return push(int_value(static_cast<int32_t>(static_cast<uint32_t>(le(4)))));
      case 0x8A:
        return push(long_value(le(1)));
      case 0x8B:
        return push(long_value(le(4)));
      case 'G': {
        const char* p = take(8);
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<uint8_t>(p[i]);
        return push(make(Kind::Float, bits));
      }
      case 'X':
      case 0x8C:
      case 0x8D: {
        const uint64_t n = le(op == 0x8C ? 1 : op == 'X' ? 4 : 8);
        const char* p = take(n);
        return push(make_string(Kind::Str, utf8(p, n)));
      }
      case 'C':
      case 'B': {
        const uint64_t n = le(op == 'C' ? 1 : 4);
        const char* p = take(n);
        return push(make_string(Kind::Bytes, std::string(p, n)));
      }
      case 'Q':
        return push(storage(pop()));
      case 'R': {
        const uint32_t args = pop();
        uint32_t& callable = top();
        callable = call(callable, args);
        return;
      }
      case 0x81: {  // NEWOBJ: cls.__new__(cls, *args), for DCP's dataclasses only
        if (allow_ != Allow::DcpMetadata) break;
        const uint32_t args = pop();
        const uint32_t cls = pop();
        if (!is(cls, Kind::Global) || as_global(cls).fn != Fn::DcpClass)
          error("NEWOBJ of something that is not an allowed class");
        if (!is(args, Kind::Tuple) || !box(args).items.empty())
          error("NEWOBJ of {} with arguments", as_global(cls).name);
        return push(make_object(as_global(cls).name, UINT32_MAX));
      }
      case 'b': {
        const uint32_t state = pop();
        const uint32_t target = top();
        if (allow_ == Allow::DcpMetadata) {
          // A dataclass's __dict__ (or TensorProperties' tuple), set once.
          if (!is(target, Kind::Object) || objects_[v(target).payload].args != UINT32_MAX ||
              objects_[v(target).payload].state != UINT32_MAX ||
              !(is(state, Kind::Dict) || is(state, Kind::Tuple)))
            error("BUILD is only accepted once on an object of a DCP metadata class");
          objects_[v(target).payload].state = state;
          return;
        }
        // state_dict()'s _metadata: an attribute of the OrderedDict, not an item.
        if (!is(target, Kind::Dict) || !box(target).ordered ||
            !(is(state, Kind::Dict) || is(state, Kind::None) || is(state, Kind::Tuple)))
          error("BUILD is only accepted on an OrderedDict");
        return;
      }
      default:
        break;
    }
    error("opcode 0x{:02X} is not accepted (nothing in a pickle is executed)", op);
  }

  // Pickles number memo entries 0, 1, 2...: those live in a vector (4 bytes each, where a
  // hash map took 40, for several entries per tensor); an index out of that order goes to a
  // hash map, so a crafted index cannot size the vector.
  void memo_put(uint64_t index) {
    const uint32_t value = top();
    if (index < memo_dense_.size()) {
      memo_dense_[index] = value;
      return;
    }
    const bool dense = index == memo_dense_.size() && !memo_sparse_.contains(index);
    if (dense || !memo_sparse_.contains(index)) {
      if (memo_count_ >= kMaxStack) error("memo larger than {}", kMaxStack);
      ++memo_count_;
      charge(dense ? kItemCost : kHashEntryCost);
    }
    if (dense)
      memo_dense_.push_back(value);
    else
      memo_sparse_[index] = value;
  }
  void memo_get(uint64_t index) {
    if (index < memo_dense_.size()) return push(memo_dense_[index]);
    auto it = memo_sparse_.find(index);
    if (it == memo_sparse_.end()) error("memo entry {} was never stored", index);
    push(it->second);
  }

  // The result as JSON, tensors numbered by occurrence, depth and total work capped.
  struct Tree {
    Machine& m;
    Unpickled& out;
    std::vector<std::string> path;
    size_t visited = 0;

    std::string key_text(uint32_t id) {
      const Value& x = m.v(id);
      switch (x.kind) {
        case Kind::Str:
          return m.str(id);
        case Kind::Int:
          return std::to_string(static_cast<int64_t>(x.payload));
        case Kind::Bool:
          return x.payload ? "True" : "False";
        case Kind::None:
          return "None";
        case Kind::Tuple: {
          std::string s = "(";
          const auto& items = m.box(id).items;
          for (size_t i = 0; i < items.size(); ++i) {
            if (i) s += ',';
            s += key_text(items[i]);
          }
          return s + ")";
        }
        default:
          return fmt::format("<{}>", static_cast<int>(x.kind));
      }
    }

    nlohmann::json items_json(uint32_t id, size_t depth, bool indexed) {
      nlohmann::json a = nlohmann::json::array();
      const std::vector<uint32_t>& items = m.box(id).items;
      for (size_t i = 0; i < items.size(); ++i) {
        if (indexed) path.push_back(std::to_string(i));
        a.push_back(convert(items[i], depth + 1));
        if (indexed) path.pop_back();
      }
      return a;
    }

    nlohmann::json convert(uint32_t id, size_t depth) {
      if (depth > kMaxDepth) m.error("the object is nested deeper than {}", kMaxDepth);
      // Shared parts are expanded once per path: a few times the object count in real files,
      // 2^n for a crafted chain of n doublings.
      const size_t limit = std::max<size_t>(1'000'000, 4 * m.values_.size());
      if (++visited > limit) m.error("the object has more than {} parts once expanded", limit);
      const Value& x = m.v(id);
      switch (x.kind) {
        case Kind::Str:
        case Kind::Bytes:
        case Kind::Device:
          m.charge(kTreeStringCost + (x.kind == Kind::Bytes ? 2 : 1) * m.str(id).size());
          break;
        case Kind::Float:
        case Kind::Global:
        case Kind::List:
        case Kind::Tuple:
        case Kind::Set:
        case Kind::Size:
        case Kind::Dict:
        case Kind::Tensor:
        case Kind::Object:
          m.charge(kTreeContainerCost);
          break;
        default:
          m.charge(kTreeScalarCost);
      }
      switch (x.kind) {
        case Kind::None:
          return nullptr;
        case Kind::Bool:
          return x.payload != 0;
        case Kind::Int:
          return static_cast<int64_t>(x.payload);
        case Kind::Float:
          return {{"$float", python_float_hex(std::bit_cast<double>(x.payload))}};
        case Kind::Str:
          return m.str(id);
        case Kind::Bytes: {
          std::string hex;
          for (char c : m.str(id)) hex += fmt::format("{:02x}", static_cast<uint8_t>(c));
          return {{"$bytes", hex}};
        }
        case Kind::Device:
          return {{"$device", m.str(id)}};
        case Kind::List:
          return items_json(id, depth, true);
        case Kind::Tuple:
          return {{"$tuple", items_json(id, depth, true)}};
        case Kind::Set:
          return {{"$set", items_json(id, depth, false)}};
        case Kind::Size:
          return {{"$size", items_json(id, depth, false)}};
        case Kind::Dict: {
          nlohmann::json pairs = nlohmann::json::array();
          const std::vector<uint32_t>& items = m.box(id).items;
          for (size_t i = 0; i + 1 < items.size(); i += 2) {
            m.charge(kTreePairCost);
            nlohmann::json key = convert(items[i], depth + 1);
            path.push_back(key_text(items[i]));
            pairs.push_back(
                nlohmann::json::array({std::move(key), convert(items[i + 1], depth + 1)}));
            path.pop_back();
          }
          return {{"$dict", std::move(pairs)}};
        }
        case Kind::Global:
          return {{"$global", m.as_global(id).name}};
        case Kind::Object: {
          const Object& o = m.objects_[x.payload];
          nlohmann::json j = {{"$object", o.cls}};
          if (o.state != UINT32_MAX) j["state"] = convert(o.state, depth + 1);
          if (o.args != UINT32_MAX) j["args"] = items_json(o.args, depth, false);
          return j;
        }
        case Kind::Storage:
          m.error("a bare storage ({}) outside a tensor is not supported",
                  m.storages_[x.payload].key);
        case Kind::Tensor: {
          PickledTensor t = m.tensors_[x.payload];
          std::string name;
          for (size_t i = 0; i < path.size(); ++i) {
            if (i) name += '/';
            name += path[i];
          }
          t.path = std::move(name);
          out.tensors.push_back(std::move(t));
          return {{"$tensor", out.tensors.size() - 1}};
        }
      }
      return nullptr;
    }
  };

  std::string_view data_;
  const std::string& name_;
  const RecordSize& record_size_;
  const Allow allow_;
  size_t pos_ = 0;
  size_t op_at_ = 0;
  std::vector<Value> values_;
  std::vector<std::string> strings_;
  std::deque<Container> containers_;  // a deque: references stay valid as it grows
  std::vector<Global> globals_;
  std::vector<Object> objects_;
  std::vector<Storage> storages_;
  std::unordered_map<std::string, size_t> storage_ids_;
  std::vector<PickledTensor> tensors_;
  std::unordered_map<uint32_t, std::string> key_cache_;
  std::vector<uint32_t> stack_;
  std::vector<size_t> marks_;
  std::vector<uint32_t> memo_dense_;
  std::unordered_map<uint64_t, uint32_t> memo_sparse_;
  size_t memo_count_ = 0;
  const uint64_t budget_;  // bytes
  uint64_t used_ = 0;
};

}  // namespace

const DtypeInfo* dtype_by_code(std::string_view code) {
  for (const DtypeInfo& d : kDtypes)
    if (d.code == code) return &d;
  return nullptr;
}

const DtypeInfo* dtype_by_torch_name(std::string_view torch_name) {
  for (const DtypeInfo& d : kDtypes)
    if (d.torch_name == torch_name) return &d;
  return nullptr;
}

std::string python_float_hex(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  const uint64_t bits = std::bit_cast<uint64_t>(v);
  const bool negative = bits >> 63;
  const int exponent = static_cast<int>((bits >> 52) & 0x7FF);
  const uint64_t mantissa = bits & ((uint64_t{1} << 52) - 1);
  const char* sign = negative ? "-" : "";
  if (exponent == 0 && mantissa == 0) return fmt::format("{}0x0.0p+0", sign);
  if (exponent == 0) return fmt::format("{}0x0.{:013x}p-1022", sign, mantissa);
  const int e = exponent - 1023;
  return fmt::format("{}0x1.{:013x}p{}{}", sign, mantissa, e < 0 ? "-" : "+", std::abs(e));
}

Unpickled unpickle(std::string_view data, const std::string& display_name,
                   const RecordSize& record_size, Allow allow) {
  return Machine(data, display_name, record_size, allow).run();
}

}  // namespace ckptfs::torchzip
