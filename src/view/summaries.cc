// A shipped index's target summaries: made by `index build` (summarize_targets) and used by a
// mount to list the exposed ranks and plan each on first open (lazy_tree).

#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "ckptfs/ckpt/crc32.h"
#include "ckptfs/error.h"
#include "ckptfs/fs/lazy_ranks.h"
#include "ckptfs/fs/steps.h"
#include "ckptfs/index/store.h"
#include "ckptfs/plan/source_fit.h"
#include "ckptfs/plan/step_scalars.h"
#include "ckptfs/remote/objects.h"
#include "ckptfs/source/pinned_files.h"
#include "ckptfs/source/step_choice.h"
#include "ckptfs/strategy/compact.h"
#include "ckptfs/strategy/rank_list.h"
#include "ckptfs/strategy/strategy.h"
#include "ckptfs/util/eintr.h"
#include "ckptfs/util/fd.h"
#include "ckptfs/util/open_path.h"
#include "ckptfs/util/out_of_memory.h"
#include "ckptfs/util/rank_set.h"
#include "ckptfs/view/families.h"
#include "ckptfs/view/progress.h"
#include "rank_dirs.h"

namespace ckptfs::view {

namespace detail {

namespace {

uint32_t crc_of(std::string_view bytes) {
  return ckpt::crc32_update(
      0, std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

// A strategy's compact copy as the index stores it: the encoding, then its CRC-32 (8 hex
// digits), so that a damaged copy is refused rather than planned from.
std::string stored_compact(const strategy::Strategy& s) {
  std::string bytes = strategy::encode_compact(s);
  return bytes + fmt::format("{:08x}", crc_of(bytes));
}

bool compact_intact(std::string_view stored) {
  return stored.size() >= 8 && fmt::format("{:08x}", crc_of(stored.substr(0, stored.size() - 8))) ==
                                   stored.substr(stored.size() - 8);
}

// Size and CRC-32 of a strategy file's bytes (a directory's files in name order): what a
// shipped index's summaries are compared by, without parsing.
std::string strategy_digest(const std::string& path) {
  if (path.empty()) return "none";
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {  // anything else open_regular names
    for (const auto& entry : std::filesystem::directory_iterator(path, ec))
      if (entry.is_regular_file(ec)) files.push_back(entry.path());
    if (ec) fail("{}: cannot list the strategy directory: {}", path, ec.message());
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  uint64_t size = 0;
  uint32_t crc = 0;
  std::vector<uint8_t> buf(1 << 20);
  for (const std::filesystem::path& file : files) {
    const UniqueFd fd = util::open_regular(file, "strategy file");
    for (;;) {
      const ssize_t n = retry_eintr([&] { return ::read(fd.get(), buf.data(), buf.size()); });
      if (n < 0) fail("{}: cannot read: {}", file.string(), std::strerror(errno));
      if (n == 0) break;
      crc = ckpt::crc32_update(crc, std::span(buf.data(), static_cast<size_t>(n)));
      size += static_cast<uint64_t>(n);
    }
  }
  return fmt::format("{} bytes crc {:08x} in {} files", size, crc, files.size());
}

std::string absolute_name(const std::filesystem::path& path) {
  std::error_code ec;
  const std::filesystem::path absolute = std::filesystem::absolute(path, ec);
  return (ec ? path : absolute.lexically_normal()).string();
}

// The chosen files as a shipped index keeps them (source/pinned_files.h), by the name the index
// keys them under: an object's URL (which a mount cannot pin: it lists its prefix), else the
// absolute path.
std::string absolute_files_text(const source::Choice& choice) {
  source::Choice absolute = choice;
  for (auto& [rank, path] : absolute.files) path = remote::source_name(path);
  return source::files_text(absolute);
}

struct StrategyDigests {
  std::string src, dst;
};

StrategyDigests strategy_digests(const RankDirs& dirs, const ViewArgs& args) {
  return {strategy_digest(dirs.src_strategy), strategy_digest(args.dst_strategy)};
}

// Where a shipped index keeps the compact copy of a strategy whose files have `digest`.
std::string compact_key(std::string_view side, const std::string& digest) {
  return fmt::format("{} strategy {}", side, digest);
}

// Everything a target summary depends on, in one comparable string; the index stores it
// followed by "targets: <count>\n" (the destination's rank count, so that a mount need not
// parse the strategy to know it).
std::string view_key(const RankDirs& dirs, const ViewArgs& args, const StrategyDigests& digests) {
  const plan::ViewOptions& views = dirs.planning->views;
  const std::string files = absolute_files_text(dirs.choice);
  const uint32_t files_crc = ckpt::crc32_update(
      0, std::span(reinterpret_cast<const uint8_t*>(files.data()), files.size()));
  return fmt::format(
      "ckptfs target summaries 3\nsrc strategy: {}\ndst strategy: {}\nviews: {}{}\nprefix: "
      "{}\nstep: {}{}\nsource files: {} crc {:08x}\n",
      digests.src, digests.dst, views.ckpt ? "ckpt " : "", views.safetensors ? "safetensors" : "",
      views.prefix, args.step, args.allow_mixed_steps ? " (mixed allowed)" : "",
      dirs.choice.files.size(), files_crc);
}

// The target count a stored view ends with, if it is `key`'s; nullopt for another view.
std::optional<int64_t> view_targets(std::string_view stored, std::string_view key) {
  constexpr std::string_view kCount = "targets: ";
  if (!stored.starts_with(key)) return std::nullopt;
  std::string_view rest = stored.substr(key.size());
  if (!rest.starts_with(kCount) || !rest.ends_with('\n')) return std::nullopt;
  rest = rest.substr(kCount.size(), rest.size() - kCount.size() - 1);
  int64_t count = 0;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), count);
  if (ec != std::errc() || end != rest.data() + rest.size() || count < 1) return std::nullopt;
  return count;
}

index::TargetSummary summarize(const plan::Plan& plan, int64_t rank) {
  index::TargetSummary out;
  out.rank = rank;
  for (const plan::TargetFile& target : plan.targets) {
    plan::SourcesRead read = plan::sources_read(plan, target.file);
    out.files.push_back({target.file_name(), target.file.size(), read.newest_mtime_ns,
                         target.page_cache, std::move(read.ranks)});
  }
  out.source_ranks = plan.source_ranks;
  return out;
}

}  // namespace

std::optional<strategy::Strategy> load_compact(std::string_view stored, std::string origin) {
  if (!compact_intact(stored)) return std::nullopt;
  return strategy::decode_compact(stored.substr(0, stored.size() - 8), std::move(origin));
}

std::optional<source::Choice> pinned_files(const std::string& shipped) {
  std::lock_guard lock(shipped_mutex());
  const index::Store store = index::Store::open_shipped(shipped);
  const std::optional<std::string> text = store.targets_files();
  return text ? source::parse_files_text(*text) : std::nullopt;
}

std::unique_ptr<fs::Tree> lazy_tree(const RankDirs& dirs, const ViewArgs& args) {
  const Planning& planning = *dirs.planning;
  if (args.shipped_index.empty() || planning.views.by_stage) return nullptr;
  // An s3:// source's placeholders live in a temp folder the mount removes once the daemon
  // holds them open: a rank planned on first open could not open them. Planned now instead,
  // from the shipped scans (only the step counters are fetched).
  for (const auto& [rank, path] : dirs.choice.files)
    if (remote::object_at(path) != nullptr) return nullptr;
  std::vector<int64_t> shown = planning.views.ranks;
  std::vector<fs::LazyRanks::File> files;
  std::map<int64_t, std::set<int64_t>> loads;  // by rank: the sources its plan loads
  {
    std::lock_guard lock(shipped_mutex());
    const index::Store store = index::Store::open_shipped(args.shipped_index);
    const std::optional<std::string> view = store.targets_view();
    if (!view) {
      spdlog::info(
          "--index {}: no target summaries (built without --dst-strategy): planning the exposed "
          "ranks now",
          args.shipped_index);
      return nullptr;
    }
    const StrategyDigests digests = strategy_digests(dirs, args);
    const std::optional<int64_t> count = view_targets(*view, view_key(dirs, args, digests));
    if (!count) {
      spdlog::warn(
          "--index {}: its target summaries were built for another view (the strategies, "
          "--view, --prefix, --step or the source files differ): planning the exposed ranks now "
          "instead of on first open",
          args.shipped_index);
      return nullptr;
    }
    // A rank the destination lacks: the plan at mount refuses it in its own words.
    if (std::any_of(shown.begin(), shown.end(), [&](int64_t t) { return t < 0 || t >= *count; }))
      return nullptr;
    if (shown.empty())
      for (int64_t t = 0; t < *count; ++t) shown.push_back(t);
    // The strategies as the build parsed these very bytes, decoded on the first plan (an index
    // that lacks a copy is damaged: the mount plans at mount instead).
    if (!planning.src && !planning.dst) {
      Planning::Compact src{dirs.src_strategy, {}}, dst{args.dst_strategy, {}};
      for (auto [c, side, digest] :
           {std::tuple{&src, "src", &digests.src}, std::tuple{&dst, "dst", &digests.dst}}) {
        if (c->origin.empty()) continue;
        std::optional<std::string> bytes = store.targets_extra(compact_key(side, *digest));
        if (!bytes || !compact_intact(*bytes)) {
          spdlog::warn(
              "--index {}: its copy of {} is missing or damaged: planning the exposed "
              "ranks now",
              args.shipped_index, c->origin);
          return nullptr;
        }
        c->bytes = std::move(*bytes);
      }
      planning.compact.emplace(std::move(src), std::move(dst));
    }
    std::set<int64_t> sources;
    std::vector<std::vector<int64_t>> reads;  // files[i] reads the sources of ranks reads[i]
    for (int64_t t : shown) {
      const std::optional<index::TargetSummary> summary = store.target(t);
      if (!summary) {
        spdlog::warn("--index {}: no usable summary of rank {}: planning the exposed ranks now",
                     args.shipped_index, t);
        return nullptr;
      }
      for (const index::TargetSummary::File& f : summary->files) {
        files.push_back({t, f.name, f.size, f.mtime_ns, f.page_cache, {}});
        reads.push_back(f.source_ranks);
      }
      sources.insert(summary->source_ranks.begin(), summary->source_ranks.end());
      loads[t].insert(summary->source_ranks.begin(), summary->source_ranks.end());
    }
    // Each file's access derives from the sources it reads, as an eager mount's does; one that
    // reads none takes that of all the sources the exposed ranks load (an eager mount's plan).
    for (size_t i = 0; i < files.size(); ++i) {
      for (int64_t r :
           reads[i].empty() ? std::vector<int64_t>(sources.begin(), sources.end()) : reads[i]) {
        auto it = dirs.choice.files.find(r);
        if (it == dirs.choice.files.end()) return nullptr;  // the eager path names what is missing
        files[i].sources.push_back(absolute_name(it->second));
      }
    }
    // Only the sources the exposed ranks read, by size and mtime as at build time.
    for (int64_t r : sources) {
      auto it = dirs.choice.files.find(r);
      if (it == dirs.choice.files.end()) return nullptr;  // the eager path names what is missing
      const std::string name = absolute_name(it->second);
      struct stat st;
      if (::stat(name.c_str(), &st) != 0) fail("{}: cannot stat: {}", name, std::strerror(errno));
      const int64_t mtime = int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
      const std::optional<source::Fingerprint> built = store.fingerprint(name);
      if (!built)
        fail(
            "{}: the index {} has no entry for it; rebuild it with `ckptfs index build SRC "
            "--output {}`",
            name, args.shipped_index, args.shipped_index);
      if (built->size != static_cast<uint64_t>(st.st_size) || built->mtime_ns != mtime)
        fail(
            "{}: the index {} was built when it had {} bytes and mtime {} ns; it has {} and {} "
            "now; rebuild it with `ckptfs index build SRC --output {}`",
            name, args.shipped_index, built->size, built->mtime_ns, st.st_size, mtime,
            args.shipped_index);
    }
  }
  auto planning_ptr = dirs.planning;
  const std::map<int64_t, std::filesystem::path> chosen = dirs.choice.files;
  const bool mixed = dirs.choice.mixed_allowed;
  auto lazy = std::make_shared<fs::LazyRanks>(
      std::move(files), [planning_ptr, chosen, mixed, loads = std::move(loads)](int64_t rank) {
        // The sources the build's plan of this rank loaded, from the same pinned files.
        const auto it = loads.find(rank);
        plan::Plan plan = planning_ptr->plan_ranks(chosen, mixed, {rank}, false, nullptr,
                                                   it == loads.end() ? nullptr : &it->second);
        for (const std::string& line : plan.warnings) spdlog::warn("rank {}: {}", rank, line);
        return plan;
      });
  spdlog::info("--index {}: {} ranks listed from its summaries, each planned on first open",
               args.shipped_index, shown.size());
  return std::make_unique<fs::Tree>(std::move(lazy));
}

}  // namespace detail

using namespace detail;

size_t summarize_targets(const ViewArgs& args, index::Store& store,
                         const std::function<void(size_t, size_t)>& progress) {
  util::require_directory(args.src_dir, "source directory");
  const Detected detected = detect(args.src_dir, args.step);
  if (!is_rank_dirs(*detected.family))
    fail("{}: target summaries are for directories of rank_<N>/ checkpoints only", args.src_dir);
  if (args.by_stage) fail("index build: --by-stage views are planned at mount; omit it");
  ViewNotes notes;
  // The strategies' bytes before they are parsed, compared with them after: their compact copies
  // are stored under the digest of the bytes that were parsed.
  const StrategyDigests before{strategy_digest(args.src_strategy),
                               strategy_digest(args.dst_strategy)};
  const RankDirs dirs = prepare_rank_dirs(*detected.family, args, notes);
  Planning& planning = *dirs.planning;
  planning.store = &store;
  // Each target's plan is dropped once summarized: the sources stay open for the next ones.
  planning.opens = std::make_shared<source::OpenFiles>(source::OpenFiles::Keep::kForLife);
  // A summary holds each file's size and sources: the pieces that would serve it are not built.
  planning.views.sizes_only = true;
  const int64_t count = plan::target_count(planning.dst.get());
  std::vector<index::TargetSummary> summaries(static_cast<size_t>(count));
  std::atomic<int64_t> next{0};
  std::atomic<size_t> done{0};
  std::exception_ptr error;
  std::mutex mu;
  const auto worker = [&] {
    Planning::Memos memos;
    for (int64_t t; (t = next.fetch_add(1)) < count;) {
      try {
        const plan::Plan plan =
            planning.plan_ranks(dirs.choice.files, dirs.choice.mixed_allowed, {t}, false, &memos);
        summaries[static_cast<size_t>(t)] = summarize(plan, t);
        if (progress) progress(done.fetch_add(1) + 1, static_cast<size_t>(count));
      } catch (...) {
        std::lock_guard lock(mu);
        if (!error) error = std::current_exception();
        next = count;
      }
    }
  };
  {
    std::vector<std::jthread> helpers;
    for (unsigned i = 1; i < std::clamp(std::thread::hardware_concurrency(), 1u, 2u); ++i)
      helpers.emplace_back(worker);
    worker();
  }
  if (error) std::rethrow_exception(error);
  // With each strategy's compact copy, under the digest of its files, so that a mount neither
  // parses them nor plans until a rank is opened.
  const StrategyDigests digests = strategy_digests(dirs, args);
  if (digests.src != before.src || digests.dst != before.dst)
    fail("index build: a strategy file changed while the index was built; build it again");
  std::vector<std::pair<std::string, std::string>> extra;
  if (planning.src)
    extra.emplace_back(compact_key("src", digests.src), stored_compact(*planning.src));
  if (planning.dst)
    extra.emplace_back(compact_key("dst", digests.dst), stored_compact(*planning.dst));
  store.put_targets(view_key(dirs, args, digests) + fmt::format("targets: {}\n", count),
                    absolute_files_text(dirs.choice), summaries, extra);
  return summaries.size();
}

}  // namespace ckptfs::view
