#include "target_planner.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <span>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "ckptfs/error.h"
#include "ckptfs/plan/read_map.h"
#include "ckptfs/strategy/rank_list.h"
#include "ckptfs/util/shape_text.h"

namespace ckptfs::plan {

using strategy::Layout;
using strategy::TargetMaps;

// A JSON strategy states each parameter's global shape (tensor_shape). MindSpore's transform
// ignores it, but one that disagrees with the checkpoint means a strategy of another model, or a
// checkpoint saved whole read with a sharded strategy: cutting by it would serve wrong blocks.
namespace {

// check_stated_shape for the strategy's entry of the name (null: none), found by the caller.
void check_stated_shape(const strategy::Strategy& s, const strategy::StrategyParam* param,
                        std::string_view name, std::span<const int64_t> global) {
  if (!param) return;
  for (const auto& [stage, layout] : param->stages)
    if (!layout.tensor_shape.empty() &&
        !std::equal(layout.tensor_shape.begin(), layout.tensor_shape.end(), global.begin(),
                    global.end()))
      fail("{}: parameter {} has global shape {} in the strategy but {} in the checkpoint",
           s.origin, name, shape_text(layout.tensor_shape), shape_text(global));
}

}  // namespace

void check_stated_shape(const strategy::Strategy& s, std::string_view name,
                        std::span<const int64_t> global) {
  check_stated_shape(s, s.find(name), name, global);
}

namespace {

// A layout's identity for memo tables: layouts repeat across thousands of parameters.
std::string layout_key(const Layout& layout) {
  std::string key = fmt::format("{}|", fmt::join(layout.axes(), ","));
  for (const auto& dim : layout.dim_axes()) key += fmt::format("{};", fmt::join(dim, ","));
  return key + fmt::format("|{}", fmt::join(layout.splits(), ","));
}

// The source files and what they hold, by global rank. Every distinct parameter name gets an
// id, and each file a table by id, so the planner looks names up once and then indexes.
class SourceSet {
 public:
  static constexpr uint32_t kNoId = std::numeric_limits<uint32_t>::max();

  // A rank may have several files (the parts of a unified checkpoint): they are one file to
  // the planner, in the order given, each name read from the file that holds it.
  SourceSet(std::vector<index::IndexedSource>& sources, const std::vector<int64_t>& ranks) {
    // Files usually list the same names in the same order: a name is compared with the one at
    // its position in the previous file first, and hashed only when they differ.
    const File* prev = nullptr;
    for (size_t i = 0; i < sources.size(); ++i) {
      auto [at, first_part] = by_rank_.try_emplace(ranks[i]);
      File& file = at->second;
      if (first_part) {
        file.index = static_cast<uint32_t>(i);
        file.path = sources[i].file.path.string();
      }
      const size_t base = file.order.size();
      for (const scan::Param& p : sources[i].scan.params) {
        file.order.push_back(&p);
        file.sources.push_back(static_cast<uint32_t>(i));
      }
      file.ids.resize(file.order.size());
      for (size_t k = base; k < file.order.size(); ++k) {
        const scan::Param& p = *file.order[k];
        if (first_part && prev && k < prev->order.size() && prev->order[k]->name == p.name) {
          file.ids[k] = prev->ids[k];
          continue;
        }
        auto [it, inserted] = ids_.try_emplace(p.name, static_cast<uint32_t>(any_.size()));
        if (inserted) any_.push_back(&p);
        file.ids[k] = it->second;
      }
      prev = &file;
    }
    for (auto& [rank, file] : by_rank_) {
      file.by_id.assign(any_.size(), nullptr);
      file.source_by_id.assign(any_.size(), file.index);
      for (size_t k = 0; k < file.ids.size(); ++k) {
        if (file.by_id[file.ids[k]]) continue;
        file.by_id[file.ids[k]] = file.order[k];
        file.source_by_id[file.ids[k]] = file.sources[k];
      }
    }
  }

  // kNoId if no file holds the name.
  uint32_t id_of(std::string_view name) const {
    auto it = ids_.find(name);
    return it == ids_.end() ? kNoId : it->second;
  }
  size_t names() const { return any_.size(); }

  // Some copy of the parameter, for facts every copy shares (its tensor rank).
  const scan::Param* find_any(uint32_t id) const { return id < any_.size() ? any_[id] : nullptr; }

  struct File {
    uint32_t index = 0;  // the source (first part) that names this file in messages
    std::string path;
    std::vector<const scan::Param*> order;
    std::vector<uint32_t> sources;          // the source holding order[k]
    std::vector<uint32_t> ids;              // of order[k]
    std::vector<const scan::Param*> by_id;  // null where the file lacks the name
    std::vector<uint32_t> source_by_id;
    const scan::Param* find(uint32_t id) const { return id < by_id.size() ? by_id[id] : nullptr; }
    // The source a found name is read from.
    uint32_t source_of(uint32_t id) const { return source_by_id[id]; }
  };

