#include "ckptfs/source/step_choice.h"

#include <fmt/format.h>
#include <fnmatch.h>

#include <algorithm>
#include <set>
#include <string_view>
#include <vector>

#include "ckptfs/error.h"

namespace ckptfs::source {

namespace fs = std::filesystem;

namespace {

// Naming more ranks or files than this in one line only buries the useful part.
constexpr size_t kMaxNames = 4;

using Kind = StepRequest::Kind;

std::string dir_name(const Listing& l, int64_t rank) {
  return l.ranks.at(rank).dir.filename().string();
}
std::string file_name(const Listing& l, int64_t rank, const Candidate& c) {
  return dir_name(l, rank) + "/" + c.name;
}

std::string name_list(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < kMaxNames; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > kMaxNames) out += fmt::format(" and {} more", names.size() - kMaxNames);
  return out;
}

std::string rank_list(const Listing& l, const std::vector<int64_t>& ranks) {
  std::vector<std::string> names;
  for (int64_t r : ranks) names.push_back(dir_name(l, r));
  return name_list(names);
}

std::string step_text(const Candidate& c) {
  if (!c.step) return "no step in its name";
  return c.breakpoint ? c.step->text() + " (breakpoint)" : c.step->text();
}

// "<what> on rank_0, rank_1 (rank_0/a.ckpt, rank_1/a.ckpt); <what> on rank_3 (...)": the chosen
// file of every rank, grouped by the step its name gives.
std::string grouped(const Listing& l, const std::map<int64_t, const Candidate*>& chosen) {
  std::vector<std::string> labels;  // in order of first rank
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<std::string>>> groups;
  for (const auto& [rank, c] : chosen) {
    const std::string label = step_text(*c);
    auto [it, inserted] = groups.try_emplace(label);
    if (inserted) labels.push_back(label);
    it->second.first.push_back(rank);
    it->second.second.push_back(file_name(l, rank, *c));
  }
  std::string out;
  for (const std::string& label : labels) {
    const auto& [ranks, files] = groups.at(label);
    out += fmt::format("{}{} on {} ({})", out.empty() ? "" : "; ", label, rank_list(l, ranks),
                       name_list(files));
  }
  return out;
}

void require_one_step(const Listing& l, const std::map<int64_t, const Candidate*>& chosen,
                      std::string_view what) {
  std::set<StepKey> steps;
  for (const auto& [rank, c] : chosen)
    if (c->step) steps.insert(*c->step);
  if (steps.size() <= 1) return;
  fail(
      "{}: {} would mix steps across ranks: {}; choose one step with --step EPOCH_STEP, or name "
      "the files with --step FILE-GLOB --allow-mixed-steps",
      l.root.string(), what, grouped(l, chosen));
}

// The last candidate of a rank that passes `keep`, or null.
template <typename Keep>
const Candidate* last_where(const RankDir& dir, Keep keep) {
  for (auto it = dir.candidates.rbegin(); it != dir.candidates.rend(); ++it)
    if (keep(*it)) return &*it;
  return nullptr;
}

// The one non-breakpoint file of `step` in a rank; Error if it has two.
const Candidate* file_of_step(const Listing& l, int64_t rank, const StepKey& step) {
  const Candidate* found = nullptr;
  for (const Candidate& c : l.ranks.at(rank).candidates) {
    if (c.breakpoint || c.step != step) continue;
    if (found)
      fail("{}: {} and {} are both {}; name one with --step FILE-GLOB",
           l.ranks.at(rank).dir.string(), found->name, c.name, step.text());
    found = &c;
  }
  return found;
}

// What was left, appended to a summary. Every count is of checkpoints, a checkpoint being one
// save across the ranks (a step, or the most files of its kind any one rank holds), never of
// files summed over ranks: "8 older checkpoints" and "1 breakpoint checkpoint" on 8 ranks.
std::string left_out(const Listing& l, const std::map<int64_t, const Candidate*>& chosen,
                     const std::optional<StepKey>& step) {
  size_t breakpoints = 0, other = 0;              // the most any one rank holds
  std::vector<int64_t> with_breakpoints;          // the ranks holding one
  std::set<StepKey> older;                        // counted once however many ranks hold it
  std::map<StepKey, std::vector<int64_t>> newer;  // step -> ranks holding it
  for (const auto& [rank, dir] : l.ranks) {
    std::set<StepKey> seen;
    size_t rank_breakpoints = 0, rank_other = 0;
    for (const Candidate& c : dir.candidates) {
      if (&c == chosen.at(rank)) continue;
      if (c.breakpoint) {
        ++rank_breakpoints;
      } else if (step && c.step && *c.step > *step) {
        if (seen.insert(*c.step).second) newer[*c.step].push_back(rank);
      } else if (step && c.step && *c.step < *step) {
        older.insert(*c.step);
      } else {
        ++rank_other;
      }
    }
    if (rank_breakpoints) with_breakpoints.push_back(rank);
    breakpoints = std::max(breakpoints, rank_breakpoints);
    other = std::max(other, rank_other);
  }
  const auto checkpoints = [](size_t n, std::string_view what) {
    return fmt::format("{} {}checkpoint{}", n, what, n == 1 ? "" : "s");
  };
  std::string out;
  if (!older.empty()) out += fmt::format("; {} ignored", checkpoints(older.size(), "older "));
  if (other) out += fmt::format("; {} ignored", checkpoints(other, "other "));
  // Newer steps on every rank were passed over on request; a newer one on only some ranks is
  // what a user most likely wonders about.
  size_t newer_complete = 0;
  std::optional<StepKey> partial;
  for (const auto& [key, ranks] : newer) {
    if (ranks.size() == l.ranks.size())
      ++newer_complete;
    else
      partial = key;
  }
  if (newer_complete) out += fmt::format("; {} ignored", checkpoints(newer_complete, "newer "));
  if (partial) {
    const std::vector<int64_t>& ranks = newer.at(*partial);
    std::vector<int64_t> lacking;
    for (const auto& [rank, dir] : l.ranks)
      if (!std::binary_search(ranks.begin(), ranks.end(), rank)) lacking.push_back(rank);
    out += fmt::format("; {} is not on every rank (missing on {}), not served", partial->text(),
                       rank_list(l, lacking));
  }
  if (breakpoints) {
    out += fmt::format("; {} ignored", checkpoints(breakpoints, "breakpoint "));
    if (with_breakpoints.size() == l.ranks.size())
      out += fmt::format(" (--step breakpoint serves {})", breakpoints == 1 ? "it" : "the newest");
    else
      out += fmt::format(" (on {} only)", rank_list(l, with_breakpoints));
  }
  return out;
}

std::optional<StepKey> common_step(const std::map<int64_t, const Candidate*>& chosen) {
  std::optional<StepKey> step;
  for (const auto& [rank, c] : chosen) {
    if (!c->step || (step && *step != *c->step)) return std::nullopt;
    step = c->step;
  }
  return step;
}

std::string on_all(size_t n) {
  return n == 1 ? "on the one rank" : fmt::format("on all {} ranks", n);
}

Choice finish(const Listing& l, const std::map<int64_t, const Candidate*>& chosen, std::string head,
              bool mixed_allowed) {
  Choice out;
  for (const auto& [rank, c] : chosen) out.files.emplace(rank, l.ranks.at(rank).dir / c->name);
  out.step = common_step(chosen);
  out.summary = std::move(head) + left_out(l, chosen, out.step);
  out.mixed_allowed = mixed_allowed;
  return out;
}

Choice choose_latest(const Listing& l) {
  const size_t n = l.ranks.size();
  std::map<StepKey, size_t> holders;  // step -> ranks that have it
  for (const auto& [rank, dir] : l.ranks) {
    std::set<StepKey> steps;
    for (const Candidate& c : dir.candidates)
      if (!c.breakpoint && c.step) steps.insert(*c.step);
    for (const StepKey& s : steps) ++holders[s];
  }
  std::map<int64_t, const Candidate*> chosen;
  for (auto it = holders.rbegin(); it != holders.rend(); ++it) {
    if (it->second != n) continue;
    for (const auto& [rank, dir] : l.ranks) chosen[rank] = file_of_step(l, rank, it->first);
    return finish(l, chosen, fmt::format("{} {}", it->first.text(), on_all(n)), false);
  }

  // No step on every rank: fall back only where there is nothing to choose between.
  bool single = true, any_step = false;
  std::vector<int64_t> only_breakpoints;
  for (const auto& [rank, dir] : l.ranks) {
    size_t plain = 0;
    for (const Candidate& c : dir.candidates) {
      if (c.step) any_step = true;
      if (!c.breakpoint) ++plain;
    }
    if (plain == 0) only_breakpoints.push_back(rank);
    single = single && plain == 1;
  }
  if (!only_breakpoints.empty())
    fail("{}: {} hold{} only breakpoint checkpoints; serve them with --step breakpoint",
         l.root.string(), rank_list(l, only_breakpoints), only_breakpoints.size() == 1 ? "s" : "");
  for (const auto& [rank, dir] : l.ranks)
    chosen[rank] = last_where(dir, [](const Candidate& c) { return !c.breakpoint; });
  if (single) {
    require_one_step(l, chosen, "the one checkpoint of each rank");
    return finish(l, chosen, fmt::format("one checkpoint per rank {}", on_all(n)), false);
  }
  if (!any_step) {
    return finish(l, chosen,
                  fmt::format("no file name gives a step: the last by name {}", on_all(n)), false);
  }
  fail(
      "{}: no step is saved on every rank (newest of each: {}); choose one with --step "
      "EPOCH_STEP, or name the files with --step FILE-GLOB --allow-mixed-steps",
      l.root.string(), grouped(l, chosen));
}

Choice choose_exact(const Listing& l, const StepKey& step) {
  std::map<int64_t, const Candidate*> chosen;
  std::vector<int64_t> lacking;
  for (const auto& [rank, dir] : l.ranks) {
    if (const Candidate* c = file_of_step(l, rank, step))
      chosen[rank] = c;
    else
      lacking.push_back(rank);
  }
  if (!lacking.empty()) {
    std::vector<std::string> everywhere;
    for (const auto& [key, files] : complete_steps(l)) everywhere.push_back(key.str());
    std::reverse(everywhere.begin(), everywhere.end());
    fail("{}: --step {}: {} {} no {} checkpoint; steps saved on every rank: {}", l.root.string(),
         step.str(), rank_list(l, lacking), lacking.size() == 1 ? "has" : "have", step.text(),
         everywhere.empty() ? "none" : name_list(everywhere));
  }
  return finish(l, chosen,
                fmt::format("{} {} (--step {})", step.text(), on_all(l.ranks.size()), step.str()),
                false);
}

template <typename Keep>
Choice choose_where(const Listing& l, Keep keep, std::string_view what, bool allow_mixed) {
  std::map<int64_t, const Candidate*> chosen;
  std::vector<int64_t> lacking;
  for (const auto& [rank, dir] : l.ranks) {
    if (const Candidate* c = last_where(dir, keep))
      chosen[rank] = c;
    else
      lacking.push_back(rank);
  }
  if (!lacking.empty())
    fail("{}: {}: no matching file on {} ({} of {} ranks have one)", l.root.string(), what,
         rank_list(l, lacking), l.ranks.size() - lacking.size(), l.ranks.size());
  if (!allow_mixed) require_one_step(l, chosen, what);
  const std::optional<StepKey> step = common_step(chosen);
  std::string head =
      step ? fmt::format("{} {} ({})", step->text(), on_all(l.ranks.size()), what)
           : fmt::format("{} {}: {}", what, on_all(l.ranks.size()), grouped(l, chosen));
  return finish(l, chosen, std::move(head), allow_mixed);
}

}  // namespace

