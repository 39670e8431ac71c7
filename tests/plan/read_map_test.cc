// The read map against brute force: a global tensor is cut into source blocks stored in a file
// (some blocks split across two records), and every target box read through TensorContent::map
// must equal the box sliced element by element from the global tensor.
#include "ckptfs/plan/read_map.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "ckptfs/plan/virtual_file.h"

namespace ckptfs::plan {
namespace {

using Shape = std::vector<int64_t>;

int64_t product(const Shape& s) {
  return std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<>());
}

// Row-major index helpers, written independently of the code under test.
Shape unflatten(int64_t index, const Shape& shape) {
  Shape out(shape.size());
  for (size_t j = shape.size(); j-- > 0;) {
    out[j] = index % shape[j];
    index /= shape[j];
  }
  return out;
}
int64_t flatten(const Shape& coord, const Shape& shape) {
  int64_t index = 0;
  for (size_t j = 0; j < shape.size(); ++j) index = index * shape[j] + coord[j];
  return index;
}

class SourceFileFixture {
 public:
  SourceFileFixture() {
    char name[] = "/tmp/ckptfs_readmap_XXXXXX";
    fd_ = mkstemp(name);
    path_ = name;
  }
  ~SourceFileFixture() {
    close(fd_);
    unlink(path_.c_str());
  }
  uint64_t append(const std::string& bytes) {
    const uint64_t at = size_;
    EXPECT_EQ(pwrite(fd_, bytes.data(), bytes.size(), static_cast<off_t>(at)),
              static_cast<ssize_t>(bytes.size()));
    size_ += bytes.size();
    return at;
  }
  std::string read(uint64_t offset, uint64_t length) const {
    std::string out(length, '\0');
    EXPECT_EQ(pread(fd_, out.data(), length, static_cast<off_t>(offset)),
              static_cast<ssize_t>(length));
    return out;
  }

