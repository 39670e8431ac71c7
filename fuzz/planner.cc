// The planner on random layouts, checked independently: sources are made for a random source
// layout with every element holding its own global index, the planner maps every target of a
// random target layout (the two device counts multiplying to at most 256), and the bytes its runs
// gather (parsed back by Google's protobuf parser) must be exactly the target box, computed here
// from the spec's device-coordinate rule (§3.1), element by element. Windows of the file must agree
// with the whole.
#include "ckptfs/plan/planner.h"

#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint.pb.h"
#include "ckptfs/ckpt/scanner.h"
#include "ckptfs/error.h"
#include "fuzz_input.h"

namespace {

using namespace ckptfs;
using Shape = std::vector<int64_t>;

struct Side {
  Shape dev;             // dev_matrix
  std::vector<int> map;  // per tensor dim: MindSpore map value (-1 or an axis counted from the end)
  int64_t devices() const {
    int64_t n = 1;
    for (int64_t d : dev) n *= d;
    return n;
  }
  int64_t split(size_t j) const { return map[j] < 0 ? 1 : dev[dev.size() - 1 - map[j]]; }
  // The block coordinate of `rank` along dim j: row-major device coordinates, last axis fastest.
  int64_t block(int64_t rank, size_t j) const {
    if (map[j] < 0) return 0;
    const size_t axis = dev.size() - 1 - map[j];
    for (size_t i = dev.size(); i-- > axis + 1;) rank /= dev[i];
    return rank % dev[axis];
  }
};

Side random_side(FuzzedDataProvider& in, size_t rank) {
  Side s;
  const size_t axes = in.ConsumeIntegralInRange<size_t>(1, 3);
  for (size_t i = 0; i < axes; ++i) s.dev.push_back(in.ConsumeIntegralInRange<int64_t>(1, 4));
  std::vector<bool> used(axes, false);
  for (size_t j = 0; j < rank; ++j) {
    int a = in.ConsumeIntegralInRange<int>(-1, static_cast<int>(axes) - 1);
    if (a >= 0 && used[a]) a = -1;
    if (a >= 0) used[a] = true;
    s.map.push_back(a);
  }
  return s;
}

// `stated`: the global shape a JSON strategy states (tensor_shape), or null for none.
strategy::Strategy strategy_of(const Side& s, const Shape* stated) {
  strategy::Strategy out;
  out.origin = "fuzz";
  out.devices_per_stage = s.devices();
  strategy::ParamLayout layout;
  layout.dev_matrix = s.dev;
  for (int a : s.map)
    layout.tensor_map.push_back(a < 0 ? strategy::DimAxes{} : strategy::DimAxes{a});
  if (stated) layout.tensor_shape = *stated;
  out.params["w"].name = "w";
  out.params["w"].stages[0] = layout;
  return out;
}

// The elements of `side`'s block for `rank`, as global flat indices in C order.
std::vector<int32_t> box_elements(const Side& side, int64_t rank, const Shape& global) {
  const size_t n = global.size();
  Shape begin(n), shape(n);
  int64_t count = 1;
  for (size_t j = 0; j < n; ++j) {
    shape[j] = global[j] / side.split(j);
    begin[j] = side.block(rank, j) * shape[j];
    count *= shape[j];
  }
  std::vector<int32_t> out;
  for (int64_t i = 0; i < count; ++i) {
    int64_t rest = i, flat = 0, stride = 1;
    for (size_t j = n; j-- > 0;) {
      flat += (begin[j] + rest % shape[j]) * stride;
      rest /= shape[j];
      stride *= global[j];
    }
    out.push_back(static_cast<int32_t>(flat));
  }
  return out;
}

// The content of "w" in a target .ckpt, by Google's parser; "other" must be there verbatim.
std::string ckpt_content(const std::string& file, bool other) {
  Checkpoint parsed;
  if (!parsed.ParseFromString(file)) std::abort();
  std::string content;
  bool saw_other = false;
  for (const auto& v : parsed.value()) {
    if (v.tag() == "other" && other && v.tensor().tensor_content() == "abc") {
      saw_other = true;
      continue;
    }
    if (v.tag() != "w" || v.tensor().tensor_type() != "Int32") std::abort();
    content += v.tensor().tensor_content();
  }
  if (saw_other != other) std::abort();
  return content;
}

// The bytes of "w" in a target .safetensors, read by the format's definition: an 8-byte
// little-endian header length, a JSON header, data offsets relative to the end of the header.
std::string safetensors_content(const std::string& file, bool other) {
  if (file.size() < 8) std::abort();
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<uint8_t>(file[i]);
  if (n > file.size() - 8) std::abort();
  const auto header = nlohmann::json::parse(file.substr(8, n));
  if (header.contains("other") != other) std::abort();
  const auto& w = header.at("w");
  if (w.at("dtype") != "I32") std::abort();
  const uint64_t begin = w.at("data_offsets").at(0), end = w.at("data_offsets").at(1);
  if (begin > end || 8 + n + end > file.size()) std::abort();
  return file.substr(8 + n + begin, end - begin);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const size_t rank = in.ConsumeIntegralInRange<size_t>(1, 3);
  const Side src = random_side(in, rank);
  Side dst = random_side(in, rank);
  // An execution costs a source file per source rank and two checked views per target rank,
  // while the planner takes the same paths for 64 -> 64 as for 16 -> 16: the target's trailing
  // axes fall to 1 until the device counts multiply to at most kMaxPairs (64 -> 4, 4 -> 64 and
  // 16 -> 16 stay), which halves the long run's cost per execution.
  constexpr int64_t kMaxPairs = 256;
  for (size_t i = dst.dev.size(); i-- > 0 && src.devices() * dst.devices() > kMaxPairs;)
    dst.dev[i] = 1;
  // Each dim is a multiple of both splits. Past kMaxElements the multiples are dropped (16^3 is
  // the most left then): every split of both layouts is kept, the executions stay cheap enough
  // for a long run, and a bigger tensor tiles by the same arithmetic.
  constexpr int64_t kMaxElements = 4096;
  Shape global(rank), slice(rank);
  int64_t elements = 1;
  for (size_t j = 0; j < rank; ++j) {
    global[j] = src.split(j) * dst.split(j) * in.ConsumeIntegralInRange<int64_t>(1, 3);
    elements *= global[j];
  }
  for (size_t j = 0; j < rank; ++j) {
    if (elements > kMaxElements) global[j] = src.split(j) * dst.split(j);
    slice[j] = global[j] / src.split(j);
  }

  // One source file per source rank, written by Google's serializer: the block in one record or
  // cut into two chunks, maybe after a record of another parameter; then scanned as a mount does.
  std::vector<std::string> files(static_cast<size_t>(src.devices()));
  std::map<int64_t, index::IndexedSource> sources;
  const bool other = in.ConsumeBool();  // a parameter no strategy lists: copied to every target
  for (int64_t g = 0; g < src.devices(); ++g) {
    const std::vector<int32_t> elems = box_elements(src, g, global);
    const std::string bytes(reinterpret_cast<const char*>(elems.data()), elems.size() * 4);
    Checkpoint ckpt;
    if (other) {
      auto* v = ckpt.add_value();
      v->set_tag("other");
      v->mutable_tensor()->set_tensor_type("Int8");
      v->mutable_tensor()->add_dims(3);
      v->mutable_tensor()->set_tensor_content("abc");
    }
    const size_t cut = in.ConsumeIntegralInRange<size_t>(0, bytes.size() / 4) * 4;
    for (const auto& [from, to] : {std::pair{size_t{0}, cut}, std::pair{cut, bytes.size()}}) {
      if (from == to) continue;
      auto* v = ckpt.add_value();
      v->set_tag("w");
      v->mutable_tensor()->set_tensor_type("Int32");
      for (int64_t d : slice) v->mutable_tensor()->add_dims(d);
      v->mutable_tensor()->set_tensor_content(bytes.substr(from, to - from));
    }
    std::string& file = files[static_cast<size_t>(g)];
    file = ckpt.SerializeAsString();
    index::IndexedSource& s = sources[g];
    s.file.path = "rank_" + std::to_string(g);
    s.file.fingerprint.size = file.size();
    const fuzz::MemFile mem(reinterpret_cast<const uint8_t*>(file.data()), file.size());
    s.scan = ckpt::scan_checkpoint_fd(mem.fd(), s.file.path);
  }

  // The global shape the strategies state, chosen by the input's length so that no byte of it
  // changes meaning: none, the true one on both sides (must plan), or the destination's one
  // dimension off (must be refused).
  const size_t stated = global.empty() ? 0 : size % 3;
  Shape wrong = global;
  if (stated == 2) wrong[0] += 1;
  const strategy::Strategy src_strategy = strategy_of(src, stated > 0 ? &global : nullptr);
  const strategy::Strategy dst_strategy = strategy_of(dst, stated == 1   ? &global
                                                           : stated == 2 ? &wrong
                                                                         : nullptr);
  plan::Plan plan;
  try {
    plan = plan::make_plan(std::move(sources), &src_strategy, &dst_strategy);
    if (stated == 2) {
      std::fprintf(stderr, "a disagreeing tensor_shape was not refused\n");
      std::abort();
    }
  } catch (const Error& e) {
    if (stated == 2 && std::strstr(e.what(), "in the strategy but") != nullptr) return 0;
    std::fprintf(stderr, "valid layouts refused: %s\n", e.what());
    std::abort();
  }
  // Both views of every target: .ckpt and .safetensors.
  if (plan.targets.size() != 2 * static_cast<size_t>(dst.devices())) std::abort();

  std::vector<plan::Run> runs;
  auto gather = [&](const plan::VirtualFile& f, uint64_t offset, uint64_t length) {
    runs.clear();
    const uint64_t got = f.map(offset, length, runs);
    std::string out;
    for (const plan::Run& r : runs) {
      if (r.mem) {
        out.append(r.mem, r.length);
        continue;
      }
      const std::string& file = files.at(r.source);
      if (r.offset > file.size() || r.length > file.size() - r.offset) std::abort();
      out.append(file, r.offset, r.length);
    }
    if (out.size() != got) std::abort();
    return out;
  };
  for (const plan::TargetFile& t : plan.targets) {
    const std::string whole = gather(t.file, 0, t.file.size());
    if (whole.size() != t.file.size()) std::abort();
    const std::string name = t.file_name();
    const std::string content = name.ends_with(".safetensors") ? safetensors_content(whole, other)
                                                               : ckpt_content(whole, other);
    const std::vector<int32_t> want = box_elements(dst, t.rank, global);
    if (content.size() != want.size() * 4 ||
        std::memcmp(content.data(), want.data(), content.size()))
      std::abort();
    for (int i = 0; i < 4 && in.remaining_bytes() > 0; ++i) {
      const uint64_t off = in.ConsumeIntegralInRange<uint64_t>(0, whole.size() + 2);
      const uint64_t len = in.ConsumeIntegralInRange<uint64_t>(0, whole.size() + 2);
      const std::string part = gather(t.file, off, len);
      if (part != whole.substr(std::min<uint64_t>(off, whole.size()), len)) std::abort();
    }
  }
  return 0;
}
