// `ckptfs verify SRC_DIR [view options]`: is this source directory fit to be served? Every chosen
// file parses and its CRC trailer matches, every source rank the strategy names has a file (and
// which targets lack one otherwise), the strategies agree with the files, and every byte of
// every target file can be read.
// `ckptfs verify VIEW --against DIR`: a view (mounted or materialized) compared with files
// written by another tool, tensor by tensor, naming the first differing element of each.
// Both exit 0 only when all is well; problems are listed one per line on stdout.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ckptfs/error.h"
#include "ckptfs/index/readers.h"
#include "ckptfs/megatron/megatron.h"
#include "ckptfs/scan/dtype.h"
#include "ckptfs/scan/reader.h"
#include "ckptfs/source/discover.h"
#include "ckptfs/source/source_file.h"
#include "ckptfs/source/step_choice.h"
#include "ckptfs/strategy/rank_list.h"
#include "ckptfs/strategy/strategy.h"
#include "ckptfs/util/open_path.h"
#include "ckptfs/util/pread.h"
#include "ckptfs/view/families.h"
#include "ckptfs/view/progress.h"
#include "commands.h"
#include "view.h"

namespace ckptfs::cli {

namespace {

namespace stdfs = std::filesystem;

struct VerifyArgs {
  ViewArgs view;
  std::string against;
};

// Problems, one line each, on stdout as they are found.
struct Findings {
  size_t count = 0;
  void add(const std::string& line) {
    ++count;
    fmt::print("FAIL {}\n", line);
    std::fflush(stdout);
  }
};

// Read by the first of `readers` (its family's) that claims it.
scan::FileScan scan_any(const stdfs::path& path, scan::Readers readers, bool verify_crc) {
  const source::SourceFile file = source::SourceFile::open(path);
  return scan::pick_reader(readers, file.fd.get(), path.string())
      .scan(file.fd.get(), path.string(), scan::ReadOptions{.verify_crc = verify_crc});
}

// ---- verify SRC_DIR ----

void verify_sources(const VerifyArgs& args) {
  Findings findings;
  std::map<int64_t, stdfs::path> files;
  // Only rank directories are listed and checked rank by rank here; another family's files are
  // read in full by step 4.
  const view::Detected detected = view::detect(args.view.src_dir, args.view.step);
  const bool rank_dirs = view::is_rank_dirs(*detected.family);
  std::string src_strategy = args.view.src_strategy;
  std::map<int64_t, std::string> unusable;  // source::Listing's
  std::string checked;  // which checkpoints, as a mount says it: "epoch 10 step 100 on all ..."
  if (rank_dirs) {
    const source::Listing listing = source::list_sources(args.view.src_dir);
    unusable = listing.unusable;
    source::Choice choice = source::choose(
        listing, source::StepRequest::parse(args.view.step, args.view.allow_mixed_steps));
    files = std::move(choice.files);
    checked = std::move(choice.summary);
    if (src_strategy.empty() && listing.mindformers_strategy)
      src_strategy = listing.mindformers_strategy->string();
  }

  // 1. Every chosen file parses, CRC trailers included (this reads every byte).
  uint64_t total = 0;
  for (const auto& [rank, path] : files) {
    std::error_code ec;
    total += stdfs::file_size(path, ec);
  }
  {
    Progress progress("verify sources", "files", Progress::mode_for(args.view.quiet),
                      std::chrono::seconds(2));
    progress.start(total, files.size());
    for (const auto& [rank, path] : files) {
      try {
        scan_any(path, detected.family->readers(), /*verify_crc=*/true);
      } catch (const Error& e) {
        findings.add(e.what());
      }
      std::error_code ec;
      progress.advance(stdfs::file_size(path, ec));
      progress.item_done();
    }
  }

  // 1b. A Megatron-Core iteration's integrity.json (the SHA-256 of each of its files), if any.
  if (!rank_dirs) {
    try {
      if (const auto bad = megatron::check_integrity(detected.found)) {
        for (const std::string& line : *bad) findings.add(line);
        if (bad->empty())
          checked = fmt::format("{}: every file {} names matches its SHA-256",
                                (detected.found / megatron::kIntegrityName).string(),
                                megatron::kIntegrityName);
      }
    } catch (const Error& e) {
      findings.add(e.what());
    }
  }

  // 2. Every rank the source strategy names has a file; which targets miss one if not.
  std::optional<strategy::Strategy> src, dst;
  try {
    if (!src_strategy.empty()) src = strategy::read_strategy(src_strategy);
    if (!args.view.dst_strategy.empty()) dst = strategy::read_strategy(args.view.dst_strategy);
  } catch (const Error& e) {
    findings.add(e.what());
  }
  if (src && rank_dirs) {
    std::set<int64_t> missing;
    const int64_t ranks = src->devices_per_stage * static_cast<int64_t>(src->num_stages);
    for (int64_t r = 0; r < ranks; ++r)
      if (!files.contains(r)) missing.insert(r);
    if (!missing.empty()) {
      const int64_t targets =
          dst ? dst->devices_per_stage * static_cast<int64_t>(dst->num_stages) : 1;
      std::vector<std::string> affected;
      for (int64_t t = 0; t < targets; ++t) {
        try {
          std::vector<int64_t> lacking;
          for (int64_t r : strategy::rank_list_for_transform(&*src, dst ? &*dst : nullptr, t))
            if (missing.contains(r)) lacking.push_back(r);
          if (!lacking.empty())
            affected.push_back(
                fmt::format("target rank {} (needs {})", t, fmt::join(lacking, ",")));
        } catch (const Error&) {
          // Planning below names the layout problem.
        }
      }
      std::vector<std::string> where;
      for (int64_t r : missing) {
        const auto why = unusable.find(r);
        where.push_back(why != unusable.end() ? why->second : fmt::format("no rank_{}/", r));
      }
      findings.add(
          fmt::format("{}: source rank{} {} {} no checkpoint file ({}); affected: {}",
                      args.view.src_dir, missing.size() == 1 ? "" : "s", fmt::join(missing, ","),
                      missing.size() == 1 ? "has" : "have", fmt::join(where, "; "),
                      affected.empty() ? "none" : fmt::format("{}", fmt::join(affected, "; "))));
    }
  }
  const std::string of = checked.empty() ? "" : fmt::format(" in {}", checked);
  if (findings.count > 0)
    fail("verify: {} problem{} (listed above){}; fix them, then verify again", findings.count,
         findings.count == 1 ? "" : "s", of);

  // 3. The strategies agree with the files (planning checks every slice), and 4. every byte
  // of every target file can be read.
  ViewNotes notes;
  std::unique_ptr<fs::Tree> tree;
  try {
    tree = build_tree(args.view, notes, /*steps=*/false);
  } catch (const Error& e) {
    findings.add(e.what());
    fail("verify: the view cannot be planned (see above)");
  }
  const plan::Plan& plan = tree->plan();
  uint64_t view_bytes = 0;
  for (const plan::TargetFile& t : plan.targets) view_bytes += t.file.size();
  {
    Progress progress("verify view", "files", Progress::mode_for(args.view.quiet),
                      std::chrono::seconds(2));
    progress.start(view_bytes, plan.targets.size());
    constexpr size_t kChunk = size_t{4} << 20;
    std::unique_ptr<char[]> buffer(new char[kChunk]);
    for (size_t i = 0; i < plan.targets.size(); ++i) {
      const plan::TargetFile& target = plan.targets[i];
      const std::string name = target.path();
      for (uint64_t off = 0; off < target.file.size();) {
        const fs::ReadResult r =
            tree->read_into(tree->target_ino(i), off, std::span<char>(buffer.get(), kChunk));
        const size_t got = r.bytes();
        if (!r.ok() || got == 0) {
          findings.add(fmt::format("{}: reading byte {} failed: {}", name, off,
                                   !r.ok() ? std::strerror(r.error()) : "no data"));
          break;
        }
        off += got;
        progress.advance(got);
      }
      progress.item_done();
    }
  }
  if (findings.count > 0)
    fail("verify: {} problem{} (listed above){}", findings.count, findings.count == 1 ? "" : "s",
         of);
  fmt::print("verify: all well: {}{} source files ({}), {} target files ({}) read in full\n",
             checked.empty() ? "" : checked + "; ", files.size(),
             human_bytes(static_cast<double>(total)), plan.targets.size(),
             human_bytes(static_cast<double>(view_bytes)));
}

// ---- verify VIEW --against DIR ----

// Sequential reader of a parameter's content, record after record.
class ContentReader {
 public:
  ContentReader(int fd, std::string name, const scan::Extents& extents)
      : fd_(fd), name_(std::move(name)), extents_(extents) {}
  // Fills up to out.size() bytes; returns how many (0 at the end).
  size_t read(std::span<uint8_t> out) {
    size_t done = 0;
    while (done < out.size() && k_ < extents_.size()) {
      const scan::Extent& e = extents_[k_];
      const uint64_t n = std::min<uint64_t>(out.size() - done, e.length - at_);
      pread_exact(fd_, name_, e.offset + at_, out.subspan(done, n));
      done += n;
      at_ += n;
      if (at_ == e.length) {
        ++k_;
        at_ = 0;
      }
    }
    return done;
  }