 private:
  int fd_ = -1;
  std::string path_;
  uint64_t size_ = 0;
};

struct Case {
  const char* name;
  Shape global;
  Shape splits;
  Shape target_begin;
  Shape target_shape;
  uint32_t element_size;
};

// Names the case in test listings (and ctest names) instead of dumping its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class ReadMapTest : public ::testing::TestWithParam<Case> {};

TEST_P(ReadMapTest, EveryWindowMatchesBruteForce) {
  const Case& c = GetParam();
  std::mt19937_64 rng(42);
  const int64_t elems = product(c.global);
  std::string global(static_cast<size_t>(elems) * c.element_size, '\0');
  for (char& b : global) b = static_cast<char>(rng());

  // Store every source block in C order; every third block as two records with junk between.
  SourceFileFixture file;
  file.append("junk-prefix");
  Shape block_shape(c.global.size());
  for (size_t j = 0; j < c.global.size(); ++j) block_shape[j] = c.global[j] / c.splits[j];
  std::vector<std::unique_ptr<scan::Param>> params;
  for (int64_t b = 0; b < product(c.splits); ++b) {
    const Shape block = unflatten(b, c.splits);
    std::string bytes;
    for (int64_t i = 0; i < product(block_shape); ++i) {
      Shape coord = unflatten(i, block_shape);
      for (size_t j = 0; j < coord.size(); ++j) coord[j] += block[j] * block_shape[j];
      bytes += global.substr(static_cast<size_t>(flatten(coord, c.global)) * c.element_size,
                             c.element_size);
    }
    auto param = std::make_unique<scan::Param>();
    if (b % 3 == 1 && bytes.size() > 3) {
      const size_t cut = bytes.size() / 3;
      param->content.push_back({file.append(bytes.substr(0, cut)), cut});
      file.append("gap");
      param->content.push_back({file.append(bytes.substr(cut)), bytes.size() - cut});
    } else {
      param->content.push_back({file.append(bytes), bytes.size()});
    }
    params.push_back(std::move(param));
  }

  auto content = std::make_shared<TensorContent>();
  content->element_size = c.element_size;
  content->target_begin = c.target_begin;
  content->target_shape = c.target_shape;
  content->block_shape = block_shape;
  for (size_t j = 0; j < c.global.size(); ++j) {
    const int64_t first = c.target_begin[j] / block_shape[j];
    const int64_t last = (c.target_begin[j] + c.target_shape[j] - 1) / block_shape[j];
    content->first_block.push_back(first);
    content->grid.push_back(last - first + 1);
  }
  for (int64_t g = 0; g < product(content->grid); ++g) {
    Shape block = unflatten(g, content->grid);
    for (size_t j = 0; j < block.size(); ++j) block[j] += content->first_block[j];
    content->blocks.push_back(
        SourceBlock{7, params[static_cast<size_t>(flatten(block, c.splits))].get()});
  }

  std::string expected;
  for (int64_t i = 0; i < product(c.target_shape); ++i) {
    Shape coord = unflatten(i, c.target_shape);
    for (size_t j = 0; j < coord.size(); ++j) coord[j] += c.target_begin[j];
    expected += global.substr(static_cast<size_t>(flatten(coord, c.global)) * c.element_size,
                              c.element_size);
  }
  ASSERT_EQ(content->nbytes(), expected.size());

  auto resolve = [&](uint64_t begin, uint64_t end) {
    std::vector<plan::Run> runs;
    content->map(begin, end, runs);
    std::string got;
    for (const plan::Run& r : runs) {
      EXPECT_EQ(r.mem, nullptr);
      EXPECT_EQ(r.source, 7u);
      got += file.read(r.offset, r.length);
    }
    return got;
  };
  // cover() holds every byte map() reads, and no more than whole rows (along the first
  // dimension) of the grid's blocks for the target rows the window meets.
  const uint64_t target_row = expected.size() / static_cast<uint64_t>(c.target_shape[0]);
  uint64_t slab_row = c.element_size;  // one row of every block met at one first-dimension index
  for (size_t j = 1; j < c.global.size(); ++j)
    slab_row *= static_cast<uint64_t>(content->grid[j] * block_shape[j]);
  auto check_cover = [&](uint64_t begin, uint64_t end) {
    std::vector<plan::Run> runs, cover;
    content->map(begin, end, runs);
    content->cover(begin, end, cover);
    std::set<uint64_t> covered;
    uint64_t cover_bytes = 0;
    for (const plan::Run& r : cover) {
      EXPECT_EQ(r.source, 7u);
      cover_bytes += r.length;
      for (uint64_t at = r.offset; at < r.offset + r.length; ++at) covered.insert(at);
    }
    for (const plan::Run& r : runs)
      for (uint64_t at = r.offset; at < r.offset + r.length; ++at)
        ASSERT_TRUE(covered.count(at)) << "window " << begin << ".." << end << " byte " << at;
    const uint64_t rows = begin == end ? 0 : (end - 1) / target_row - begin / target_row + 1;
    EXPECT_LE(cover_bytes, rows * slab_row) << "window " << begin << ".." << end;
  };
  EXPECT_EQ(resolve(0, expected.size()), expected);
  check_cover(0, expected.size());
  std::uniform_int_distribution<uint64_t> pick(0, expected.size());
  for (int i = 0; i < 300; ++i) {
    uint64_t a = pick(rng), b = pick(rng);
    if (a > b) std::swap(a, b);
    ASSERT_EQ(resolve(a, b), expected.substr(a, b - a)) << "window " << a << ".." << b;
    check_cover(a, b);
  }

  // With a limit, the map stops once it holds more runs than that, and those runs still read
  // the start of the content; at or above the map's own run count it changes nothing.
  std::vector<plan::Run> all;
  content->map(0, expected.size(), all);
  for (size_t limit : {size_t{0}, size_t{1}, size_t{3}, all.size() - 1, all.size()}) {
    std::vector<plan::Run> some;
    content->map(0, expected.size(), some, limit);
    std::string got;
    for (const plan::Run& r : some) got += file.read(r.offset, r.length);
    if (limit >= all.size()) {
      EXPECT_EQ(got, expected) << "limit " << limit;
      EXPECT_EQ(some.size(), all.size()) << "limit " << limit;
    } else {
      EXPECT_GT(some.size(), limit);
      EXPECT_LE(some.size(), all.size());
      EXPECT_EQ(got, expected.substr(0, got.size())) << "limit " << limit;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Boxes, ReadMapTest,
    ::testing::Values(
        // whole tensor from row blocks (contiguous case)
        Case{"WholeFromRowBlocks", {8, 6}, {4, 1}, {0, 0}, {8, 6}, 4},
        // column slice of row blocks: strided, many short runs
        Case{"ColumnSliceStrided", {8, 6}, {4, 1}, {0, 2}, {8, 2}, 2},
        // target box straddling block boundaries in every dimension
        Case{"StraddlesEveryDimension", {6, 8, 10}, {3, 2, 5}, {1, 3, 1}, {4, 4, 7}, 4},
        // 3-D, target equals one block exactly
        Case{"ExactlyOneBlock3D", {4, 6, 8}, {2, 3, 2}, {2, 2, 4}, {2, 2, 4}, 2},
        // blocks split on the last dimension only, target a row range
        Case{"RowRangeOfColumnBlocks", {5, 12}, {1, 4}, {1, 0}, {3, 12}, 8},
        // one-dimensional, odd element size
        Case{"OneDimensionalBytes", {30}, {6}, {7}, {17}, 1},
        // inner dimensions whole and aligned, outer cut: long runs spanning blocks
        Case{"LongRunsAcrossBlocks", {12, 4, 4}, {4, 1, 1}, {2, 0, 0}, {9, 4, 4}, 2}),
    [](const ::testing::TestParamInfo<Case>& test) { return std::string(test.param.name); });

TEST(VirtualFile, MapsHeadersRangesAndMergesNeighbours) {
  VirtualFile::Builder builder;
  builder.add_bytes("HEAD");
  builder.add_source_range(3, 100, 10);
  builder.add_source_range(3, 110, 5);  // continues the previous range: one run
  builder.add_bytes("");
  builder.add_bytes("TAIL!");
  const VirtualFile file = builder.finish();
  EXPECT_EQ(file.size(), 24u);
  EXPECT_EQ(file.sources(), std::vector<uint32_t>{3});

  std::vector<plan::Run> runs;
  EXPECT_EQ(file.map(2, 100, runs), 22u);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(std::string(runs[0].mem, runs[0].length), "AD");
  EXPECT_EQ(runs[1].mem, nullptr);
  EXPECT_EQ(runs[1].offset, 100u);
  EXPECT_EQ(runs[1].length, 15u);
  EXPECT_EQ(std::string(runs[2].mem, runs[2].length), "TAIL!");

  // Limited to 1 run, it stops after the second (returning 0), before the tail; limited to 3,
  // it maps all.
  runs.clear();
  EXPECT_EQ(file.map(2, 100, runs, 1), 0u);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(std::string(runs[0].mem, runs[0].length), "AD");
  EXPECT_EQ(runs[1].offset, 100u);
  runs.clear();
  EXPECT_EQ(file.map(2, 100, runs, 3), 22u);
  EXPECT_EQ(runs.size(), 3u);

  runs.clear();
  EXPECT_EQ(file.map(24, 10, runs), 0u);
  EXPECT_TRUE(runs.empty());
  EXPECT_EQ(file.map(5, 3, runs), 3u);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].offset, 101u);
  EXPECT_EQ(runs[0].length, 3u);

  // cover() leaves the header bytes out and keeps the source ranges.
  runs.clear();
  file.cover(2, 100, runs);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].mem, nullptr);
  EXPECT_EQ(runs[0].source, 3u);
  EXPECT_EQ(runs[0].offset, 100u);
  EXPECT_EQ(runs[0].length, 15u);
}

}  // namespace
}  // namespace ckptfs::plan

