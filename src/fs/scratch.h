// Every per-thread buffer of the read path, in one place. A thread (a FUSE worker or a
// read-ahead helper) serves one request at a time, so the read path reuses these instead of
// allocating per request; they only grow, to the largest request the thread has served.
//
// Each member belongs to one step, and steps that run inside one another use different members:
// Tree::read_into (read_*) -> Tree::gather -> MappedSources::copy (copy_*, stretch_*) and
// Tree::check_sources (check_*); SpliceStage (splice_*) -> Tree::check_sources. Nothing here is
// held across a return to libfuse or to the helper loop.
//
// Thread-safety: each thread has its own (scratch() is thread_local); never share a reference
// with another thread.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "ckptfs/plan/virtual_file.h"
#include "mapped_sources.h"
#include "source_marks.h"
#include "splice_stage.h"

namespace ckptfs::fs::detail {

struct Scratch {
  // Tree::read_into: the READ's runs, and the sources they read (when the caller keeps none).
  std::vector<plan::Run> read_runs;
  std::vector<uint32_t> read_sources;
  std::vector<uint64_t> read_ends;
  // Tree::check_sources(runs) and Tree::distinct_sources: the sources and how far into each.
  std::vector<uint32_t> check_sources;
  std::vector<uint64_t> check_ends;
  SourceMarks check_marks;
  // MappedSources::copy: where each run goes, the source runs in copy order, the sources seen,
  // the page tables to drop after each source of a many-source request.
  std::vector<char*> copy_dest;
  std::vector<uint32_t> copy_order;
  SourceMarks copy_marks;
  std::vector<std::pair<uint32_t, MappedSources::Range>> copy_done;
  // MappedSources::note: the tables to let go once the budget is spanned.
  std::vector<std::pair<uint32_t, MappedSources::Range>> note_due;
  // MappedSources::read_stretches: the preadv vector, and the buffer for short runs.
  std::vector<iovec> stretch_iov;
  std::vector<char> stretch_bytes;
  // SpliceStage::would_stage and SpliceStage::stage: the runs of the READ.
  std::vector<plan::Run> splice_runs;
  // The sources of those runs, each once (to hold their leases).
  std::vector<uint32_t> splice_sources;
  // The FUSE worker's pipe that spliced READs are staged in (made on its first spliced READ),
  // and whether one could not be made (then this thread never splices).
  std::unique_ptr<StagePipe> splice_pipe;
  bool splice_unavailable = false;
  // Prefetcher::read: the sources of the blocks a hit is served from; Prefetcher::start: the
  // blocks the last read planned, (slot, generation).
  std::vector<uint32_t> served_from;
  std::vector<std::pair<size_t, uint64_t>> planned;
};

// This thread's scratch.
Scratch& scratch();

}  // namespace ckptfs::fs::detail
