// "--ranks 0-7,16": a comma-separated list of ranks and inclusive ranges, as a node names the
// target ranks it serves. Ascending, each once. Pure; thread-safe.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "ckptfs/error.h"

namespace ckptfs::util {

// Throws Error naming the bad item: an empty item, a non-number, a negative or reversed range;
// and for more than 2^20 ranks in all (many long ranges would otherwise take gigabytes).
inline constexpr size_t kMaxRanks = size_t{1} << 20;
inline std::vector<int64_t> parse_rank_set(std::string_view text) {
  auto number = [&](std::string_view s) {
    int64_t v = -1;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v < 0)
      fail("--ranks {}: '{}' is not a rank (expected a list such as 0-7,16)", text, s);
    return v;
  };
  // Items are kept as ranges and only the ranges are sorted: sorting the expanded ranks cost
  // O(n log n) for one range of 2^20 ranks, already in order. Counted before any is
  // stored: many long ranges, each within bounds, would otherwise take gigabytes first.
  std::vector<std::pair<int64_t, int64_t>> ranges;  // inclusive
  size_t count = 0;
  size_t begin = 0;
  while (true) {
    const size_t comma = text.find(',', begin);
    const std::string_view item = text.substr(
        begin, comma == std::string_view::npos ? std::string_view::npos : comma - begin);
    const size_t dash = item.find('-');
    int64_t lo = 0, hi = 0;
    if (dash == std::string_view::npos) {
      lo = hi = number(item);
    } else {
      lo = number(item.substr(0, dash));
      hi = number(item.substr(dash + 1));
      if (hi < lo) fail("--ranks {}: range {} runs backwards", text, item);
      if (hi - lo >= static_cast<int64_t>(kMaxRanks))
        fail("--ranks {}: range {} is too long", text, item);
    }
    count += static_cast<size_t>(hi - lo) + 1;
    if (count > kMaxRanks) fail("--ranks {}: more than {} ranks", text, kMaxRanks);
    ranges.emplace_back(lo, hi);
    if (comma == std::string_view::npos) break;
    begin = comma + 1;
  }
  // A list written in order (a script's "0,1,2,...") is not sorted again.
  if (!std::is_sorted(ranges.begin(), ranges.end())) std::sort(ranges.begin(), ranges.end());
  std::vector<int64_t> out;
  out.reserve(count);
  for (auto [lo, hi] : ranges) {
    if (!out.empty() && lo <= out.back()) {
      if (hi <= out.back()) continue;
      lo = out.back() + 1;
    }
    // Counted from lo, not stepped up to hi: past a range ending at the largest int64_t, the
    // step would overflow.
    for (int64_t i = 0; i <= hi - lo; ++i) out.push_back(lo + i);
  }
  return out;
}

}  // namespace ckptfs::util
