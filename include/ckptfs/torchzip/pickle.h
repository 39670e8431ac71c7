// The allow-listed pickle machine for torch.save's data.pkl (spec §3): it executes nothing.
// Only the opcodes of §3.2 and the globals of §3.3 are accepted, each call only with the
// argument shapes of §3.5; anything else is refused naming the file and the opcode or global.
// Work and memory are linear in the pickle's size, with fixed caps on stack, marks, memo and
// object count and a memory budget in proportion to the pickle's size; nesting and key depth are
// capped, and nothing recurses on input-chosen depth beyond those caps. Stateless function;
// thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ckptfs::torchzip {

// One torch dtype (spec §3.6). `code` is the safetensors code (or "C128" for complex128,
// which safetensors cannot hold).
struct DtypeInfo {
  std::string_view torch_name;     // "float32"
  std::string_view storage_class;  // "FloatStorage"; empty: only through UntypedStorage
  std::string_view code;           // "F32"
  uint32_t element_size;
};
// The dtype with this safetensors code, or null.
const DtypeInfo* dtype_by_code(std::string_view code);
// The dtype torch names `torch_name` ("float32", as in the global torch.float32), or null.
const DtypeInfo* dtype_by_torch_name(std::string_view torch_name);

// One tensor occurrence in the unpickled object: a strided view into a storage record.
struct PickledTensor {
  std::string path;         // dict keys / list indices joined by "/"; tuple keys as "(a,b)"
  std::string storage_key;  // the record is data/<storage_key>
  const DtypeInfo* dtype = nullptr;
  uint64_t storage_offset = 0;  // elements
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;  // elements
  bool requires_grad = false;
};

struct Unpickled {
  // The object in the fixtures' type-preserving JSON encoding ({"$dict": [[k, v], ...]},
  // {"$tuple": [...]}, {"$size": [...]}, {"$float": "<float.hex()>"}, ...), with every tensor
  // occurrence as {"$tensor": i}, i indexing `tensors`. A tensor reached twice (memo) is two
  // occurrences with their own paths.
  nlohmann::json tree;
  std::vector<PickledTensor> tensors;
  int protocol = 0;
};

// Size in bytes of record data/<key>, or nullopt if the archive has no such record.
using RecordSize = std::function<std::optional<uint64_t>(std::string_view key)>;

// Caps (spec §3.9).
inline constexpr size_t kMaxObjects = 20'000'000;
inline constexpr size_t kMaxStack = 10'000'000;
inline constexpr size_t kMaxMarks = 100'000;
inline constexpr size_t kMaxDepth = 200;  // nesting of the result, and of dict keys
// The memory the machine and its result may take: this floor plus so many bytes per byte of
// the pickle, as charged for each object, string, item and tree node. A state_dict's pickle
// makes `inspect` hold about 20 bytes per byte at its peak (200,000 tensors: a 22 MB pickle,
// 416 MiB); one crafted to make an object of almost every byte (3 MB of empty dicts held 926 MB)
// is refused when it reaches the limit.
inline constexpr uint64_t kMemoryFloor = uint64_t{64} << 20;
inline constexpr uint64_t kMemoryPerByte = 48;

// Which globals a pickle may use. TorchSave: torch.save's data.pkl (the list above; NEWOBJ is
// refused). DcpMetadata: a DCP checkpoint's .metadata (torch-dcp-megatron.md §1.6, as torch 2.6
// writes it), and nothing of torch.save's: DCP's seven metadata dataclasses,
// filesystem._StorageInfo and, for Megatron-Core's torch_dist saves (§3.5: all_local_plans,
// MCoreMetadata), planner.{SavePlan, WriteItem, TensorWriteData, BytesIOWriteData},
// filesystem._StoragePrefix and megatron.core.dist_checkpointing.strategies.torch.{MCoreMetadata,
// MCoreSavePlan} (made by NEWOBJ with no arguments, their state set once by BUILD),
// metadata._MEM_FORMAT_ENCODING and planner.WriteItemType, torch.serialization._get_layout and
// pathlib.PosixPath (made by REDUCE of ints or strings), torch.Size and dtypes by name. In the tree
// such an object is
// {"$object": "module.Class", "state": <its __dict__ or tuple>} or {..., "args": [...]}; an
// object used as a dict key stays one key per object (equal MetadataIndex keys are not merged:
// the caller sees both).
enum class Allow : uint8_t { TorchSave, DcpMetadata };

// Throws Error naming `display_name` and the byte offset in the pickle for anything refused.
Unpickled unpickle(std::string_view data, const std::string& display_name,
                   const RecordSize& record_size, Allow allow = Allow::TorchSave);

// Python's float.hex() of `v` ("0x1.0624dd2f1a9fcp-10", "-0x0.0p+0", "inf", "nan").
std::string python_float_hex(double v);

}  // namespace ckptfs::torchzip
