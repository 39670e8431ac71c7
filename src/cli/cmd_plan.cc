// `ckptfs plan SRC_DIR [view options] [--json]`: what reading the view costs in source bytes,
// before anything is read: per target file, the bytes it needs from each source and the bytes
// fetched when the sources are read in 4 KiB, 1 MiB or 8 MiB blocks (plan/fetch_cost.h); then
// the same for all the files together. Only the scan touches the sources (none with --index).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "ckptfs/error.h"
#include "ckptfs/fs/lazy_ranks.h"
#include "ckptfs/fs/tree.h"
#include "ckptfs/plan/fetch_cost.h"
#include "ckptfs/util/remote_fs.h"
#include "commands.h"
#include "view.h"

namespace ckptfs::cli {

namespace {

struct PlanArgs {
  ViewArgs view;
  bool json = false;
};

// One planned file and the plan its runs index.
struct Planned {
  const plan::Plan* plan;
  const plan::TargetFile* target;
};

std::vector<Planned> planned_files(const fs::Tree& tree) {
  std::vector<Planned> out;
  if (const fs::LazyRanks* lazy = tree.lazy()) {
    for (size_t i = 0; i < lazy->files().size(); ++i) {
      const plan::TargetFile* t = tree.target(tree.target_ino(i));  // plans the rank
      const fs::Tree* rank = lazy->planned(i).first;
      if (t == nullptr || rank == nullptr)
        fail("plan: {} cannot be planned (see the line above)", lazy->files()[i].name);
      out.push_back({&rank->plan(), t});
    }
    return out;
  }
  for (const plan::TargetFile& t : tree.plan().targets) out.push_back({&tree.plan(), &t});
  return out;
}

std::string shown(const std::filesystem::path& path, const std::filesystem::path& src) {
  const std::filesystem::path rel =
      std::filesystem::absolute(path).lexically_normal().lexically_relative(src);
  return rel.empty() || rel.native().starts_with("..") ? path.string() : rel.string();
}

struct Costed {
  std::string name;
  std::vector<std::pair<std::string, plan::SourceCost>> sources;  // by source path
};

// Costs `runs` (indexed like `plan`'s sources) and names the sources by path.
Costed cost_of(std::string name, const plan::Plan& plan, std::vector<std::vector<plan::Run>>& runs,
               const std::filesystem::path& src) {
  std::vector<uint64_t> sizes;
  for (const index::IndexedSource& s : plan.sources) sizes.push_back(s.file.fingerprint.size);
  Costed out{std::move(name), {}};
  for (plan::SourceCost& c : plan::fetch_cost(runs, sizes, plan::kCostBlocks))
    out.sources.emplace_back(shown(plan.sources[c.source].file.path, src), std::move(c));
  return out;
}

std::string block_name(uint64_t block) {
  return block >= (1u << 20) ? fmt::format("{} MiB", block >> 20)
                             : fmt::format("{} KiB", block >> 10);
}

// "needs X; fetched at 4 KiB: Y (r x), 1 MiB: ..." for a list of source costs.
std::string summary(const std::vector<std::pair<std::string, plan::SourceCost>>& sources,
                    bool count_sources = true) {
  uint64_t need = 0;
  std::vector<uint64_t> fetched(std::size(plan::kCostBlocks), 0);
  for (const auto& [path, c] : sources) {
    need += c.need;
    for (size_t b = 0; b < fetched.size(); ++b) fetched[b] += c.fetched[b];
  }
  std::string out = fmt::format("needs {}", human_bytes(static_cast<double>(need)));
  if (count_sources)
    out += fmt::format(" from {} source{}", sources.size(), sources.size() == 1 ? "" : "s");
  out += "; fetched in blocks of";
  for (size_t b = 0; b < fetched.size(); ++b)
    out += fmt::format("{} {}: {} ({:.2f}x)", b == 0 ? "" : ",", block_name(plan::kCostBlocks[b]),
                       human_bytes(static_cast<double>(fetched[b])),
                       need == 0 ? 0.0 : static_cast<double>(fetched[b]) / need);
  return out;
}

nlohmann::json to_json(const Costed& c) {
  nlohmann::json sources = nlohmann::json::array();
  for (const auto& [path, cost] : c.sources) {
    nlohmann::json fetched = nlohmann::json::object();
    for (size_t b = 0; b < cost.fetched.size(); ++b)
      fetched[std::to_string(plan::kCostBlocks[b])] = cost.fetched[b];
    sources.push_back({{"source", path}, {"need", cost.need}, {"fetched", fetched}});
  }
  return {{"file", c.name}, {"sources", sources}};
}

// Each file's cost (into `each`, if given) and all the files' together: a block two files read
// is fetched once. Keyed by path, since lazily planned ranks each index their own source table.
Costed cost_all(const std::vector<Planned>& planned, const std::filesystem::path& src,
                std::vector<Costed>* each) {
  std::map<std::string, std::vector<plan::Run>> all_runs;
  std::map<std::string, uint64_t> all_sizes;
  for (const Planned& p : planned) {
    std::vector<std::vector<plan::Run>> runs;
    plan::collect_runs(p.target->file, runs);
    for (size_t s = 0; s < runs.size() && s < p.plan->sources.size(); ++s) {
      const std::string path = p.plan->sources[s].file.path.string();
      auto& into = all_runs[path];
      into.insert(into.end(), runs[s].begin(), runs[s].end());
      all_sizes[path] = p.plan->sources[s].file.fingerprint.size;
    }
    if (each) each->push_back(cost_of(p.target->path(), *p.plan, runs, src));
  }
  std::vector<std::vector<plan::Run>> runs;
  std::vector<uint64_t> sizes;
  std::vector<std::string> paths;
  for (auto& [path, r] : all_runs) {
    paths.push_back(path);
    sizes.push_back(all_sizes[path]);
    runs.push_back(std::move(r));
  }
  Costed all{"all files", {}};
  for (plan::SourceCost& c : plan::fetch_cost(runs, sizes, plan::kCostBlocks))
    all.sources.emplace_back(shown(paths[c.source], src), std::move(c));
  return all;
}

void run(const PlanArgs& args) {
  ViewNotes notes;
  const std::unique_ptr<fs::Tree> tree = build_tree(args.view, notes, /*steps=*/false);
  const std::filesystem::path src = std::filesystem::absolute(args.view.src_dir).lexically_normal();
  std::vector<Costed> files;
  const Costed all = cost_all(planned_files(*tree), src, &files);
  if (args.json) {
    nlohmann::json out = {{"blocks", plan::kCostBlocks}, {"files", nlohmann::json::array()}};
    for (const Costed& f : files) out["files"].push_back(to_json(f));
    out["all"] = to_json(all);
    std::cout << out.dump(1) << "\n";
    return;
  }
  notes.say();
  for (const Costed& f : files) {
    std::cout << f.name << ": " << summary(f.sources) << "\n";
    for (const auto& s : f.sources)
      std::cout << "  " << s.first << ": " << summary({s}, false) << "\n";
  }
  std::cout << fmt::format("all {} files: ", files.size()) << summary(all.sources) << "\n";
}

}  // namespace

std::string plan_cost_line(const fs::Tree& tree) {
  if (tree.lazy() != nullptr) return {};
  bool remote = false;
  for (const index::IndexedSource& s : tree.plan().sources)
    remote = remote || on_remote_filesystem(s.file.fd.get());
  if (!remote) return {};
  const Costed all = cost_all(planned_files(tree), {}, nullptr);
  return fmt::format("sources on a remote filesystem; the {} files together: {}",
                     tree.plan().targets.size(), summary(all.sources));
}

void add_plan_command(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* command = add_view_command(
      app, "plan",
      "Show what reading the view costs before anything is read: per target file, the bytes it "
      "needs from each source, and the bytes fetched when sources are read in 4 KiB, 1 MiB or "
      "8 MiB blocks (the read amplification over a network or S3 filesystem)",
      args->view);
  command->add_flag("--json", args->json, "Print the figures as JSON (bytes)");
  command->callback([args] { run(*args); });
}

}  // namespace ckptfs::cli
