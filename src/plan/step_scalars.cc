#include "ckptfs/plan/step_scalars.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/error.h"
#include "ckptfs/index/source_bytes.h"

namespace ckptfs::plan {

namespace {

constexpr std::string_view kCounters[] = {"global_step", "epoch_num", "step_num"};
// A counter is a scalar; anything bigger is not one and is left alone.
constexpr uint64_t kMaxCounterBytes = 16;
constexpr size_t kMaxRanksNamed = 4;

std::string content_of(const index::IndexedSource& source, const scan::Param& p) {
  const ReadExact read = index::source_reader(source);
  std::string bytes;
  for (const scan::Extent& x : p.content) {
    const size_t at = bytes.size();
    bytes.resize(at + x.length);
    read(x.offset, std::span(reinterpret_cast<uint8_t*>(bytes.data() + at), x.length));
  }
  return bytes;
}

// The value as MindSpore would print it; hex for types a counter never has.
std::string shown(std::string_view dtype, const std::string& bytes) {
  auto as = [&]<typename T>(T value) {
    std::memcpy(&value, bytes.data(), sizeof value);
    return fmt::format("{}", value);
  };
  if (dtype == "Int32" && bytes.size() == 4) return as(int32_t{});
  if (dtype == "Int64" && bytes.size() == 8) return as(int64_t{});
  if (dtype == "UInt32" && bytes.size() == 4) return as(uint32_t{});
  if (dtype == "UInt64" && bytes.size() == 8) return as(uint64_t{});
  if (dtype == "Float32" && bytes.size() == 4) return as(float{});
  if (dtype == "Float64" && bytes.size() == 8) return as(double{});
  std::string hex = "0x";
  for (unsigned char c : bytes) hex += fmt::format("{:02x}", c);
  return fmt::format("{} {}", dtype, hex);
}

}  // namespace

void check_step_scalars(const std::map<int64_t, index::IndexedSource>& sources) {
  // Each file's first entry of each counter, found in one pass over its names.
  constexpr size_t kCount = std::size(kCounters);
  std::vector<std::array<const scan::Param*, kCount>> found;
  found.reserve(sources.size());
  for (const auto& [rank, source] : sources) {
    std::array<const scan::Param*, kCount>& first = found.emplace_back();
    first.fill(nullptr);
    for (const scan::Param& p : source.scan.params)
      for (size_t c = 0; c < kCount; ++c)
        if (!first[c] && p.name == kCounters[c] && p.kind == scan::EntryKind::Tensor &&
            p.nbytes() <= kMaxCounterBytes)
          first[c] = &p;
  }
  for (size_t c = 0; c < kCount; ++c) {
    const std::string_view counter = kCounters[c];
    // value -> ranks, in rank order; the first file named for each value.
    std::vector<std::pair<std::string, std::vector<int64_t>>> values;
    std::vector<std::string> first_file;
    size_t file = 0;
    bool encrypted = false;
    for (const auto& [rank, source] : sources) {
      if (const scan::Param* p = found[file++][c]) {
        encrypted = encrypted || source.scan.encrypted;
        const std::string value = shown(p->dtype, content_of(source, *p));
        auto it = std::find_if(values.begin(), values.end(),
                               [&](const auto& v) { return v.first == value; });
        if (it == values.end()) {
          values.push_back({value, {}});
          first_file.push_back(source.file.path.string());
          it = values.end() - 1;
        }
        it->second.push_back(rank);
      }
    }
    if (values.size() <= 1) continue;
    std::string detail;
    for (size_t i = 0; i < values.size(); ++i) {
      const auto& [value, ranks] = values[i];
      std::string names;
      for (size_t k = 0; k < ranks.size() && k < kMaxRanksNamed; ++k)
        names += fmt::format("{}rank {}", k ? ", " : "", ranks[k]);
      if (ranks.size() > kMaxRanksNamed)
        names += fmt::format(" and {} more", ranks.size() - kMaxRanksNamed);
      // A value decrypted from an encrypted source is never shown: only which ranks agree.
      const std::string label = encrypted ? fmt::format("value #{}", i + 1) : value;
      detail +=
          fmt::format("{}{} = {} on {} ({})", i ? "; " : "", counter, label, names, first_file[i]);
    }
    fail(
        "the chosen checkpoints are of different steps: {}; choose one step with --step "
        "EPOCH_STEP, or name the files with --step FILE-GLOB --allow-mixed-steps",
        detail);
  }
}

}  // namespace ckptfs::plan
