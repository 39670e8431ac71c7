#include "ckptfs/scan/file_scan.h"

#include <fmt/format.h>

#include <optional>

#include "ckptfs/util/quote.h"
#include "ckptfs/util/view_reach.h"

namespace ckptfs::scan {

namespace {

// A torch.save view: one storage extent, and every element it reaches inside it.
std::string check_view(const Param& p) {
  if (p.content.size() != 1 || p.strides.size() != p.shape.size() ||
      (p.element_size != 1 && p.element_size != 2 && p.element_size != 4 && p.element_size != 8 &&
       p.element_size != 16))
    return fmt::format("parameter {} is a malformed view", file_text(p.name));
  for (size_t k = 0; k < p.shape.size(); ++k)
    if (p.shape[k] < 0 || p.strides[k] < 0)
      return fmt::format("parameter {} has shape {}", file_text(p.name),
                         file_shape(p.shape, p.content[0].length));
  const std::optional<ViewReach> reach =
      view_reach(p.shape, p.strides, p.storage_offset, p.element_size);
  if (!reach) return fmt::format("parameter {} has a shape past 64 bits", file_text(p.name));
  if (reach->end > p.content[0].length)
    return fmt::format("parameter {} reaches past its storage", file_text(p.name));
  return "";
}

}  // namespace

std::string check_scan(const FileScan& scan, uint64_t file_size) {
  if (scan.file_size != file_size)
    return fmt::format("file size {} where the file has {}", scan.file_size, file_size);
  if (scan.body_size > scan.file_size)
    return fmt::format("body of {} bytes in a file of {}", scan.body_size, scan.file_size);
  for (const Param& p : scan.params) {
    for (const Extents* list : {&p.content, &p.records})
      for (const Extent& e : *list)
        if (e.offset > scan.body_size || e.length > scan.body_size - e.offset)
          return fmt::format("parameter {} has bytes [{}, +{}) past the body's {} bytes",
                             file_text(p.name), file_number(e.offset, scan.file_size),
                             file_number(e.length, scan.file_size), scan.body_size);
    if (p.kind != EntryKind::Tensor) continue;
    if (p.view) {
      if (std::string what = check_view(p); !what.empty()) return what;
      continue;
    }
    const uint32_t size = p.dtype.element_size();
    if (size == 0 || size != p.element_size)
      return fmt::format("parameter {} of type {} has element size {}", file_text(p.name),
                         file_text(p.dtype.name()), p.element_size);
    unsigned __int128 need = size;
    for (int64_t d : p.shape) {
      if (d < 0)
        return fmt::format("parameter {} has shape {}", file_text(p.name),
                           file_shape(p.shape, scan.file_size));
      need *= static_cast<uint64_t>(d);
      if (need > UINT64_MAX)
        return fmt::format("parameter {} has a shape past 64 bits", file_text(p.name));
    }
    unsigned __int128 have = 0;
    for (const Extent& e : p.content) have += e.length;
    if (have != need)
      return fmt::format("parameter {} has {} content bytes for shape {}", file_text(p.name),
                         file_number(static_cast<uint64_t>(have), scan.file_size),
                         file_shape(p.shape, scan.file_size));
  }
  return "";
}

uint64_t Param::nbytes() const {
  if (view) return elements() * element_size;
  uint64_t total = 0;
  for (const Extent& e : content) total += e.length;
  return total;
}

uint64_t Param::elements() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

std::string_view format_name(SourceFormat format) {
  switch (format) {
    case SourceFormat::Ckpt:
      return "ckpt";
    case SourceFormat::Safetensors:
      return "safetensors";
    case SourceFormat::TorchZip:
      return "torch";
    case SourceFormat::Dcp:
      return "dcp";
  }
  return "unknown";
}

}  // namespace ckptfs::scan