  const File* file(int64_t rank) const {
    auto it = by_rank_.find(rank);
    return it == by_rank_.end() ? nullptr : &it->second;
  }

  // The files of ranks [lo, hi), ascending: the few a target loads, not every rank in between.
  template <typename F>
  void for_files(int64_t lo, int64_t hi, F&& f) const {
    for (auto it = by_rank_.lower_bound(lo); it != by_rank_.end() && it->first < hi; ++it)
      f(it->second);
  }

 private:
  std::map<int64_t, File> by_rank_;
  std::unordered_map<std::string_view, uint32_t> ids_;
  std::vector<const scan::Param*> any_;  // by id: the first copy seen
};

}  // namespace

// Local source ranks MindSpore reads for a (source, target) layout pair. Where MindSpore's planner
// has no answer (device counts that are not multiples of each other) every holder of an
// intersecting block is a candidate and none is required.
struct Needed {
  std::vector<int64_t> ranks;
  bool required = true;
};

// Layouts repeat across thousands of parameters: each distinct one gets an id, and what derives
// from layouts alone (block holders, needed ranks) is computed once per id. Keyed by name, so
// one memo serves every plan of the same two strategies (planner.h).
class LayoutMemo {
 public:
  // Forgets everything unless it was computed for these strategies.
  void use_for(const strategy::Strategy* src, const strategy::Strategy* dst) {
    if (used_ && src == src_ && dst == dst_) return;
    *this = LayoutMemo();
    used_ = true;
    src_ = src;
    dst_ = dst;
  }

  struct Pair {
    const Layout* src = nullptr;
    const Layout* dst = nullptr;
    uint32_t src_id = 0;
    uint32_t dst_id = 0;
    std::vector<uint32_t> src_stages;
  };

  // The layouts of a Reshard parameter for targets of the given TargetMaps' stage.
  const Pair& layouts(const TargetMaps& maps, std::string_view name, size_t rank) {
    auto& by_name = by_stage_rank_[{maps.target_stage(), rank}];
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      // Kept only once complete (a layout that cannot be used throws), under a key that outlives
      // the scans it came from: the memo may serve later plans.
      Pair pair;
      pair.src_id = intern(maps.src_layout(name, rank));
      pair.dst_id = intern(maps.dst_layout(name, rank));
      pair.src = &layouts_[pair.src_id];
      pair.dst = &layouts_[pair.dst_id];
      pair.src_stages = maps.src_stages(name);
      it = by_name.emplace(names_.emplace_back(name), std::move(pair)).first;
    }
    return it->second;
  }

  // The source strategy's parameters in its order (load_order_for walks them for every
  // target), with what derives from the strategies and the target's stage alone: the role, and
  // the layouts once asked for a tensor rank. Built once per stage of a view, not per target.
  struct Row {
    TargetMaps::Role role = TargetMaps::Role::Drop;
    const Pair* pair = nullptr;  // for tensor rank `rank`
    size_t rank = 0;
    // The name's entries in both strategies (null where one lacks it), for the stated-shape
    // check of every target without looking the name up again.
    const strategy::StrategyParam* src_param = nullptr;
    const strategy::StrategyParam* dst_param = nullptr;
  };
  std::vector<Row>& rows(const TargetMaps& maps) {
    auto [it, inserted] = rows_.try_emplace(maps.target_stage());
    if (inserted) {
      it->second.reserve(src_->params.size());
      for (const auto& [name, param] : src_->params)
        it->second.push_back(
            {maps.role(name), nullptr, 0, &param, dst_ ? dst_->find(name) : nullptr});
    }
    return it->second;
  }

  // Local ranks holding each block of a layout, by flat block index (C order over splits()).
  const std::vector<std::vector<int64_t>>& holders(uint32_t id) {
    auto [it, inserted] = holders_.try_emplace(id);
    if (inserted) {
      const Layout& layout = layouts_[id];
      const auto& splits = layout.splits();
      const int64_t blocks =
          std::accumulate(splits.begin(), splits.end(), int64_t{1}, std::multiplies<>());
      it->second.resize(static_cast<size_t>(blocks));
      for (int64_t r = 0; r < layout.devices(); ++r)
        it->second[static_cast<size_t>(flat_block(layout.block_of(r), splits))].push_back(r);
    }
    return it->second;
  }

  const Needed& needed(const Pair& pair, int64_t t_local) {
    auto [it, inserted] = needed_.try_emplace(std::tuple{pair.src_id, pair.dst_id, t_local});
    if (inserted) {
      strategy::NeededAnswer answer = strategy::mindspore_answer(*pair.src, *pair.dst, t_local);
      if (answer.found())
        it->second.ranks = std::move(answer.ranks);
      else
        it->second = Needed{strategy::minimal_needed(*pair.src, *pair.dst, t_local), false};
    }
    return it->second;
  }

