#include "ckptfs/strategy/compact.h"

#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

namespace ckptfs::strategy {

namespace {

// "ckptfs compact strategy", version 1. Integers are LEB128 varints (signed ones zigzagged);
// strings and lists carry their length first.
constexpr std::string_view kMagic = "CKSTRAT1";

class Writer {
 public:
  void u(uint64_t v) {
    while (v >= 0x80) {
      out.push_back(static_cast<char>(v | 0x80));
      v >>= 7;
    }
    out.push_back(static_cast<char>(v));
  }
  void s(int64_t v) { u((static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63)); }
  void str(std::string_view v) {
    u(v.size());
    out.append(v);
  }
  void ints(const std::vector<int64_t>& v) {
    u(v.size());
    for (int64_t x : v) s(x);
  }
  std::string out;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  bool ok() const { return ok_; }
  bool done() const { return pos_ == in_.size(); }
  uint64_t u() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= in_.size()) return fail();
      const auto b = static_cast<uint8_t>(in_[pos_++]);
      v |= uint64_t{b & 0x7fu} << shift;
      if (!(b & 0x80)) return v;
    }
    return fail();
  }
  int64_t s() {
    const uint64_t v = u();
    return static_cast<int64_t>((v >> 1) ^ (~(v & 1) + 1));
  }
  // A count of items of at least one byte each: never more than the bytes left.
  size_t count() {
    const uint64_t n = u();
    if (n > in_.size() - pos_) return static_cast<size_t>(fail());
    return static_cast<size_t>(n);
  }
  std::string_view str() {
    const size_t n = count();
    if (!ok_) return {};
    const std::string_view v = in_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  std::vector<int64_t> ints() {
    std::vector<int64_t> v(count());
    for (int64_t& x : v) x = s();
    return v;
  }
  int32_t i32() {
    const int64_t v = s();
    if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
      return static_cast<int32_t>(fail());
    return static_cast<int32_t>(v);
  }

 private:
  uint64_t fail() {
    ok_ = false;
    pos_ = in_.size();
    return 0;
  }
  std::string_view in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

void write_layout(Writer& w, const ParamLayout& l) {
  w.ints(l.dev_matrix);
  w.u(l.tensor_map.size());
  for (const DimAxes& dim : l.tensor_map) {
    w.u(dim.size());
    for (int32_t a : dim) w.s(a);
  }
  w.ints(l.param_split_shape);
  w.ints(l.indices_offset);
  w.s(l.field);
  w.s(l.opt_shard_step);
  w.s(l.opt_shard_size);
  w.ints(l.tensor_shape);
}

ParamLayout read_layout(Reader& r) {
  ParamLayout l;
  l.dev_matrix = r.ints();
  l.tensor_map.resize(r.count());
  for (DimAxes& dim : l.tensor_map) {
    dim.resize(r.count());
    for (int32_t& a : dim) a = r.i32();
  }
  l.param_split_shape = r.ints();
  l.indices_offset = r.ints();
  l.field = r.i32();
  l.opt_shard_step = r.i32();
  l.opt_shard_size = r.i32();
  l.tensor_shape = r.ints();
  return l;
}

}  // namespace

std::string encode_compact(const Strategy& strategy) {
  Writer w;
  w.out.append(kMagic);
  w.s(strategy.devices_per_stage);
  w.u(strategy.num_stages);
  w.u(strategy.params.size());
  for (const auto& [name, param] : strategy.params) {
    w.str(name);
    w.u(param.stages.size());
    for (const auto& [stage, layout] : param.stages) {
      w.u(stage);
      write_layout(w, layout);
    }
  }
  return std::move(w.out);
}

std::optional<Strategy> decode_compact(std::string_view bytes, std::string origin) {
  if (!bytes.starts_with(kMagic)) return std::nullopt;
  Reader r(bytes.substr(kMagic.size()));
  Strategy out;
  out.origin = std::move(origin);
  out.devices_per_stage = r.s();
  const uint64_t stages = r.u();
  if (stages == 0 || stages > static_cast<uint64_t>(kMaxRanks) || out.devices_per_stage <= 0 ||
      out.devices_per_stage > kMaxRanks)
    return std::nullopt;
  out.num_stages = static_cast<uint32_t>(stages);
  const size_t n = r.count();
  std::string_view previous;
  for (size_t i = 0; i < n && r.ok(); ++i) {
    const std::string_view name = r.str();
    // Written in the map's order: each name sorts after the one before, so it goes at the end.
    if (!r.ok() || (i > 0 && !(previous < name))) return std::nullopt;
    previous = name;
    auto it = out.params.emplace_hint(out.params.end(), std::string(name), StrategyParam{});
    StrategyParam& param = it->second;
    param.name = it->first;
    const size_t count = r.count();
    for (size_t k = 0; k < count && r.ok(); ++k) {
      const uint64_t stage = r.u();
      if (stage >= stages) return std::nullopt;
      if (!param.stages.emplace(static_cast<uint32_t>(stage), read_layout(r)).second)
        return std::nullopt;
    }
  }
  if (!r.ok() || !r.done() || out.params.empty()) return std::nullopt;
  return out;
}

}  // namespace ckptfs::strategy
