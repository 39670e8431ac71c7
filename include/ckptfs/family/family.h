// A source family: one kind of checkpoint directory ckptfs serves (MindSpore rank directories of
// .ckpt or .safetensors files, unified_safetensors, MindFormers Checkpoint 2.0 metadata, hfai
// PART files, ...). A family is ONE entry of the registry (view/families.h), which mount,
// materialize, verify, inspect, ranks and `index build` all consult; nothing else in the program
// names a family. An entry gives:
//   detect   does this SRC_DIR hold my checkpoint, and where (the directory my view reads);
//   readers  how each of my files is scanned into scan::FileScan (the index calls them, so
//            nothing above index/ knows a wire format);
//   plan     the view I offer: the plan of my files for the parsed options (plan::Plan, which
//            view/ turns into the tree). Null only for the rank-directory families, whose views
//            (steps, lazy ranks, target summaries) the view module builds itself;
//   index_files  the files `index build` scans for me;
//   tensors  the model's tensors with their global shapes (what `strategy new` lays out).
// A new family is one folder src/<family>/ (+ include/ckptfs/<family>/) defining its readers,
// detection and plan and its entry (`extern const family::Family kFamily;`), one line in
// view/families.cc, and its module line in CMakeLists.txt.
// A family folder depends only on scan, index, strategy, plan and source (never fs, view, cli).
//
// Thread-safety: entries are immutable constants; detect and plan keep no state between calls
// and may run on any thread (the ViewInputs given to one plan call belongs to that call).
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/index/store.h"
#include "ckptfs/plan/model_files.h"
#include "ckptfs/plan/planner.h"
#include "ckptfs/scan/reader.h"
#include "ckptfs/strategy/strategy.h"

namespace ckptfs::family {

// What a family's plan is given: the user's options, each parsed at most once, when first asked
// (so that a family refuses in the order its checks come, as each view always has).
struct ViewInputs {
  std::filesystem::path src_dir;  // SRC_DIR as given: messages name it
  std::filesystem::path found;    // what the family's detect returned
  std::string step;               // --step as given
  std::string src_strategy;       // --src-strategy's path, "" if not given (a family whose files
                                  // carry their layout refuses one, in its own words)
  // --dst-strategy parsed (once, on the first call); null when none was given.
  std::function<const strategy::Strategy*()> dst;
  // --view, --prefix, --by-stage, --ranks as plan options (checked on the first call), with the
  // planning progress hooked in.
  std::function<plan::ViewOptions()> views;
  // --shard-size and --rename (read on the first call; --shard-size with --dst-strategy is
  // refused). A family whose view serves a merged model.safetensors takes them; for any other,
  // the view refuses them when they are given, as it sees that the family never asked.
  std::function<plan::ModelFileOptions()> model_files;
  // Scans `paths` with this family's readers through the index (the cache, or a shipped index),
  // reporting progress; in the order given. Throws Error naming the file.
  std::function<std::vector<index::IndexedSource>(const std::vector<std::filesystem::path>&)> scan;
  // --unstack-layers given? A family with stacked layers (Megatron-Core's) asks; one that never
  // asks has the option refused for it, so that it is never silently ignored.
  std::function<bool()> unstack_layers;
};

// What a view says about itself once it is used (view::ViewNotes takes it over).
struct ViewText {
  std::string chosen;               // which checkpoint, in one line
  std::vector<std::string> detail;  // one debug line per file left out
};

// One entry of the model as a whole: what a strategy lays out.
struct ModelTensor {
  std::string name;
  std::vector<int64_t> shape;  // global (whole-model) shape
  bool tensor = true;          // false for strings, map tensors and opaque entries
};

struct ModelTensors {
  std::string what;  // the checkpoint, in one phrase: "an hfai checkpoint of 4 PART files"
  std::vector<ModelTensor> tensors;  // in the family's order
};

struct Family {
  std::string_view name;  // as messages and tests say it: "hfai", "mindformers-metadata", ...
  // The directory this family's view reads if `dir` (SRC_DIR, with --step's text) is one of its
  // checkpoints; nullopt if it is not. Reads as little as it can. Throws Error only for a
  // directory that is recognisably this family's but unusable (naming the file at fault).
  std::optional<std::filesystem::path> (*detect)(const std::filesystem::path& dir,
                                                 const std::string& step);
  // The readers of its files, in the order they are asked (scan::pick_reader).
  scan::Readers (*readers)();
  // The view; null for the rank-directory families (see above).
  plan::Plan (*plan)(const ViewInputs& in, ViewText& text);
  // The files `index build` scans for the checkpoint at `found`, in order; null: `index build`
  // lists rank directories as for the rank-directory families (and refuses what has none).
  std::vector<std::filesystem::path> (*index_files)(const std::filesystem::path& found);
  // The model's tensors and global shapes, from as little as the family needs to read (in.scan
  // for files, in.src_strategy refused in the family's own words as its plan does). Null for the
  // rank-directory families, whose global shapes come from their source strategy (view/).
  ModelTensors (*tensors)(const ViewInputs& in);
};

}  // namespace ckptfs::family