  static int64_t flat_block(const std::vector<int64_t>& block, const std::vector<int64_t>& splits) {
    int64_t flat = 0;
    for (size_t j = 0; j < block.size(); ++j) flat = flat * splits[j] + block[j];
    return flat;
  }

 private:
  bool used_ = false;
  const strategy::Strategy* src_ = nullptr;
  const strategy::Strategy* dst_ = nullptr;

  uint32_t intern(Layout layout) {
    auto [it, inserted] = ids_.try_emplace(layout_key(layout), static_cast<uint32_t>(ids_.size()));
    if (inserted) layouts_.push_back(std::move(layout));
    return it->second;
  }

  std::deque<Layout> layouts_;     // by id; a deque keeps Pair pointers valid
  std::deque<std::string> names_;  // the keys of by_stage_rank_
  std::unordered_map<std::string, uint32_t> ids_;
  // (target stage, tensor rank) -> parameter name -> its layouts
  std::map<std::pair<int64_t, size_t>, std::unordered_map<std::string_view, Pair>> by_stage_rank_;
  std::unordered_map<uint32_t, std::vector<std::vector<int64_t>>> holders_;
  std::map<std::tuple<uint32_t, uint32_t, int64_t>, Needed> needed_;
  std::map<int64_t, std::vector<Row>> rows_;  // by target stage

 public:
  CoveredNames covered;
  std::vector<std::string> as_saved;
};

CoveredNames& covered_names(LayoutMemo& memo) { return memo.covered; }
std::vector<std::string>& as_saved_names(LayoutMemo& memo) { return memo.as_saved; }

namespace {

// Global shape of a resharded parameter, checked once against every source copy of its stage.
struct ParamFacts {
  std::vector<int64_t> global_shape;
  std::string dtype;
  uint32_t element_size = 0;
};

// A parameter as the planner walks it: one copy, and its name's id in the SourceSet.
struct ParamRef {
  const scan::Param* param = nullptr;
  uint32_t id = SourceSet::kNoId;
};

}  // namespace

class Planner {
 public:
  // `ranks`: the rank each of plan.sources plays (plan.source_ranks, or stage-local ranks).
  // `located`: make_located_plan's sources (every file loaded, any holder as good as another).
  // `memo`: kept across plans of the same strategies (null: this planner's own).
  Planner(Plan& plan, const strategy::Strategy* src, const strategy::Strategy* dst,
          bool safetensors_rules, const std::vector<int64_t>& ranks, bool located = false,
          LayoutMemo* memo = nullptr)
      : files_(plan.sources, ranks),
        src_(src),
        dst_(dst),
        safetensors_rules_(safetensors_rules),
        located_(located),
        layouts_(memo ? *memo : own_layouts_) {
    layouts_.use_for(src, dst);
    if (located_) {
      std::set<int64_t> distinct;
      for (int64_t g : ranks)
        if (g >= 0) distinct.insert(g);
      every_rank_.assign(distinct.rbegin(), distinct.rend());
    }
  }

  // Safetensors sources saved in pipeline stages: MindSpore transforms each source stage on its
  // own and merges the results with dict.update in stage order, so an entry keeps the place the
  // first stage gave it and the value of the last (seen so with MindSpore 2.7.2).
  std::vector<Entry> by_stage(const TargetMaps& maps, const std::vector<int64_t>& load_order,
                              int64_t t) {
    std::vector<Entry> entries;
    std::unordered_map<std::string_view, size_t> at;
    for (int64_t st = 0; st < static_cast<int64_t>(src_->num_stages); ++st) {
      std::vector<int64_t> stage_order;
      for (int64_t g : load_order)
        if (stage_of(g) == st) stage_order.push_back(g);
      if (stage_order.empty()) continue;
      for (Entry& e : entries_for(maps, stage_order, t)) {
        auto [it, inserted] = at.try_emplace(e.name, entries.size());
        if (inserted)
          entries.push_back(std::move(e));
        else
          entries[it->second] = std::move(e);
      }
    }
    return entries;
  }

  // The entries of target t, in the .ckpt view's record order: resharded parameters in L order,
  // then passthrough entries.
  std::vector<Entry> plan_target(int64_t t) {
    TargetMaps maps(src_, dst_, t);
    per_name_.assign(files_.names(), {});
    const std::vector<int64_t> load_order = load_order_for(maps);
    if (safetensors_rules_ && src_ && src_->num_stages > 1) return by_stage(maps, load_order, t);
    return entries_for(maps, load_order, t);
  }