 private:
  int fd_;
  std::string name_;
  const scan::Extents& extents_;
  size_t k_ = 0;
  uint64_t at_ = 0;
};

float half_to_float(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float value;
  if (exp == 0)
    value = std::ldexp(static_cast<float>(mant), -24);
  else if (exp == 31)
    value = mant ? NAN : INFINITY;
  else
    value = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
  return sign ? -value : value;
}

// One element of `dtype` at `p`, as text.
std::string element_text(std::string_view dtype, const uint8_t* p) {
  auto load = [p]<typename T>(T) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  if (dtype == "Float32") return fmt::format("{}", load(float{}));
  if (dtype == "Float64") return fmt::format("{}", load(double{}));
  if (dtype == "Float16") return fmt::format("{}", half_to_float(load(uint16_t{})));
  if (dtype == "BFloat16")
    return fmt::format("{}", std::bit_cast<float>(uint32_t{load(uint16_t{})} << 16));
  if (dtype == "Int8") return fmt::format("{}", load(int8_t{}));
  if (dtype == "UInt8" || dtype == "Bool") return fmt::format("{}", load(uint8_t{}));
  if (dtype == "Int16") return fmt::format("{}", load(int16_t{}));
  if (dtype == "UInt16") return fmt::format("{}", load(uint16_t{}));
  if (dtype == "Int32") return fmt::format("{}", load(int32_t{}));
  if (dtype == "UInt32") return fmt::format("{}", load(uint32_t{}));
  if (dtype == "Int64") return fmt::format("{}", load(int64_t{}));
  if (dtype == "UInt64") return fmt::format("{}", load(uint64_t{}));
  return fmt::format("0x{:02x}", *p);
}

// [i, j, k] of flat element `flat` in C order.
std::string index_text(uint64_t flat, const std::vector<int64_t>& shape) {
  std::vector<uint64_t> index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    const auto extent = static_cast<uint64_t>(std::max<int64_t>(shape[d], 1));
    index[d] = flat % extent;
    flat /= extent;
  }
  return fmt::format("[{}]", fmt::join(index, ","));
}

// The first difference between two parameters' contents, or "" if none.
std::string compare_content(int fd_a, const std::string& a_name, const scan::Param& a, int fd_b,
                            const std::string& b_name, const scan::Param& b) {
  constexpr size_t kChunk = 1 << 20;
  std::vector<uint8_t> buf_a(kChunk), buf_b(kChunk);
  ContentReader ra(fd_a, a_name, a.content), rb(fd_b, b_name, b.content);
  uint64_t offset = 0;
  for (;;) {
    const size_t na = ra.read(buf_a), nb = rb.read(buf_b);
    const size_t n = std::min(na, nb);
    const auto diff =
        std::mismatch(buf_a.begin(), buf_a.begin() + static_cast<ptrdiff_t>(n), buf_b.begin());
    if (diff.first != buf_a.begin() + static_cast<ptrdiff_t>(n)) {
      const uint64_t at = offset + static_cast<uint64_t>(diff.first - buf_a.begin());
      const uint32_t size = a.element_size;
      if (a.kind != scan::EntryKind::Tensor || size == 0) return fmt::format("byte {} differs", at);
      const uint64_t element = at / size;
      const size_t start = static_cast<size_t>(element * size - offset);
      if (start + size <= n)
        return fmt::format("first difference at element {} (flat {}): {} vs {}",
                           index_text(element, a.shape), element,
                           element_text(a.dtype, buf_a.data() + start),
                           element_text(b.dtype, buf_b.data() + start));
      return fmt::format("first difference at element {} (flat {})", index_text(element, a.shape),
                         element);
    }
    if (na != nb) return fmt::format("content lengths differ at byte {}", offset + n);
    if (n == 0) return {};
    offset += n;
  }
}

// Compares two files parameter by parameter; adds a finding per differing parameter.
void compare_files(const stdfs::path& view, const stdfs::path& other, Findings& findings,
                   size_t& compared) {
  scan::FileScan a, b;
  try {
    // A view's files are in MindSpore's formats, and so must the files it is compared with be.
    a = scan_any(view, index::mindspore_readers(), false);
    b = scan_any(other, index::mindspore_readers(), false);
  } catch (const Error& e) {
    findings.add(e.what());
    return;
  }
  // Contents are compared by reading both files at their scans' offsets: an encrypted file's
  // are offsets into its plaintext, not into the file.
  if (a.encrypted || b.encrypted) {
    findings.add(fmt::format("{}: encrypted; compare its mounted view instead",
                             (a.encrypted ? view : other).string()));
    return;
  }
  const source::SourceFile fa = source::SourceFile::open(view);
  const source::SourceFile fb = source::SourceFile::open(other);
  std::map<std::string, const scan::Param*> theirs;
  for (const scan::Param& p : b.params) theirs[p.name] = &p;
  std::set<std::string> seen;
  for (const scan::Param& p : a.params) {
    seen.insert(p.name);
    auto it = theirs.find(p.name);
    if (it == theirs.end()) {
      findings.add(fmt::format("{}: {} is not in {}", view.string(), p.name, other.string()));
      continue;
    }
    const scan::Param& q = *it->second;
    ++compared;
    if (p.dtype != q.dtype || p.shape != q.shape) {
      findings.add(fmt::format("{}: {}: {} {} here, {} {} in {}", view.string(), p.name, p.dtype,
                               fmt::join(p.shape, "x"), q.dtype, fmt::join(q.shape, "x"),
                               other.string()));
      continue;
    }
    const std::string diff =
        compare_content(fa.fd.get(), view.string(), p, fb.fd.get(), other.string(), q);
    if (!diff.empty())
      findings.add(fmt::format("{}: {} ({} {}): {}", view.string(), p.name, p.dtype,
                               fmt::format("[{}]", fmt::join(p.shape, ",")), diff));
  }
  for (const scan::Param& q : b.params)
    if (!seen.contains(q.name))
      findings.add(fmt::format("{}: {} is only in {}", view.string(), q.name, other.string()));
  // The order of records is part of what a loader sees.
  if (findings.count == 0) {
    std::vector<std::string> order_a, order_b;
    for (const scan::Param& p : a.params) order_a.push_back(p.name);
    for (const scan::Param& q : b.params) order_b.push_back(q.name);
    if (order_a != order_b)
      findings.add(fmt::format("{}: same parameters as {}, in another order", view.string(),
                               other.string()));
  }
}

// The counterpart of VIEW/rank_N/NAME in DIR: the same path, else the only file of that kind
// in DIR/rank_N.
std::optional<stdfs::path> counterpart(const stdfs::path& other_root, const stdfs::path& rel) {
  const stdfs::path same = other_root / rel;
  std::error_code ec;
  // One that is there but not a regular file (a FIFO, a device) is named when opened.
  if (stdfs::is_regular_file(same, ec) || util::wrong_kind(same, S_IFREG)) return same;
  const stdfs::path dir = other_root / rel.parent_path();
  std::vector<stdfs::path> candidates;
  for (const auto& entry : stdfs::directory_iterator(dir, ec))
    if (entry.is_regular_file(ec) && entry.path().extension() == rel.extension())
      candidates.push_back(entry.path());
  if (candidates.size() == 1) return candidates[0];
  return std::nullopt;
}

void verify_against(const VerifyArgs& args) {
  const stdfs::path view(args.view.src_dir), other(args.against);
  util::require_directory(other, "--against directory");
  std::error_code ec;
  Findings findings;
  size_t files = 0, compared = 0;
  std::vector<stdfs::path> rels;
  for (const auto& dir : stdfs::directory_iterator(view, ec)) {
    if (!dir.is_directory(ec) || !dir.path().filename().string().starts_with("rank_")) continue;
    for (const auto& f : stdfs::directory_iterator(dir.path(), ec)) {
      const std::string ext = f.path().extension().string();
      if (f.is_regular_file(ec) && (ext == ".ckpt" || ext == ".safetensors") &&
          !f.path().filename().string().starts_with("."))
        rels.push_back(stdfs::relative(f.path(), view));
    }
  }
  std::sort(rels.begin(), rels.end());
  if (rels.empty()) fail("{}: no rank_<N>/*.ckpt or *.safetensors files to compare", view.string());
  for (const stdfs::path& rel : rels) {
    const std::optional<stdfs::path> theirs = counterpart(other, rel);
    if (!theirs) {
      findings.add(fmt::format("{}: no counterpart in {}/{}", (view / rel).string(), other.string(),
                               rel.parent_path().string()));
      continue;
    }
    ++files;
    compare_files(view / rel, *theirs, findings, compared);
  }
  if (findings.count > 0)
    fail("verify: {} difference{} (listed above)", findings.count, findings.count == 1 ? "" : "s");
  fmt::print("verify: identical: {} files, {} parameters compared element by element\n", files,
             compared);
}

}  // namespace

void add_verify_command(CLI::App& app) {
  auto args = std::make_shared<VerifyArgs>();
  CLI::App* command = add_view_command(
      app, "verify",
      "Check that SRC_DIR can be served (files parse, CRCs match, strategies fit, every block "
      "present, every target byte readable); with --against DIR, compare the view SRC_DIR "
      "(mounted or materialized) with files another tool wrote, tensor by tensor",
      args->view);
  command->add_option("--against", args->against,
                      "Directory of rank_N/ files written by another tool (e.g. "
                      "transform_checkpoints) to compare the view SRC_DIR with");
  command->callback([args] {
    util::require_directory(args->view.src_dir, "source directory");
    // Before the sources are scanned on their own (their GCM tags checked with the key).
    view::load_key(args->view);
    if (!args->against.empty())
      verify_against(*args);
    else
      verify_sources(*args);
  });
}

}  // namespace ckptfs::cli
