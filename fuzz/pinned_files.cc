// The chosen source files a shipped index keeps (source::parse_files_text): a pinned mount reads
// them instead of listing the source directory. Checked: whatever parses names at least one file,
// every rank non-negative, every path absolute without a NUL; written back with files_text, it
// parses to the same choice.
#include "ckptfs/source/pinned_files.h"

#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckptfs::source;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::optional<Choice> choice = parse_files_text(text);
  if (!choice) return 0;
  if (choice->files.empty()) std::abort();
  for (const auto& [rank, path] : choice->files) {
    const std::string& name = path.native();
    if (rank < 0 || name.empty() || name.front() != '/' || name.find('\0') != std::string::npos)
      std::abort();
  }
  const std::optional<Choice> again = parse_files_text(files_text(*choice));
  if (!again || again->files != choice->files || again->mixed_allowed != choice->mixed_allowed)
    std::abort();
  return 0;
}