  // What loading the files of `load_order` gives target t: resharded parameters in L order, then
  // passthrough entries.
  std::vector<Entry> entries_for(const TargetMaps& maps, const std::vector<int64_t>& load_order,
                                 int64_t t) {
    std::vector<Entry> entries;
    std::vector<ParamRef> passthrough;
    size_t resharded = 0;
    for (const ParamRef& ref : first_appearance(load_order)) {
      const scan::Param& p = *ref.param;
      switch (role_of(maps, ref.id, p.name)) {
        case TargetMaps::Role::Drop:
          break;
        case TargetMaps::Role::Reshard:
          if (p.kind == scan::EntryKind::Tensor) {
            entries.push_back(resharded_entry(maps, ref, t));
            ++resharded;
          } else {
            require_unsplit(maps, p);
            passthrough.push_back(ref);
          }
          break;
        case TargetMaps::Role::Passthrough:
          passthrough.push_back(ref);
          break;
      }
    }
    // MindSpore's safetensors transform does not check this, and then copies passthrough
    // entries from local rank 0 (spec mindspore-safetensors.md §2.2).
    if (resharded == 0 && !safetensors_rules_)
      fail(
          "target rank {}: none of the parameters in the source checkpoints is in the source or "
          "destination strategy",
          t);
    const int64_t local = resharded == 0 ? 0 : maps.target_local() % maps.src_devices();
    for (const ParamRef& ref : passthrough)
      entries.push_back(passthrough_entry(maps, ref, load_order, local, t));
    return entries;
  }

 private:
  // L of spec §4.4: names in first-appearance order over the loaded files, each file read in
  // its name order (file_order); targets with the same load order share it.
  const std::vector<ParamRef>& first_appearance(const std::vector<int64_t>& load_order) {
    auto [it, inserted] = orders_.try_emplace(load_order);
    if (inserted) {
      std::vector<bool> seen(files_.names(), false);
      for (int64_t g : load_order) {
        const SourceSet::File* f = files_.file(g);
        if (!f) continue;
        for (uint32_t id : file_order(g, *f)) {
          if (seen[id]) continue;
          seen[id] = true;
          it->second.push_back({copy_of(id, f, load_order), id});
        }
      }
    }
    return it->second;
  }

  int64_t stage_of(int64_t g) const { return src_ ? g / src_->devices_per_stage : 0; }

  // A copy of the name for facts all copies share: `f`'s, else the first loaded file's holding
  // it, else any (a deduplicated save keeps a block in only one file of a group).
  const scan::Param* copy_of(uint32_t id, const SourceSet::File* f,
                             const std::vector<int64_t>& load_order) const {
    if (const scan::Param* p = f->find(id)) return p;
    for (int64_t g : load_order)
      if (const SourceSet::File* other = files_.file(g))
        if (const scan::Param* p = other->find(id)) return p;
    return files_.find_any(id);
  }

  // The order file g's names are read in for L. MindSpore reads each file in its own record
  // order, so where files of a save list their records in different orders, the file it loads
  // first decides (seen so with MindSpore 2.7.2). A deduplicated file lacks names that other
  // files of its stage hold and no longer shows where the full save had them: it is read in the
  // stage's common order instead (stage_order).
  const std::vector<uint32_t>& file_order(int64_t g, const SourceSet::File& f) {
    const std::vector<uint32_t>& common = stage_order(stage_of(g));
    auto [it, inserted] = holds_stage_.try_emplace(g);
    if (inserted)
      it->second =
          std::all_of(common.begin(), common.end(), [&](uint32_t id) { return f.find(id); });
    return it->second ? f.ids : common;
  }

  // The common name order of a stage's files, which its deduplicated files are read in: the
  // order every file of the stage agrees with, a topological merge of their orders (files in
  // rank order), where names the files leave unordered go by first appearance over the files in
  // rank order. Files that list the same names in the same order give that order.
  const std::vector<uint32_t>& stage_order(int64_t stage) {
    auto [it, inserted] = stage_orders_.try_emplace(stage);
    if (!inserted) return it->second;
    std::vector<const std::vector<uint32_t>*> distinct;  // the stage's different orders
    const int64_t devices = src_ ? src_->devices_per_stage : 1;
    for (int64_t g = stage * devices; g < (stage + 1) * devices; ++g) {
      const SourceSet::File* f = files_.file(g);
      if (!f) continue;
      if (std::none_of(distinct.begin(), distinct.end(), [&](auto* d) { return *d == f->ids; }))
        distinct.push_back(&f->ids);
    }
    std::vector<uint32_t>& order = it->second;
    if (distinct.size() == 1) order = *distinct.front();
    if (distinct.size() <= 1) return order;

    constexpr uint32_t kUnseen = std::numeric_limits<uint32_t>::max();
    std::vector<uint32_t> first(files_.names(), kUnseen);  // id -> first-appearance rank
    std::vector<uint32_t> by_first;                        // first-appearance rank -> id
    std::vector<uint32_t> indegree(files_.names(), 0);
    std::vector<std::vector<uint32_t>> next(files_.names());
    for (const std::vector<uint32_t>* ids : distinct) {
      for (size_t k = 0; k < ids->size(); ++k) {
        const uint32_t id = (*ids)[k];
        if (first[id] == kUnseen) {
          first[id] = static_cast<uint32_t>(by_first.size());
          by_first.push_back(id);
        }
        if (k > 0) {
          next[(*ids)[k - 1]].push_back(id);
          ++indegree[id];
        }
      }
    }
    // Ready names by first appearance; on a cycle (files disagree) the earliest left goes next.
    std::set<uint32_t> ready, left;
    for (uint32_t id : by_first) {
      left.insert(first[id]);
      if (indegree[id] == 0) ready.insert(first[id]);
    }
    while (!left.empty()) {
      const uint32_t pos = ready.empty() ? *left.begin() : *ready.begin();
      ready.erase(pos);
      left.erase(pos);
      const uint32_t id = by_first[pos];
      order.push_back(id);
      for (uint32_t n : next[id])
        if (--indegree[n] == 0 && left.count(first[n])) ready.insert(first[n]);
    }
    return order;
  }

