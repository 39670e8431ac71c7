#include "ckptfs/fs/steps.h"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <deque>
#include <mutex>
#include <set>
#include <thread>

#include "ckptfs/error.h"
#include "ckptfs/fs/tree.h"
#include "ckptfs/source/step_choice.h"
#include "ckptfs/util/fd.h"

namespace ckptfs::fs {

namespace {

using Files = std::map<int64_t, std::filesystem::path>;
using Clock = std::chrono::steady_clock;

// What makes a rank directory's listing change: a save renamed into place or closed, a file
// deleted or renamed away. Creation alone is not completion.
constexpr uint32_t kRankDirEvents =
    IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF;
constexpr uint32_t kRootEvents = IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE;
constexpr int kPollMs = 1000;

}  // namespace

struct Steps::Impl {
  std::filesystem::path src_dir;
  PlanStep plan_step;

  struct Step {
    uint32_t index = 0;
    Files files;
    std::shared_ptr<const Tree> tree;
    bool failed = false;  // planning failed once (logged); retried on every lookup
  };

  std::mutex mutex;  // guards everything below
  std::map<source::StepKey, Step> steps;
  std::map<uint32_t, source::StepKey> key_of;
  std::deque<std::string> names;  // by index; never shrinks, so views stay valid
  std::vector<std::pair<Clock::time_point, std::shared_ptr<const Tree>>> dropped;
  bool listed = false;

  std::mutex plan_mutex;  // one step planned at a time: planning reads and indexes files
  // One refresh at a time, listing and applying: the watcher's refresh and a caller's may run
  // together, and a listing taken earlier must not be applied after a later one (a deleted step
  // would come back until the next change). Taken before `mutex`.
  std::mutex refresh_mutex;

  std::once_flag watcher_once;
  std::thread watcher;
  UniqueFd stop;

  void start() {
    std::call_once(watcher_once, [this] {
      stop = UniqueFd(::eventfd(0, EFD_CLOEXEC));
      if (!stop) {
        spdlog::warn("steps/: no eventfd ({}); new steps show at the next lookup only",
                     std::strerror(errno));
        return;
      }
      watcher = std::thread([this] { watch(); });
    });
  }

  void refresh_locked(const source::Listing& listing) {
    auto current = source::complete_steps(listing);
    const Clock::time_point now = Clock::now();
    for (auto it = steps.begin(); it != steps.end();) {
      auto found = current.find(it->first);
      if (found != current.end() && found->second == it->second.files) {
        ++it;
        continue;
      }
      // Gone, or other files now: a new index, so the kernel's cached inodes of the old files
      // never reach the new ones.
      if (it->second.tree) dropped.emplace_back(now, std::move(it->second.tree));
      key_of.erase(it->second.index);
      spdlog::info("steps/{}: gone", names[it->second.index]);
      it = steps.erase(it);
    }
    for (auto& [key, files] : current) {
      if (steps.count(key)) continue;
      Step step;
      step.index = static_cast<uint32_t>(names.size());
      names.push_back(key.str());
      step.files = std::move(files);
      key_of.emplace(step.index, key);
      spdlog::info("steps/{}: complete on all {} ranks", names.back(), step.files.size());
      steps.emplace(key, std::move(step));
    }
    std::erase_if(dropped, [&](const auto& d) { return now - d.first > kGrace; });
    listed = true;
  }

  void refresh() {
    std::lock_guard serial(refresh_mutex);
    source::Listing listing;
    try {
      listing = source::list_sources(src_dir);
    } catch (const Error& e) {
      spdlog::warn("steps/: {}", e.what());
      return;
    }
    std::lock_guard lock(mutex);
    refresh_locked(listing);
  }

  void ensure_listed() {
    start();
    bool need;
    {
      std::lock_guard lock(mutex);
      need = !listed;
    }
    if (need) refresh();
  }

