// "--ranks 0-7,16" (include/ckptfs/util/rank_set.h), also given in fstab lines as ranks=...
// Checked: ranks ascending, each once, none negative; written back as a list, the text parses to
// the same ranks.
#include "ckptfs/util/rank_set.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>
#include <string_view>
#include <vector>

#include "ckptfs/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<int64_t> ranks;
  try {
    ranks = ckptfs::util::parse_rank_set(text);
  } catch (const ckptfs::Error&) {
    return 0;
  }
  if (ranks.empty()) std::abort();
  for (size_t i = 0; i < ranks.size(); ++i)
    if (ranks[i] < 0 || (i > 0 && ranks[i] <= ranks[i - 1])) std::abort();
  if (ckptfs::util::parse_rank_set(fmt::format("{}", fmt::join(ranks, ","))) != ranks) std::abort();
  return 0;
}