  // Global source ranks loaded for target t, descending (spec §4.5, §4.6).
  std::vector<int64_t> load_order_for(const TargetMaps& maps) {
    if (!src_) return {0};
    // No rank's file lists every name when only some ranks store a block.
    if (located_) return every_rank_;
    std::set<int64_t> locals;
    std::set<uint32_t> stages;
    std::unordered_set<const Needed*> merged_lists;
    std::vector<LayoutMemo::Row>& rows = layouts_.rows(maps);
    size_t k = 0;
    for (const auto& [name, param] : src_->params) {
      LayoutMemo::Row& row = rows[k++];
      const uint32_t id = files_.id_of(name);
      if (id != SourceSet::kNoId) {
        per_name_[id].role = row.role;
        per_name_[id].row = &row;
      }
      if (row.role != TargetMaps::Role::Reshard) continue;
      // The checkpoint's own tensor rank, so a map of the wrong length is blamed on its file.
      const scan::Param* copy = files_.find_any(id);
      const size_t rank =
          copy ? copy->shape.size() : param.stages.begin()->second.tensor_map.size();
      if (!row.pair || row.rank != rank) {
        row.pair = &layouts_.layouts(maps, name, rank);  // the memo's nodes do not move
        row.rank = rank;
      }
      const LayoutMemo::Pair& pair = *row.pair;
      if (id != SourceSet::kNoId) {
        per_name_[id].pair = row.pair;
        per_name_[id].rank = rank;
      }
      const Needed& needed = layouts_.needed(pair, maps.target_local());
      // Thousands of parameters share a few rank lists: each is merged in once.
      if (merged_lists.insert(&needed).second)
        locals.insert(needed.ranks.begin(), needed.ranks.end());
      if (pair.src_stages.size() != 1 || !stages.count(pair.src_stages[0]))
        stages.insert(pair.src_stages.begin(), pair.src_stages.end());
    }
    if (locals.empty()) {
      // A destination strategy sharing no name with the source's is another model's: the fault
      // is in the file given as --dst-strategy, whatever the source strategy holds.
      if (dst_ && !dst_->params.empty() &&
          std::none_of(dst_->params.begin(), dst_->params.end(),
                       [&](const auto& p) { return src_->find(p.first) != nullptr; }))
        fail(
            "the destination strategy {} names {} parameters, none of them in these checkpoints "
            "(such as {}); give a destination strategy of this model",
            dst_->origin, dst_->params.size(), dst_->params.begin()->first);
      fail("target rank {}: the source strategy {} has no parameter for this target's stage",
           maps.target_local() + maps.target_stage() * maps.dst_devices(), src_->origin);
    }
    // MindSpore's list always holds t_local mod N_src (the passthrough source); keep that true
    // where the minimal set stands in for it.
    locals.insert(maps.target_local() % maps.src_devices());
    std::vector<int64_t> ranks;
    for (uint32_t st : stages)
      for (int64_t r : locals) ranks.push_back(static_cast<int64_t>(st) * maps.src_devices() + r);
    std::sort(ranks.rbegin(), ranks.rend());
    if (by_stage_load_order_) return by_stage_load_order();
    return ranks;
  }

  // The ranks with files of a one-stage (by-stage) planner, ascending.
  std::vector<int64_t> by_stage_load_order() const {
    std::vector<int64_t> ranks;
    for (int64_t g = 0; g < src_->devices_per_stage; ++g)
      if (files_.file(g)) ranks.push_back(g);
    return ranks;
  }

