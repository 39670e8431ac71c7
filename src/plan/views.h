// The files a target's entries are served as, each one VirtualFile built from the entries
// alone (no tensor bytes read): the .ckpt view in MindSpore's record order and the .safetensors
// view in the reference writer's layout. Entries come from the planner (target_planner.h) or
// from a full checkpoint's tensors (add_full_views).
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/plan/planner.h"
#include "ckptfs/plan/read_map.h"
#include "ckptfs/scan/file_scan.h"

namespace ckptfs::plan {

// One entry of a target, whatever the view shows it as: name, type, shape, and where its bytes
// come from (a resharded box, or the source copy it passes through).
struct Entry {
  std::string_view name;
  std::string_view dtype;
  scan::EntryKind kind = scan::EntryKind::Tensor;
  std::vector<int64_t> shape;                   // empty for a scalar
  std::shared_ptr<const TensorContent> tensor;  // set when resharded
  const scan::Param* copy = nullptr;            // set when passed through
  uint32_t source = 0;                          //   and the file it is read from
  std::shared_ptr<const StridedContent> view;   // set for a full checkpoint's strided tensor
  std::shared_ptr<const GridContent> grid;      //   or its tensor of chunks
  uint64_t nbytes() const {
    return tensor ? tensor->nbytes()
           : view ? view->nbytes()
           : grid ? grid->nbytes()
                  : copy->nbytes();
  }
};

// The .ckpt view: one record per entry, re-serialized with ≥2.3 conventions, one record per
// 512 MiB of content (≥2.3 byte chunking), each header followed by its bytes; then the
// `trailing` scalars no entry names.
// `sizes_only`: the file's size and sources alone (VirtualFile::Builder(true)), for a summary.
VirtualFile ckpt_view(const std::vector<Entry>& entries,
                      const std::vector<TrailingScalar>& trailing = {}, bool sizes_only = false);

// The .safetensors view: what MindSpore >= 2.7's transform writes with output_format=
// "safetensors" (the reference writer's layout, {"format":"ms"}). Entries of a type safetensors
// has no code for (strings, map tensors, a .ckpt's Int4 and other opaque types) are left out and
// named in `left_out`; a safetensors source's Int4 tensors keep their stored type.
VirtualFile safetensors_view(const std::vector<Entry>& entries, std::set<std::string>& left_out,
                             bool sizes_only = false);

}  // namespace ckptfs::plan