StepRequest StepRequest::parse(std::string_view text, bool allow_mixed) {
  StepRequest out;
  out.allow_mixed = allow_mixed;
  const size_t under = text.find('_');
  auto digits = [](std::string_view s) {
    return !s.empty() && s.size() <= 18 &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (text.empty()) {
    fail("--step: give latest, EPOCH_STEP (e.g. 10_100), breakpoint or a file-name glob");
  } else if (text == "latest") {
    out.kind = Kind::Latest;
  } else if (text == "breakpoint") {
    out.kind = Kind::Breakpoint;
  } else if (under != std::string_view::npos && digits(text.substr(0, under)) &&
             digits(text.substr(under + 1))) {
    out.kind = Kind::Exact;
    out.exact = {std::stoll(std::string(text.substr(0, under))),
                 std::stoll(std::string(text.substr(under + 1)))};
  } else {
    out.kind = Kind::Glob;
    out.glob = text;
  }
  if (allow_mixed && out.kind != Kind::Glob)
    fail("--allow-mixed-steps only goes with --step FILE-GLOB, which names the files to mix");
  return out;
}

Choice choose(const Listing& listing, const StepRequest& request) {
  if (listing.ranks.empty())
    fail("{}: no source checkpoints (expected rank_<N>/ directories holding *.ckpt files)",
         listing.root.string());
  switch (request.kind) {
    case Kind::Latest:
      return choose_latest(listing);
    case Kind::Exact:
      return choose_exact(listing, request.exact);
    case Kind::Breakpoint:
      return choose_where(
          listing, [](const Candidate& c) { return c.breakpoint; }, "--step breakpoint", false);
    case Kind::Glob:
      return choose_where(
          listing,
          [&](const Candidate& c) {
            return ::fnmatch(request.glob.c_str(), c.name.c_str(), 0) == 0;
          },
          fmt::format("--step '{}'", request.glob), request.allow_mixed);
  }
  fail("unknown --step kind");
}

std::map<StepKey, std::map<int64_t, fs::path>> complete_steps(const Listing& listing) {
  std::map<StepKey, std::map<int64_t, fs::path>> by_step;
  for (const auto& [rank, dir] : listing.ranks)
    for (const Candidate& c : dir.candidates)
      if (!c.breakpoint && c.step) by_step[*c.step][rank] = dir.dir / c.name;
  std::erase_if(by_step,
                [&](const auto& entry) { return entry.second.size() != listing.ranks.size(); });
  return by_step;
}

}  // namespace ckptfs::source