  // The role of a name for the target being planned, and its layouts for a tensor rank: the
  // load order and the entries both ask for every name, so each is looked up once per target.
  TargetMaps::Role role_of(const TargetMaps& maps, uint32_t id, std::string_view name) {
    if (id == SourceSet::kNoId) return maps.role(name);
    std::optional<TargetMaps::Role>& role = per_name_[id].role;
    if (!role) role = maps.role(name);
    return *role;
  }
  const LayoutMemo::Pair& layouts_of(const TargetMaps& maps, uint32_t id, std::string_view name,
                                     size_t rank) {
    if (id == SourceSet::kNoId) return layouts_.layouts(maps, name, rank);
    PerName& known = per_name_[id];
    if (!known.pair || known.rank != rank) {
      known.pair = &layouts_.layouts(maps, name, rank);  // the memo's nodes do not move
      known.rank = rank;
    }
    return *known.pair;
  }

  const ParamFacts& facts_for(const TargetMaps& maps, const ParamRef& ref, uint32_t stage,
                              const Layout& src_layout) {
    const scan::Param& p = *ref.param;
    auto [it, inserted] = facts_.try_emplace(ref.id);
    if (!inserted) return it->second;
    ParamFacts& facts = it->second;
    facts.global_shape = src_layout.global_shape(p.shape);
    // The strategies' entries as load_order_for found them (maps holds this planner's
    // strategies), else looked up here.
    const LayoutMemo::Row* row = ref.id < per_name_.size() ? per_name_[ref.id].row : nullptr;
    if (maps.src())
      check_stated_shape(*maps.src(), row ? row->src_param : maps.src()->find(p.name), p.name,
                         facts.global_shape);
    if (maps.dst())
      check_stated_shape(*maps.dst(), row ? row->dst_param : maps.dst()->find(p.name), p.name,
                         facts.global_shape);
    facts.dtype = p.dtype;
    facts.element_size = p.element_size;
    // Every copy in the stage must be the slice the layout says, of the same type.
    const std::vector<int64_t> slice = src_layout.slice_shape(facts.global_shape, p.name);
    const int64_t first = int64_t{stage} * maps.src_devices();
    files_.for_files(first, first + maps.src_devices(), [&](const SourceSet::File& f) {
      const scan::Param* copy = f.find(ref.id);
      if (!copy) return;
      if (copy->shape != slice || copy->dtype != p.dtype || copy->kind != p.kind)
        fail(
            "parameter {}: {} holds a {} {} slice but {} {} was expected from the other ranks "
            "and the source strategy",
            p.name, f.path, copy->dtype, shape_text(copy->shape), p.dtype, shape_text(slice));
    });
    return facts;
  }

  Entry resharded_entry(const TargetMaps& maps, const ParamRef& ref, int64_t t) {
    const scan::Param& p = *ref.param;
    const size_t rank = p.shape.size();
    const LayoutMemo::Pair& pair = layouts_of(maps, ref.id, p.name, rank);
    const Layout& src = *pair.src;
    const Layout& dst = *pair.dst;
    const uint32_t stage = pair.src_stages.front();
    const ParamFacts& facts = facts_for(maps, ref, stage, src);

    dst.slice_shape(facts.global_shape, p.name);  // divisibility check
    const strategy::Box box = dst.slice_of(maps.target_local(), facts.global_shape);

    auto content = std::make_shared<TensorContent>();
    content->element_size = facts.element_size;
    // A scalar is a one-element box: the read map works on rank >= 1.
    const bool scalar = rank == 0;
    const auto& splits = src.splits();
    // Sized once: a target of 100,000 tensors builds as many contents on every plan.
    for (std::vector<int64_t>* v : {&content->target_begin, &content->target_shape,
                                    &content->block_shape, &content->first_block, &content->grid})
      v->reserve(std::max<size_t>(rank, 1));
    for (size_t j = 0; j < rank; ++j) {
      const int64_t block = facts.global_shape[j] / splits[j];
      content->target_begin.push_back(box.begin[j]);
      content->target_shape.push_back(box.end[j] - box.begin[j]);
      content->block_shape.push_back(block);
    }
    if (scalar) {
      content->target_begin = {0};
      content->target_shape = {1};
      content->block_shape = {1};
    }
    Entry entry{p.name,  facts.dtype, scan::EntryKind::Tensor, {}, content, nullptr, 0,
                nullptr, nullptr};
    entry.shape = scalar ? std::vector<int64_t>{} : content->target_shape;
    if (content->nbytes() == 0) return entry;

    const auto& holders = layouts_.holders(pair.src_id);
    const Needed& needed = layouts_.needed(pair, maps.target_local());
    const std::vector<int64_t>& preferred = needed.ranks;
    // The same files MindSpore would insist on, so a view never silently depends on which
    // replicas happen to be present.
    for (int64_t local :
         needed.required && !located_ && !partial_ ? preferred : std::vector<int64_t>{}) {
      const int64_t g = stage * maps.src_devices() + local;
      if (!files_.file(g)) missing_rank(g, t, p.name);
    }
    std::vector<int64_t> last(content->target_shape.size());
    for (size_t j = 0; j < content->target_shape.size(); ++j) {
      const int64_t b = content->block_shape[j];
      content->first_block.push_back(content->target_begin[j] / b);
      last[j] = (content->target_begin[j] + content->target_shape[j] - 1) / b;
      content->grid.push_back(last[j] - content->first_block[j] + 1);
    }
    content->blocks.reserve(static_cast<size_t>(std::accumulate(
        content->grid.begin(), content->grid.end(), int64_t{1}, std::multiplies<>())));
    // Walk the intersecting blocks in C order and pick, for each, the replica MindSpore reads
    // (the holder in its needed set) or else any holder whose file exists.
    std::vector<int64_t> coord = content->first_block;
    static const std::vector<int64_t> kScalarSplits{1};
    const std::vector<int64_t>& split_vec = scalar ? kScalarSplits : splits;
    for (bool more = true; more;) {
      const auto& candidates =
          holders[static_cast<size_t>(LayoutMemo::flat_block(coord, split_vec))];
      content->blocks.push_back(pick_block(ref, stage, maps, candidates, preferred, t));
      more = false;
      for (size_t j = coord.size(); j-- > 0;) {
        if (++coord[j] <= last[j]) {
          more = true;
          break;
        }
        coord[j] = content->first_block[j];
      }
    }

    return entry;
  }

