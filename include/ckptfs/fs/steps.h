// The steps/ subtree of a mount: every step saved on all ranks of the source directory, each
// served by a Tree of its own that is planned when the step is first looked up. A watcher thread
// (inotify on the source and rank directories, started on first use, so after the daemon forks)
// keeps the set current: a step appears once its last rank's file is complete (renamed from
// *.tmp or closed after writing) and disappears when one of its files is deleted.
//
// Thread-safe: every method may be called from any FUSE worker. A dropped step's Tree is kept a
// grace period (kGrace) for callers still holding pointers into it, then freed, which closes and
// unmaps its sources; reads of its files fail with EIO from then on. Lock order: the planning
// lock or the refresh lock (one listing applied at a time), then the lock of the set of steps; no
// read path lock is taken under any of them.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/plan/planner.h"

namespace ckptfs::fs {

class Tree;

// Plans the files of one step (global rank -> file); throws Error naming what is wrong.
using PlanStep = std::function<plan::Plan(const std::map<int64_t, std::filesystem::path>&)>;

class Steps {
 public:
  static constexpr std::chrono::seconds kGrace{10};

  Steps(std::filesystem::path src_dir, PlanStep plan_step);
  ~Steps();
  Steps(const Steps&) = delete;
  Steps& operator=(const Steps&) = delete;

  struct Entry {
    uint32_t index;         // stable for as long as the step exists; never reused
    std::string_view name;  // "<epoch>_<step>", NUL-terminated, valid for the Steps' lifetime
  };
  // The current steps, oldest first.
  std::vector<Entry> list();
  // The index of a current step by name.
  std::optional<uint32_t> find(std::string_view name);
  // The step's Tree, planned now if it was not yet; null if the step is gone or cannot be
  // planned (logged once per step).
  std::shared_ptr<const Tree> tree(uint32_t index);
  // The step's Tree if it is planned and current (or in its grace period); never plans.
  std::shared_ptr<const Tree> planned(uint32_t index);

  // Re-reads the source directory now (the watcher calls it on every change).
  void refresh();
  // Ends the watcher thread and waits for it (idempotent; the destructor calls it). A daemon
  // that keeps its Tree past exit calls it first: a watcher still running while static objects
  // are destroyed would log through a logger that is gone.
  void stop_watching();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckptfs::fs
