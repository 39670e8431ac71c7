// View assembly: from the options that choose a view (sources, step, strategies, files shown,
// index) to the tree a mount serves, materialize writes and verify checks, so that all three
// always agree on what a view is. Which family SRC_DIR is, and how its files are read, is the
// registry's (view/families.h); this module lists rank directories, parses each strategy once,
// plans (eagerly, per step, or lazily per rank from a shipped index's summaries) and says what
// it chose (ViewNotes). The CLI only parses options into ViewArgs.
// Thread-safety: build_tree and summarize_targets may run on any thread, one call per ViewArgs;
// the trees they return plan lazily ranks and steps from FUSE workers, serialized inside (a
// shipped index is opened by one thread at a time).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ckptfs/fs/tree.h"
#include "ckptfs/index/store.h"
#include "ckptfs/plan/model_files.h"
#include "ckptfs/plan/planner.h"

namespace ckptfs::view {

struct ViewArgs {
  std::string src_dir;
  std::string src_strategy;
  std::string dst_strategy;
  std::string index_dir;
  std::string shipped_index;  // --index: a shipped index, read-only; never written
  std::string step = "latest";
  bool allow_mixed_steps = false;
  std::vector<std::string> views{"ckpt", "safetensors"};
  std::string prefix = "checkpoint_";
  bool by_stage = false;
  bool unstack_layers = false;  // Megatron's stacked layers served per layer
  std::string ranks;            // "--ranks 0-7,16"; empty: every target rank
  bool quiet = false;           // no progress lines, no line saying which checkpoints were chosen
  // materialize without --view: only the sources' format (plan::ViewOptions::source_format),
  // so that the output is itself a source.
  bool source_format = false;
  // The key of encrypted sources: a file of its raw bytes that only its owner may read, or an
  // environment variable holding it in hex. Never the key itself (argv is public).
  std::string dec_key_file;
  std::string dec_key_env;
  // A merged model.safetensors's options (plan::ModelFileOptions): --shard-size as given ("":
  // the default) and --rename's file ("": none).
  std::string shard_size;
  std::string rename;
};

// Reads the key ViewArgs names (at most one of --dec-key-file and --dec-key-env) into the
// session key (crypt/session_key.h); nothing when neither is given. Throws Error naming the file
// or variable. build_tree calls it first.
void load_key(const ViewArgs& args);

// --view, --prefix, --by-stage and --ranks as plan options. Throws Error naming the option.
plan::ViewOptions view_options(const ViewArgs& args);

// --shard-size and --rename as a merged view takes them. Throws Error naming the option or file.
plan::ModelFileOptions model_file_options(const ViewArgs& args);

// What a command says about its view once it is sure to use it: said only then, so that a
// refusal stays one line.
struct ViewNotes {
  std::string chosen;               // which checkpoints, in one line
  std::string ignored;              // entries that are not checkpoints, in one line or ""
  std::vector<std::string> detail;  // one debug line per ignored entry
  std::vector<std::string> plan_warnings;
  bool quiet = false;  // -q: `chosen` only at info level; warnings still shown
  void say() const;
};

// Discovers, indexes and plans every target rank of the chosen step (or the checkpoint of
// another family, view/families.h) and fills `notes`. With `steps`, the tree also offers
// "/steps" (every step, planned when first looked up). Scanning and planning report progress on
// stderr when they take more than a second (not with ViewArgs::quiet). Throws Error naming the
// file or parameter. The index is only a cache: if its directory cannot be used, one warning is
// logged and the sources are scanned without it.
// With `steps` (a mount) and a shipped index (--index) holding target summaries of this very
// view, the exposed ranks are listed from the summaries and each is planned on first open;
// summaries of another view are ignored with a warning and the ranks planned now.
std::unique_ptr<fs::Tree> build_tree(const ViewArgs& args, ViewNotes& notes, bool steps);

// index build with strategies: plans every target rank of the view from the scans in `store`
// (which must hold every chosen source) and stores each rank's summary (file names, exact sizes,
// mtimes, the source ranks read) with the view they are for. Returns how many ranks.
// `progress(done, total)` is called after each rank. Throws Error naming what is wrong.
size_t summarize_targets(const ViewArgs& args, index::Store& store,
                         const std::function<void(size_t, size_t)>& progress = {});

}  // namespace ckptfs::view