  [[noreturn]] static void missing_rank(int64_t g, int64_t t, std::string_view param) {
    fail(
        "the checkpoint of source rank {} (rank_{}/) is needed for target rank {} "
        "(parameter {}) but is missing",
        g, g, t, param);
  }

  SourceBlock pick_block(const ParamRef& ref, uint32_t stage, const TargetMaps& maps,
                         const std::vector<int64_t>& candidates,
                         const std::vector<int64_t>& preferred, int64_t t) {
    // The block of source rank `local`, if its file is there and holds the parameter.
    auto usable = [&](int64_t local) -> SourceBlock {
      const SourceSet::File* f = files_.file(stage * maps.src_devices() + local);
      const scan::Param* p = f ? f->find(ref.id) : nullptr;
      return p ? SourceBlock{f->source_of(ref.id), p} : SourceBlock{};
    };
    for (int64_t local : candidates)
      if (std::binary_search(preferred.begin(), preferred.end(), local))
        if (const SourceBlock b = usable(local); b.param) return b;
    for (int64_t local : candidates)
      if (const SourceBlock b = usable(local); b.param) return b;
    const int64_t g = stage * maps.src_devices() + candidates.front();
    if (candidates.size() == 1) {
      if (!files_.file(g)) missing_rank(g, t, ref.param->name);
      fail(
          "parameter {} is needed from source rank {} for target rank {}, but {} does not hold "
          "it",
          ref.param->name, g, t, files_.file(g)->path);
    }
    // Several ranks hold this block: a deduplicated save keeps it in one of them.
    std::vector<int64_t> ranks;
    for (int64_t local : candidates) ranks.push_back(stage * maps.src_devices() + local);
    fail(
        "parameter {}: no source file holds the block target rank {} needs; source ranks {} hold "
        "identical blocks and none of their files contains it (a deduplicated save keeps each "
        "block in one of them): the checkpoint is incomplete, or the source strategy is not the "
        "one it was saved with",
        ref.param->name, t, fmt::join(ranks, ", "));
  }

  // Strings, map tensors and opaque types (Int4, ...) have no element grid to cut: they are
  // copied, which is only right when neither side splits them.
  static void require_unsplit(const TargetMaps& maps, const scan::Param& p) {
    const size_t rank = p.shape.size();
    for (const Layout& layout : {maps.src_layout(p.name, rank), maps.dst_layout(p.name, rank)})
      for (int64_t split : layout.splits())
        if (split != 1)
          fail("parameter {}: a {} entry cannot be resharded, but a strategy splits it", p.name,
               p.dtype.empty() ? "map tensor" : p.dtype);
  }

  // Passthrough: the entry of the file with local index `local` (t_local mod N_src), lowest
  // stage first (spec §4.4 step 3, §7).
  Entry passthrough_entry(const TargetMaps& maps, const ParamRef& ref,
                          const std::vector<int64_t>& load_order, int64_t local, int64_t t) {
    // Lowest global rank first, among the files with that local index (or among any).
    auto lowest_holder = [&](bool same_local) -> const SourceSet::File* {
      for (auto it = load_order.rbegin(); it != load_order.rend(); ++it) {
        const SourceSet::File* f = files_.file(*it);
        if (f && f->find(ref.id) && (!same_local || *it % maps.src_devices() == local)) return f;
      }
      return nullptr;
    };
    const SourceSet::File* from = lowest_holder(true);
    // A deduplicated save keeps a strategy parameter's block in one file of its group.
    if (!from) from = identical_block_holder(maps, ref, local);
    // Files that say where each entry is (MindFormers' metadata) store a shared one once.
    if (!from && located_) from = lowest_holder(false);
    if (!from) missing_passthrough(maps, ref, load_order, local, t);
    const scan::Param& q = *from->find(ref.id);
    return Entry{q.name,  q.dtype, q.kind, q.shape, nullptr, &q, from->source_of(ref.id),
                 nullptr, nullptr};
  }

