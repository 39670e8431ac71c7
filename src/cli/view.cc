#include "view.h"

#include <CLI/CLI.hpp>

#include "s3_source.h"

namespace ckptfs::cli {

CLI::App* add_view_command(CLI::App& app, std::string name, std::string description,
                           ViewArgs& args) {
  CLI::App* command = app.add_subcommand(std::move(name), std::move(description));
  command
      ->add_option("SRC_DIR", args.src_dir,
                   "Directory holding rank_<N>/*.ckpt or *.safetensors, a MindFormers "
                   "output/ directory, a MindFormers metadata checkpoint (the directory of "
                   "latest_checkpointed_iteration.txt, or one iteration_<N>/), an hfai "
                   "checkpoint (a directory of PART_000.pt ...), a PyTorch DCP directory, or a "
                   "Megatron-Core torch_dist save (the directory of "
                   "latest_checkpointed_iteration.txt, or one iter_<N>/)")
      ->required();  // checked by the command, in its one line: a missing one is bad input
  add_s3_source(command, args.src_dir);
  command->add_option("--src-strategy", args.src_strategy,
                      "Strategy the sources were saved with: protobuf file, .json file, or a "
                      "directory of per-stage files (omit: a MindFormers output/strategy/ if "
                      "SRC_DIR is such an output/, else rank_0 holds one full checkpoint)");
  command->add_option("--dst-strategy", args.dst_strategy,
                      "Strategy to present (omit: one merged checkpoint, rank_0)");
  command
      ->add_option("--step", args.step,
                   "Which checkpoint of each rank: latest (the newest step saved on every rank), "
                   "EPOCH_STEP such as 10_100, breakpoint, or a file-name glob; for a MindFormers "
                   "metadata or Megatron-Core checkpoint, latest or an iteration number")
      ->capture_default_str();
  command->add_flag("--allow-mixed-steps", args.allow_mixed_steps,
                    "With --step FILE-GLOB: serve the named files even if they are of different "
                    "steps");
  command
      ->add_option("--view", args.views,
                   "Which files each rank directory shows, comma-separated: ckpt, safetensors "
                   "(default both)")
      ->delimiter(',');
  command->add_option("--prefix", args.prefix,
                      "File name prefix of the shown files, as transform_checkpoints' "
                      "ckpt_prefix (default checkpoint_)");
  command->add_flag("--by-stage", args.by_stage,
                    "One _part<stage> file per source pipeline stage, as MindSpore's by-stage "
                    "transform writes");
  command->add_flag("--unstack-layers", args.unstack_layers,
                    "Megatron-Core torch_dist: serve each stacked tensor [num_layers, ...] "
                    "(decoder.layers.NAME) as per-layer tensors decoder.layers.<i>.NAME");
  command->add_option(
      "--ranks", args.ranks,
      "Only these target ranks, e.g. 0-7,16 (one node's share): only the source "
      "files they load are opened, scanned and planned, and only they need be there");
  command->add_option(
      "--shard-size", args.shard_size,
      "A merged model.safetensors (PyTorch DCP, hfai) larger than this is served as "
      "model-0000k-of-0000n.safetensors plus model.safetensors.index.json, as save_pretrained "
      "writes them: e.g. 5GB (the default), 2GiB, bytes; 0 or none: never cut");
  command->add_option("--rename", args.rename,
                      "A file of rules `REGEX REPLACEMENT`, one a line: each tensor is served "
                      "under the replacement of the first rule whose REGEX (POSIX extended) "
                      "matches its whole key (\\1 ... \\9 its groups), else under its key");
  command->add_option("--index", args.shipped_index,
                      "A shipped index (`ckptfs index build SRC --output DIR`) to take every scan "
                      "from, read-only and lock-free; refused if a source changed since it was "
                      "built");
  command->add_option("--index-dir", args.index_dir,
                      "Where the LMDB index lives (default $XDG_CACHE_HOME/ckptfs/index or "
                      "~/.cache/ckptfs/index)");
  command->add_option("--dec-key-file", args.dec_key_file,
                      "Key of encrypted sources (MindSpore enc_key): a file holding exactly its "
                      "16, 24 or 32 raw bytes, readable by its owner only (chmod 600); the mode "
                      "(AES-GCM, AES-CBC, SM4-CBC) is read from the files");
  command->add_option("--dec-key-env", args.dec_key_env,
                      "Name of an environment variable holding the key of encrypted sources in "
                      "hex (32, 48 or 64 digits); the key itself is never an argument");
  command->add_flag("-q,--quiet", args.quiet,
                    "No progress lines (shown on stderr for scanning, planning and writing that "
                    "take more than a second) and no line saying which checkpoints were chosen: "
                    "only warnings and errors (also accepted before the subcommand)");
  return command;
}

}  // namespace ckptfs::cli