namespace ckptfs::plan {
namespace {

// (file, offset) of each byte of a content, in its order.
using Located = std::vector<std::pair<uint32_t, uint64_t>>;

// Every window of `content` starting each `step` bytes and `width` bytes long (or 1 byte, or to
// the end) maps to exactly the (file, offset) pairs `want` holds for those bytes.
template <typename Content>
::testing::AssertionResult windows_match(const Content& content, const Located& want, uint64_t step,
                                         std::initializer_list<uint64_t> widths) {
  if (content.nbytes() != want.size())
    return ::testing::AssertionFailure()
           << "nbytes " << content.nbytes() << ", expected " << want.size();
  for (uint64_t begin = 0; begin < want.size(); begin += step) {
    std::vector<uint64_t> ends{begin + 1, want.size()};
    for (uint64_t w : widths) ends.push_back(begin + w);
    for (uint64_t end : ends) {
      if (end > want.size()) continue;
      std::vector<plan::Run> runs;
      content.map(begin, end, runs);
      Located got;
      for (const plan::Run& r : runs)
        for (uint64_t k = 0; k < r.length; ++k) got.emplace_back(r.source, r.offset + k);
      if (got != Located(want.begin() + begin, want.begin() + end))
        return ::testing::AssertionFailure() << "window " << begin << ".." << end;
    }
  }
  return ::testing::AssertionSuccess();
}

// StridedContent against element-by-element indexing: for views (transposed, offset, padded
// rows, size-1 and 0-d dims) every byte window maps to the runs that hold exactly those bytes.
TEST(StridedContent, EveryWindowMatchesElementwiseIndexing) {
  struct View {
    std::vector<int64_t> shape, strides;
    uint64_t offset;
  };
  const std::vector<View> cases{
      {{24, 16}, {1, 24}, 0},      // transposed weight
      {{4, 6}, {8, 1}, 17},        // pos_ids: padded rows at an offset
      {{2, 3}, {3, 1}, 0},         // contiguous
      {{}, {}, 5},                 // 0-d
      {{3, 1, 4}, {4, 99, 1}, 2},  // a size-1 dim with any stride
      {{2, 3, 2}, {1, 2, 6}, 0},   // fully permuted
  };
  const uint32_t e = 4;
  const uint64_t base = 1000;
  for (const View& c : cases) {
    StridedContent s;
    s.source = 3;
    s.base = base;
    s.element_size = e;
    s.storage_offset = c.offset;
    s.shape = c.shape;
    s.strides = c.strides;
    // The expected source byte of every content byte.
    std::vector<uint64_t> want;
    const int64_t n = product(c.shape);
    for (int64_t i = 0; i < n; ++i) {
      const Shape coord = unflatten(i, c.shape);
      uint64_t elem = c.offset;
      for (size_t k = 0; k < coord.size(); ++k) elem += coord[k] * c.strides[k];
      for (uint32_t b = 0; b < e; ++b) want.push_back(base + elem * e + b);
    }
    ASSERT_EQ(s.nbytes(), want.size());
    for (uint64_t begin = 0; begin < want.size(); begin += 3)
      for (uint64_t end : {begin + 1, begin + 7, uint64_t{want.size()}}) {
        if (end > want.size()) continue;
        std::vector<plan::Run> runs;
        s.map(begin, end, runs);
        std::vector<uint64_t> got;
        for (const plan::Run& r : runs) {
          EXPECT_EQ(r.source, 3u);
          for (uint64_t b = 0; b < r.length; ++b) got.push_back(r.offset + b);
        }
        ASSERT_EQ(got, std::vector<uint64_t>(want.begin() + begin, want.begin() + end))
            << "window " << begin << ".." << end;
      }
  }
}

// A C-order tensor whose storage is cut into pieces in several files (hfai's torch.chunk pieces:
// chunk length 269 elements of a [37,29] tensor, so pieces end mid-row), and boxes of it: every
// byte window maps to the (file, offset) pairs element-by-element indexing gives.
TEST(StridedContent, PiecesAndBoxesMatchElementwiseIndexing) {
  const Shape shape{37, 29};
  const int64_t n = product(shape), chunk = (n + 3) / 4;
  const uint32_t e = 2;
  auto pieces = std::make_shared<std::vector<StoragePiece>>();
  for (int64_t i = 0; i * chunk < n; ++i) {
    const uint64_t len = static_cast<uint64_t>(std::min(chunk, n - i * chunk)) * e;
    pieces->push_back({static_cast<uint64_t>(i * chunk) * e, static_cast<uint32_t>(i),
                       static_cast<uint64_t>(64 * (i + 1)), len});
  }
  StridedContent whole;
  whole.pieces = pieces;
  whole.element_size = e;
  whole.shape = shape;
  whole.strides = {29, 1};
  struct Box {
    Shape begin, extent;
  };
  for (const Box& b : {Box{{0, 0}, {37, 29}}, Box{{10, 0}, {9, 29}}, Box{{3, 7}, {20, 11}},
                       Box{{36, 28}, {1, 1}}, Box{{5, 5}, {0, 3}}}) {
    const StridedContent s = whole.box(b.begin, b.extent);
    std::vector<std::pair<uint32_t, uint64_t>> want;
    for (int64_t i = 0; i < product(b.extent); ++i) {
      const Shape coord = unflatten(i, b.extent);
      const int64_t elem = (b.begin[0] + coord[0]) * 29 + b.begin[1] + coord[1];
      const int64_t c = elem / chunk;
      for (uint32_t k = 0; k < e; ++k)
        want.emplace_back(static_cast<uint32_t>(c),
                          static_cast<uint64_t>(64 * (c + 1) + (elem - c * chunk) * e + k));
    }
    ASSERT_TRUE(windows_match(s, want, 5, {61}));
  }
  EXPECT_EQ(whole.sources(), (std::vector<uint32_t>{0, 1, 2, 3}));
}

// GridContent against element-by-element indexing: chunks tiling a tensor as a grid (uneven
// cuts, column splits, chunks stored transposed or at a storage offset, each in its own file):
// every byte window maps to the (file, offset) pairs that hold exactly those bytes, as cutting the
// tensor cell by cell gives them.
TEST(GridContent, EveryWindowMatchesElementwiseIndexing) {
  struct GridCase {
    Shape shape;
    std::vector<Shape> cuts;
    bool transpose_odd;  // odd-numbered cells stored with reversed strides
  };
  const std::vector<GridCase> cases{
      {{4, 9}, {{0, 4}, {0, 3, 6, 9}}, false},               // Shard(1): column-split
      {{5, 7, 3}, {{0, 2, 5}, {0, 1, 4, 7}, {0, 3}}, true},  // uneven, two dims cut
      {{6, 4}, {{0, 2, 4, 5, 6}, {0, 4}}, true},             // Shard(0), uneven
      {{3, 4, 6}, {{0, 3}, {0, 4}, {0, 5, 6}}, false},       // only the last dim cut
  };
  const uint32_t e = 2;
  for (const GridCase& c : cases) {
    GridContent g;
    g.element_size = e;
    g.shape = c.shape;
    g.cuts = c.cuts;
    Shape grid;
    for (const Shape& cut : c.cuts) grid.push_back(static_cast<int64_t>(cut.size()) - 1);
    std::vector<StridedContent> views;
    for (int64_t i = 0; i < product(grid); ++i) {
      const Shape cell = unflatten(i, grid);
      StridedContent v;
      v.source = static_cast<uint32_t>(i);
      v.base = 100 * static_cast<uint64_t>(i + 1);
      v.element_size = e;
      v.storage_offset = static_cast<uint64_t>(i % 3);
      for (size_t d = 0; d < cell.size(); ++d)
        v.shape.push_back(c.cuts[d][cell[d] + 1] - c.cuts[d][cell[d]]);
      v.strides.assign(v.shape.size(), 1);
      if (c.transpose_odd && i % 2 == 1)
        for (size_t d = 1; d < v.shape.size(); ++d)
          v.strides[d] = v.strides[d - 1] * v.shape[d - 1];
      else
        for (size_t d = v.shape.size(); d-- > 1;) v.strides[d - 1] = v.strides[d] * v.shape[d];
      views.push_back(v);
      g.cells.push_back(std::make_shared<const StridedContent>(v));
    }
    // The (file, offset) pairs of element x's bytes, found cell by cell.
    const auto bytes_of = [&](const Shape& x, Located& out) {
      Shape cell(x.size());
      for (size_t d = 0; d < x.size(); ++d)
        while (c.cuts[d][cell[d] + 1] <= x[d]) ++cell[d];
      const StridedContent& v = views[static_cast<size_t>(flatten(cell, grid))];
      uint64_t elem = v.storage_offset;
      for (size_t d = 0; d < x.size(); ++d)
        elem += static_cast<uint64_t>((x[d] - c.cuts[d][cell[d]]) * v.strides[d]);
      for (uint32_t b = 0; b < e; ++b) out.emplace_back(v.source, v.base + elem * e + b);
    };
    Located want;
    for (int64_t i = 0; i < product(c.shape); ++i) bytes_of(unflatten(i, c.shape), want);
    ASSERT_TRUE(windows_match(g, want, 3, {7, 29}));
    // Every box whose corners are at 0, 1, a cut or the end (a --dst-strategy block cut from
    // the grid): each byte window of the box's grid maps to the bytes of the box's elements.
    std::vector<Shape> marks(c.shape.size());
    for (size_t d = 0; d < c.shape.size(); ++d) {
      std::set<int64_t> m(c.cuts[d].begin(), c.cuts[d].end());
      m.insert(std::min<int64_t>(1, c.shape[d]));
      marks[d].assign(m.begin(), m.end());
    }
    std::vector<size_t> lo(c.shape.size(), 0), hi(c.shape.size(), 0);
    size_t boxes = 0;
    const std::function<void(size_t)> each_box = [&](size_t d) {
      if (d < c.shape.size()) {
        for (lo[d] = 0; lo[d] < marks[d].size(); ++lo[d])
          for (hi[d] = lo[d]; hi[d] < marks[d].size(); ++hi[d]) each_box(d + 1);
        return;
      }
      Shape begin, extent;
      for (size_t k = 0; k < c.shape.size(); ++k) {
        begin.push_back(marks[k][lo[k]]);
        extent.push_back(marks[k][hi[k]] - marks[k][lo[k]]);
      }
      const GridContent b = g.box(begin, extent);
      ++boxes;
      Located in_box;
      for (int64_t i = 0; i < product(extent); ++i) {
        Shape x = unflatten(i, extent);
        for (size_t k = 0; k < x.size(); ++k) x[k] += begin[k];
        bytes_of(x, in_box);
      }
      ASSERT_TRUE(windows_match(b, in_box, 5, {13})) << "box at " << begin[0];
    };
    each_box(0);
    EXPECT_GT(boxes, 20u);
  }
}

}  // namespace
}  // namespace ckptfs::plan
