// The planner (spec §4.2–§4.6): which records every target rank's file holds, in MindSpore's
// order, each as header bytes plus content mapped onto source files. It reads no tensor bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ckptfs/index/store.h"
#include "ckptfs/plan/virtual_file.h"
#include "ckptfs/strategy/strategy.h"

namespace ckptfs::plan {

// The rank of a file shown at the mount's root rather than in a rank_<rank> directory.
inline constexpr int64_t kRootRank = -1;

// One file of the mounted tree, in directory rank_<rank> (or at the root: kRootRank).
struct TargetFile {
  int64_t rank = 0;
  VirtualFile file;
  std::string name;              // empty: "checkpoint_<rank>.ckpt"
  bool page_cache = false;       // its readers map it (fs: page cache where mmap needs it)
  std::string dir_name() const;  // "rank_<rank>", or "" for a root file
  std::string path() const;      // "rank_<rank>/<file>", or "<file>" for a root file
  std::string file_name() const;
};

// Which files every target rank shows: "<prefix><rank>.ckpt" (MindSpore's record order) and
// "<prefix><rank>.safetensors" (what MindSpore >= 2.7's transform writes with
// output_format="safetensors", without strings, map tensors and Int4 entries).
// A scalar record the .ckpt view ends with (MindFormers' common.json counters), unless a planned
// entry has its name.
struct TrailingScalar {
  std::string name;
  std::string dtype;  // MindSpore's tensor_type
  std::string bytes;  // the value, little-endian
};

// What planning derives from the two strategies alone (each parameter's layouts, the blocks'
// holders, the ranks MindSpore reads for them), kept across plans: planning the target ranks
// one plan at a time then computes these once, not once per plan. A memo serves only the two
// strategy objects it was first used with (others reset it); they must outlive its use. Not
// thread-safe: one per planning thread.
class LayoutMemo;
std::shared_ptr<LayoutMemo> new_layout_memo();

struct ViewOptions {
  bool ckpt = true;
  bool safetensors = true;
  // Of ckpt and safetensors, only the format the sources are in (an hfai checkpoint's:
  // safetensors), so that the files are themselves a source: a rank directory holding both
  // formats is refused as one.
  bool source_format = false;
  std::string prefix = "checkpoint_";
  // Instead: MindSpore >= 2.3's by-stage transform (spec mindspore-formats.md §4.7), called
  // once per stage of a pipeline source with that stage's strategy: rank_<l>/<prefix><l>_part<s>
  // .ckpt for every destination rank l and source stage s, for load_segmented_checkpoints. Needs
  // a pipeline source strategy and a one-stage destination strategy; .ckpt files only.
  bool by_stage = false;
  std::vector<TrailingScalar> ckpt_trailing;
  // Only these target ranks (ascending; empty: all). The sources may then be just the ranks
  // these targets load (strategy::rank_list_for_transform): the caller has checked the rank
  // directories against the source strategy, and coverage is checked per stage present.
  std::vector<int64_t> ranks;
  // Progress: called with (0, total) before the first target rank is planned and with
  // (done, total) after each, on the planning thread.
  std::function<void(size_t done, size_t total)> on_planned;
  // Kept across this thread's plans of the same strategies (null: none kept).
  std::shared_ptr<LayoutMemo> layout_memo;
  // Each file's size and sources only (index build's target summaries): its bytes are never
  // served, so the pieces that map them are not built (VirtualFile::Builder(true)).
  bool sizes_only = false;
};

// How many target ranks `dst` has (1 for the unsharded side).
int64_t target_count(const strategy::Strategy* dst);
// Throws Error in one line if a rank of `ranks` is not a target rank of `dst`.
void check_target_ranks(const std::vector<int64_t>& ranks, const strategy::Strategy* dst);

struct Plan {
  std::vector<index::IndexedSource> sources;  // Run::source indexes this
  std::vector<int64_t> source_ranks;          // global rank of each source
  std::vector<TargetFile> targets;            // ascending rank; .ckpt before .safetensors
  // Worth a warning once the mount serves (a refused mount says only why).
  std::vector<std::string> warnings;
};

// The sources a planned file reads, as listing shows them: their global ranks (ascending, each
// once) and the newest of their mtimes (-1 when it reads none: the file takes the mount time).
// An eager mount and a shipped index's summaries both derive a file's mtime and access from it.
struct SourcesRead {
  std::vector<int64_t> ranks;
  int64_t newest_mtime_ns = -1;
};
SourcesRead sources_read(const Plan& plan, const VirtualFile& file);

// Plans every target rank. A null strategy is the unsharded side. Sources all .ckpt follow
// MindSpore's .ckpt transform, all .safetensors its safetensors transform (spec
// mindspore-safetensors.md §2.2); a mix is refused. Throws Error naming the file or parameter
// at fault: a needed rank without a file, a dimension that does not divide, slice shapes that
// disagree across ranks, a map that does not fit the tensor, and so on.
Plan make_plan(std::map<int64_t, index::IndexedSource> sources, const strategy::Strategy* src,
               const strategy::Strategy* dst, const ViewOptions& views = {});

// Files that say themselves where every block is (MindFormers' metadata checkpoints): `ranks[i]`
// is the rank of `src` whose blocks files[i] holds. A rank may have several files (one file to
// the planner, in the order given) or none; any file holding a block serves it, and every file
// is loaded for every target (record order: first appearance over the files, ranks descending).
Plan make_located_plan(std::vector<index::IndexedSource> files, const std::vector<int64_t>& ranks,
                       const strategy::Strategy& src, const strategy::Strategy* dst,
                       const ViewOptions& views = {});

// A full checkpoint kept in several files (MindSpore's unified_safetensors output: the parts,
// then hyper_param.safetensors), resharded to `dst` as if it were one unsharded rank_0 file
// listing the parts' entries in the order given. Without `dst`: the one merged checkpoint,
// rank_0, every tensor copied whole (as a full source's merge is served).
Plan make_unified_plan(std::vector<index::IndexedSource> parts, const strategy::Strategy* dst,
                       const ViewOptions& views = {});

// One tensor of a full checkpoint held as a strided view (a merged hfai model's tensor), or as a
// grid of chunks (a DCP tensor's shards: a column-split one as one range per row would cost
// memory in proportion to its rows).
struct FullTensor {
  std::string name;
  std::string dtype;                              // MindSpore tensor_type
  std::vector<int64_t> shape;                     // empty for a scalar
  std::shared_ptr<const StridedContent> content;  // the whole tensor, or
  std::shared_ptr<const GridContent> grid;        // the whole tensor as a grid
};

// Appends to `plan` (whose sources the contents read) the files of every target rank of `dst`
// (or of views.ranks): `tensors`, one full checkpoint in its order, cut as MindSpore's transform
// cuts an unsharded source. A tensor `dst` lists for the target's stage is cut to the target's
// block; one it lists only for other stages is left out; one it does not list is copied whole
// (after the cut ones). Throws Error in one line for a parameter of `dst` the tensors lack, a
// global tensor_shape in `dst` that disagrees, a map of another rank than the tensor, a
// dimension that does not divide.
void add_full_views(Plan& plan, const std::vector<FullTensor>& tensors,
                    const strategy::Strategy& dst, const ViewOptions& views);

}  // namespace ckptfs::plan
