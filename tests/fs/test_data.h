// Hand-built plans for the fs tests: random source files in a temp dir, and target files made
// of header bytes and source ranges whose expected content is the plain concatenation.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include "../../src/fs/prefetcher.h"
#include "ckptfs/fs/read_result.h"
#include "ckptfs/fs/tree.h"
#include "ckptfs/plan/planner.h"
#include "ckptfs/source/source_file.h"
#include "support/test_support.h"

namespace ckptfs::fs::testing {

using testsupport::TempDir;

struct Bytes {
  std::string data;
};
struct Range {
  uint32_t source;
  uint64_t offset;
  uint64_t length;
};
using Piece = std::variant<Bytes, Range>;

struct TargetSpec {
  int64_t rank;
  std::vector<Piece> pieces;
};

inline std::string random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(n, '\0');
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t v = rng();
    for (size_t j = 0; j < 8 && i + j < n; ++j) out[i + j] = static_cast<char>(v >> (8 * j));
  }
  return out;
}

// The read path's ReadResult in the shape the checks compare: the errno (0 when done) returned,
// the bytes served in `got`.
inline int tree_read(const Tree& tree, uint64_t ino, uint64_t off, std::span<char> buf, size_t& got,
                     std::vector<uint32_t>* sources = nullptr) {
  const ReadResult r = tree.read_into(ino, off, buf, sources);
  got = r.bytes();
  return r.error();
}
inline int prefetch_read(Prefetcher& prefetcher, Prefetcher::Stream& stream, uint64_t off,
                         size_t len, ReplyBuffer& buf, size_t& got) {
  const ReadResult r = prefetcher.read(stream, off, len, buf);
  got = r.bytes();
  return r.error();
}

// File inode of target i of a TestData tree (ranks 0, 1, 5, 7).
inline uint64_t ino_of(size_t target) { return 3 + 2 * target; }

// Sources and targets written to `dir`, with the bytes every target must read as.
class TestData {
 public:
  explicit TestData(const std::filesystem::path& dir) : dir_(dir / "src") {
    std::filesystem::create_directories(dir_);
    // Sizes chosen so that reads cross header/source seams, and both many tiny runs and
    // MiB-long runs get exercised.
    add_source(10000, 1);
    add_source(70000, 2);
    add_source((3u << 20) + 4096, 3);

    TargetSpec t0{0, {}};
    t0.pieces = {Bytes{"HEADER-0:"}, Range{0, 100, 5000}, Bytes{"|"},
                 Range{1, 0, 65536}, Bytes{"tail"},       Range{0, 9000, 1000}};
    TargetSpec t1{1, {}};
    for (uint32_t k = 0; k < 40; ++k) {
      t1.pieces.push_back(Bytes{std::string(1 + k % 3, static_cast<char>('a' + k % 26))});
      t1.pieces.push_back(Range{1, k * 997ull, 13});
    }
    t1.pieces.push_back(Range{2, 4096, 300000});
    TargetSpec t5{5, {}};
    t5.pieces = {Bytes{"big header"}, Range{2, 0, 2u << 20}, Bytes{"second header"},
                 Range{2, (2u << 20) + 123, (1u << 20) - 123}, Range{0, 0, 10000}};
    TargetSpec t7{7, {}};  // an empty file
    specs_ = {t0, t1, t5, t7};
    for (const TargetSpec& spec : specs_) expected_.push_back(concat(spec));
  }

  const std::filesystem::path& source_path(size_t i) const { return paths_[i]; }
  const std::string& source_bytes(size_t i) const { return sources_[i]; }
  const std::vector<TargetSpec>& specs() const { return specs_; }
  const std::string& expected(size_t target) const { return expected_[target]; }
  size_t targets() const { return specs_.size(); }

  // A fresh plan over freshly opened sources (so each Tree has its own fds and fingerprints).
  plan::Plan make_plan() const { return make_plan_from(specs_); }

  plan::Plan make_plan_from(const std::vector<TargetSpec>& specs) const {
    plan::Plan plan;
    for (size_t i = 0; i < paths_.size(); ++i) {
      plan.sources.push_back(
          index::IndexedSource{source::SourceFile::open(paths_[i]), {}, false, {}, nullptr});
      plan.source_ranks.push_back(static_cast<int64_t>(i));
    }
    for (const TargetSpec& spec : specs) {
      plan::VirtualFile::Builder builder;
      for (const Piece& piece : spec.pieces) {
        if (const Bytes* b = std::get_if<Bytes>(&piece))
          builder.add_bytes(b->data);
        else {
          const Range& r = std::get<Range>(piece);
          builder.add_source_range(r.source, r.offset, r.length);
        }
      }
      plan.targets.push_back(plan::TargetFile{spec.rank, builder.finish(), {}, false});
    }
    return plan;
  }

  std::string concat(const TargetSpec& spec) const {
    std::string out;
    for (const Piece& piece : spec.pieces) {
      if (const Bytes* b = std::get_if<Bytes>(&piece))
        out += b->data;
      else {
        const Range& r = std::get<Range>(piece);
        out += sources_[r.source].substr(r.offset, r.length);
      }
    }
    return out;
  }

  // Appends a byte to source `i`: its size and mtime no longer match the fingerprint.
  void change_source(size_t i) const {
    std::ofstream out(paths_[i], std::ios::binary | std::ios::app);
    out << 'x';
  }

 private:
  void add_source(size_t size, uint64_t seed) {
    const std::filesystem::path dir = dir_ / ("rank_" + std::to_string(paths_.size()));
    std::filesystem::create_directories(dir);
    const std::filesystem::path path = dir / "source.ckpt";
    sources_.push_back(random_bytes(size, seed));
    std::ofstream out(path, std::ios::binary);
    out.write(sources_.back().data(), static_cast<std::streamsize>(size));
    paths_.push_back(path);
  }

  std::filesystem::path dir_;
  std::vector<std::filesystem::path> paths_;
  std::vector<std::string> sources_;
  std::vector<TargetSpec> specs_;
  std::vector<std::string> expected_;
};

}  // namespace ckptfs::fs::testing
