// A target rank's summary in a shipped index (index::decode_target): the first 8 input bytes are
// the rank asked for, the rest the summary's message, sealed here with a valid CRC-32 so that the
// fuzzer reaches the checks behind the checksum. Checked: every refusal has a reason; whatever
// decodes is the rank asked for, lists plain, distinct file names with sizes that fit an off_t
// and strictly ascending non-negative source ranks (its own and each file's), and encodes back to a
// summary that decodes to the same values; one byte more breaks the checksum.
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <set>
#include <string>

#include "ckptfs/ckpt/crc32.h"
#include "ckptfs/index/store.h"
#include "quiet_protobuf.h"

namespace {

bool same(const ckptfs::index::TargetSummary& a, const ckptfs::index::TargetSummary& b) {
  if (a.rank != b.rank || a.source_ranks != b.source_ranks || a.files.size() != b.files.size())
    return false;
  for (size_t i = 0; i < a.files.size(); ++i) {
    const auto &x = a.files[i], &y = b.files[i];
    if (x.name != y.name || x.size != y.size || x.mtime_ns != y.mtime_ns ||
        x.page_cache != y.page_cache || x.source_ranks != y.source_ranks)
      return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckptfs;
  if (size < 8) return 0;
  uint64_t rank_bits = 0;
  for (int i = 0; i < 8; ++i) rank_bits = rank_bits << 8 | data[i];
  const auto rank = static_cast<int64_t>(rank_bits);
  std::string entry(reinterpret_cast<const char*>(data + 8), size - 8);
  const uint32_t crc = ckpt::crc32_update(0, std::span(data + 8, size - 8));
  for (int shift = 24; shift >= 0; shift -= 8) entry.push_back(static_cast<char>(crc >> shift));

  std::string why;
  if (index::decode_target(std::string(entry).append("x"), rank, &why)) std::abort();
  why.clear();
  const std::optional<index::TargetSummary> summary = index::decode_target(entry, rank, &why);
  if (!summary) {
    if (why.empty()) std::abort();
    return 0;
  }
  if (summary->rank != rank) std::abort();
  std::set<std::string> names;
  for (const index::TargetSummary::File& f : summary->files) {
    if (f.name.empty() || f.name == "." || f.name == ".." || f.name.size() > 255 ||
        f.name.find('/') != std::string::npos || f.name.find('\0') != std::string::npos ||
        !names.insert(f.name).second ||
        f.size > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      std::abort();
  }
  const auto check_ascending = [](const std::vector<int64_t>& ranks) {
    int64_t previous = -1;
    for (int64_t r : ranks) {
      if (r <= previous) std::abort();
      previous = r;
    }
  };
  check_ascending(summary->source_ranks);
  for (const index::TargetSummary::File& f : summary->files) check_ascending(f.source_ranks);
  const std::optional<index::TargetSummary> again =
      index::decode_target(index::encode_target(*summary), rank);
  if (!again || !same(*again, *summary)) std::abort();
  return 0;
}