  // Watches the source directory and every rank directory in it; refreshes on each change.
  void watch() {
    UniqueFd in(::inotify_init1(IN_CLOEXEC | IN_NONBLOCK));
    if (!in) {
      spdlog::warn("steps/: no inotify ({}); new steps show at the next mount only",
                   std::strerror(errno));
      return;
    }
    std::set<std::filesystem::path> unwatched;  // said once each
    auto add_watches = [&] {
      std::error_code ec;
      const source::Listing listing = [&] {
        try {
          return source::list_sources(src_dir);
        } catch (const Error&) {
          return source::Listing{};
        }
      }();
      const std::filesystem::path root = listing.root.empty() ? src_dir : listing.root;
      // A directory left unwatched still shows its new steps at the next listing another
      // directory's change causes, or at the next mount: said once per directory, not hidden.
      const auto watch = [&](const std::filesystem::path& dir, uint32_t events) {
        if (::inotify_add_watch(in.get(), dir.c_str(), events | IN_ONLYDIR) >= 0) return;
        if (unwatched.insert(dir).second)
          spdlog::warn(
              "steps/: cannot watch {} ({}); steps saved there show after another change or at the "
              "next mount{}",
              dir.string(), std::strerror(errno),
              errno == ENOSPC ? " (raise fs.inotify.max_user_watches)" : "");
      };
      watch(root, kRootEvents);
      for (const auto& [rank, dir] : listing.ranks) watch(dir.dir, kRankDirEvents);
    };
    add_watches();
    refresh();  // what changed before the watches were in place
    pollfd fds[2] = {{in.get(), POLLIN, 0}, {stop.get(), POLLIN, 0}};
    for (;;) {
      const int n = ::poll(fds, 2, kPollMs);
      if (n < 0 && errno != EINTR) break;
      if (fds[1].revents) break;
      if (n > 0 && (fds[0].revents & POLLIN)) {
        alignas(inotify_event) char buf[16384];
        while (::read(in.get(), buf, sizeof buf) > 0) {
        }
        add_watches();  // a new rank directory
        refresh();
      } else {
        std::lock_guard lock(mutex);  // only to let dropped trees go after their grace period
        const Clock::time_point now = Clock::now();
        std::erase_if(dropped, [&](const auto& d) { return now - d.first > kGrace; });
      }
    }
  }
};

Steps::Steps(std::filesystem::path src_dir, PlanStep plan_step) : impl_(std::make_unique<Impl>()) {
  impl_->src_dir = std::move(src_dir);
  impl_->plan_step = std::move(plan_step);
}

Steps::~Steps() { stop_watching(); }

void Steps::stop_watching() {
  if (impl_->watcher.joinable()) {
    const uint64_t one = 1;
    if (::write(impl_->stop.get(), &one, sizeof one) < 0) {
    }
    impl_->watcher.join();
  }
}

void Steps::refresh() { impl_->refresh(); }

std::vector<Steps::Entry> Steps::list() {
  impl_->ensure_listed();
  std::lock_guard lock(impl_->mutex);
  std::vector<Entry> out;
  out.reserve(impl_->steps.size());
  for (const auto& [key, step] : impl_->steps)
    out.push_back({step.index, impl_->names[step.index]});
  return out;
}

std::optional<uint32_t> Steps::find(std::string_view name) {
  impl_->ensure_listed();
  std::lock_guard lock(impl_->mutex);
  for (const auto& [key, step] : impl_->steps)
    if (impl_->names[step.index] == name) return step.index;
  return std::nullopt;
}

std::shared_ptr<const Tree> Steps::planned(uint32_t index) {
  std::lock_guard lock(impl_->mutex);
  auto key = impl_->key_of.find(index);
  if (key != impl_->key_of.end()) return impl_->steps.at(key->second).tree;
  // Dropped but in its grace period: an open file keeps its bytes a little longer.
  for (const auto& [when, tree] : impl_->dropped)
    if (tree && tree->step_index() == index) return tree;
  return nullptr;
}

std::shared_ptr<const Tree> Steps::tree(uint32_t index) {
  Files files;
  {
    std::lock_guard lock(impl_->mutex);
    auto key = impl_->key_of.find(index);
    if (key == impl_->key_of.end()) return nullptr;
    const Impl::Step& step = impl_->steps.at(key->second);
    if (step.tree) return step.tree;
    files = step.files;
  }
  std::lock_guard planning(impl_->plan_mutex);
  if (auto done = planned(index)) return done;  // planned while this caller waited
  std::shared_ptr<Tree> built;
  std::string why;
  try {
    auto tree = std::make_shared<Tree>(impl_->plan_step(files));
    tree->set_step_index(index);
    built = std::move(tree);
  } catch (const Error& e) {
    why = e.what();
  }
  std::lock_guard lock(impl_->mutex);
  auto key = impl_->key_of.find(index);
  if (key == impl_->key_of.end()) return nullptr;  // gone while it was planned
  Impl::Step& step = impl_->steps.at(key->second);
  if (!built) {
    if (!step.failed) spdlog::error("steps/{}: {}", impl_->names[index], why);
    step.failed = true;
    return nullptr;
  }
  spdlog::info("steps/{}: planned, {} files", impl_->names[index], built->plan().targets.size());
  step.tree = built;
  return built;
}

}  // namespace ckptfs::fs