  // An entry the strategies do not split (learning_rate, global_step, a rank's own state) is
  // each rank's own: MindSpore takes it from the file of local rank `local` and fails without
  // it. Another rank's value may differ, so it never stands in (a file cut between records
  // looks complete).
  [[noreturn]] void missing_passthrough(const TargetMaps& maps, const ParamRef& ref,
                                        const std::vector<int64_t>& load_order, int64_t local,
                                        int64_t t) const {
    int64_t g = local;
    for (auto it = load_order.rbegin(); it != load_order.rend(); ++it)
      if (*it % maps.src_devices() == local) {
        g = *it;
        break;
      }
    const SourceSet::File* f = files_.file(g);
    fail(
        "parameter {}: target rank {} takes it from source rank {}, but {} does not hold it "
        "(another rank's value is not substituted): the file is incomplete (a save cut short?); "
        "restore it, or mount a complete step (--step)",
        ref.param->name, t, g, f ? f->path : fmt::format("rank_{}/", g));
  }

  // A file of the parameter's stage whose rank holds the same source block as local rank
  // `local` and that contains it: where a deduplicated save put what `local`'s file lacks.
  const SourceSet::File* identical_block_holder(const TargetMaps& maps, const ParamRef& ref,
                                                int64_t local) const {
    const scan::Param& p = *ref.param;
    if (!src_ || !src_->find(p.name) || p.kind != scan::EntryKind::Tensor) return nullptr;
    const Layout layout = maps.src_layout(p.name, p.shape.size());
    const std::vector<int64_t> block = layout.block_of(local);
    for (uint32_t st : maps.src_stages(p.name))
      for (int64_t r = 0; r < maps.src_devices(); ++r)
        if (layout.block_of(r) == block)
          if (const SourceSet::File* f = files_.file(st * maps.src_devices() + r);
              f && f->find(ref.id))
            return f;
    return nullptr;
  }

  SourceSet files_;
  const strategy::Strategy* src_;
  const strategy::Strategy* dst_;
  bool safetensors_rules_;
  bool located_;
  std::vector<int64_t> every_rank_;  // located_: the ranks with files, descending
  // Some target ranks only, from the files they read: MindSpore's other replicas are not
  // required to be present (set_partial).
  bool partial_ = false;
  // The by-stage transform's load order (set_by_stage_load_order).
  bool by_stage_load_order_ = false;

 public:
  void set_partial() { partial_ = true; }
  // MindSpore's by-stage transform loads every file of the stage, lowest rank first (§4.7), so
  // its records follow the lowest rank's file where files disagree (seen with MindSpore 2.7.2).
  void set_by_stage_load_order() { by_stage_load_order_ = true; }

 private:
  LayoutMemo own_layouts_;
  LayoutMemo& layouts_;
  std::map<std::vector<int64_t>, std::vector<ParamRef>> orders_;  // by load order
  std::map<int64_t, std::vector<uint32_t>> stage_orders_;         // name ids, by stage
  // By rank: whether its file holds every name of its stage (file_order).
  std::map<int64_t, bool> holds_stage_;
  std::unordered_map<uint32_t, ParamFacts> facts_;  // by name id
  // By name id, for the target being planned (plan_target resets it: roles follow its stage).
  struct PerName {
    std::optional<TargetMaps::Role> role;
    const LayoutMemo::Pair* pair = nullptr;
    size_t rank = 0;
    const LayoutMemo::Row* row = nullptr;  // the source strategy's row of the name
  };
  std::vector<PerName> per_name_;
};

TargetPlanner::TargetPlanner(Plan& plan, const strategy::Strategy* src,
                             const strategy::Strategy* dst, bool safetensors_rules,
                             const std::vector<int64_t>& ranks, bool located, LayoutMemo* memo)
    : impl_(std::make_unique<Planner>(plan, src, dst, safetensors_rules, ranks, located, memo)) {}
TargetPlanner::~TargetPlanner() = default;
TargetPlanner::TargetPlanner(TargetPlanner&&) noexcept = default;
TargetPlanner& TargetPlanner::operator=(TargetPlanner&&) noexcept = default;

std::vector<Entry> TargetPlanner::plan_target(int64_t t) { return impl_->plan_target(t); }
void TargetPlanner::set_partial() { impl_->set_partial(); }
void TargetPlanner::set_by_stage_load_order() { impl_->set_by_stage_load_order(); }

std::shared_ptr<LayoutMemo> new_layout_memo() { return std::make_shared<LayoutMemo>(); }

}  // namespace ckptfs::plan
