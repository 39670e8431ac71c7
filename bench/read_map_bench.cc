// Cost of turning one 1 MiB read request into source runs (plan::TensorContent::map and
// plan::VirtualFile::map), for the layouts the FUSE read path meets: a target that is a row
// range of row-split blocks (one or two long runs per request), a target that splits the last
// dimension (one short run per row: hundreds to thousands per request), and 3-D expert tensors.
//
// map() only does arithmetic on shapes and content extents, so the TensorContent is built by
// hand from scan::Param objects with made-up extents; no files are read. Each iteration maps
// the next 1 MiB window of the target (wrapping), so the figure is an average over positions,
// not the cost of offset 0 only. Counters: runs per request, and the rate of requests.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "ckptfs/ckpt/scanner.h"
#include "ckptfs/plan/read_map.h"
#include "ckptfs/plan/virtual_file.h"

namespace {

using ckptfs::scan::Param;
using ckptfs::plan::Run;
using ckptfs::plan::SourceBlock;
using ckptfs::plan::TensorContent;
using ckptfs::plan::VirtualFile;
using Shape = std::vector<int64_t>;

constexpr uint64_t kRequest = 1 << 20;

int64_t product(const Shape& s) {
  return std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<>());
}

// A global tensor cut into source blocks (`splits` per dimension), each block one source file
// (block i -> source i, as in one rank file per block), and the target box read from it. The
// Params outlive the TensorContent that points at them.
struct Layout {
  std::vector<std::unique_ptr<Param>> params;
  std::shared_ptr<TensorContent> content;
};

// `records_per_block` > 1 cuts each block's content into that many extents, the way a >512 MiB
// parameter is saved as several records (the map then walks extents).
Layout make_layout(const Shape& global, const Shape& splits, const Shape& target_begin,
                   const Shape& target_shape, uint32_t element_size, int records_per_block = 1) {
  Layout l;
  const size_t k = global.size();
  Shape block_shape(k);
  for (size_t j = 0; j < k; ++j) block_shape[j] = global[j] / splits[j];
  const uint64_t block_bytes = static_cast<uint64_t>(product(block_shape)) * element_size;
  const int64_t nblocks = product(splits);
  for (int64_t b = 0; b < nblocks; ++b) {
    auto p = std::make_unique<Param>();
    // Content starts after a plausible header; extents are consecutive with a small gap (the
    // next record's header) between them.
    uint64_t at = 128;
    const uint64_t piece = (block_bytes + records_per_block - 1) / records_per_block;
    for (uint64_t done = 0; done < block_bytes;) {
      const uint64_t n = std::min(piece, block_bytes - done);
      p->content.push_back({at, n});
      at += n + 96;
      done += n;
    }
    l.params.push_back(std::move(p));
  }
  auto c = std::make_shared<TensorContent>();
  c->element_size = element_size;
  c->target_begin = target_begin;
  c->target_shape = target_shape;
  c->block_shape = block_shape;
  for (size_t j = 0; j < k; ++j) {
    const int64_t first = target_begin[j] / block_shape[j];
    const int64_t last = (target_begin[j] + target_shape[j] - 1) / block_shape[j];
    c->first_block.push_back(first);
    c->grid.push_back(last - first + 1);
  }
  // Blocks intersecting the box, in C order over the grid.
  const int64_t ngrid = product(c->grid);
  for (int64_t g = 0; g < ngrid; ++g) {
    int64_t rest = g, flat = 0;
    Shape coord(k);
    for (size_t j = k; j-- > 0;) {
      coord[j] = rest % c->grid[j] + c->first_block[j];
      rest /= c->grid[j];
    }
    for (size_t j = 0; j < k; ++j) flat = flat * splits[j] + coord[j];
    c->blocks.push_back(SourceBlock{static_cast<uint32_t>(flat), l.params[flat].get()});
  }
  l.content = std::move(c);
  return l;
}

void run_tensor_map(benchmark::State& state, const Layout& l) {
  const uint64_t total = l.content->nbytes();
  std::vector<Run> runs;
  runs.reserve(8192);
  uint64_t offset = 0, requests = 0, run_count = 0;
  for (auto _ : state) {
    runs.clear();
    const uint64_t end = std::min(offset + kRequest, total);
    l.content->map(offset, end, runs);
    benchmark::DoNotOptimize(runs.data());
    run_count += runs.size();
    ++requests;
    offset = end >= total ? 0 : end;
  }
  state.counters["runs_per_req"] =
      benchmark::Counter(static_cast<double>(run_count) / static_cast<double>(requests));
  state.counters["req_per_s"] =
      benchmark::Counter(static_cast<double>(requests), benchmark::Counter::kIsRate);
  state.SetBytesProcessed(static_cast<int64_t>(requests * kRequest));
}

// bf16 [4096, 4096] saved row-split over 8 ranks ([512, 4096] blocks); the target takes rows
// 1024..2047 (row split over 4): each request is one run, or two where it crosses a block.
void BM_Contiguous_RowRangeOfRowBlocks(benchmark::State& state) {
  static const Layout l = make_layout({4096, 4096}, {8, 1}, {1024, 0}, {1024, 4096}, 2);
  run_tensor_map(state, l);
}

// Same source, target splits the LAST dimension over 4 (columns 1024..2047): every target row
// is 2 KiB from one block, so a 1 MiB request is 512 runs.
void BM_Strided_ColumnsOfRowBlocks(benchmark::State& state) {
  static const Layout l = make_layout({4096, 4096}, {8, 1}, {0, 1024}, {4096, 1024}, 2);
  run_tensor_map(state, l);
}

// Source split by columns over 8 ([4096, 512] blocks), target columns over 4: every target row
// needs two blocks, 1 KiB each, so 1024 runs per request.
void BM_Strided_ColumnsOfColumnBlocks(benchmark::State& state) {
  static const Layout l = make_layout({4096, 4096}, {1, 8}, {0, 1024}, {4096, 1024}, 2);
  run_tensor_map(state, l);
}

// Float32 embedding [65536, 2048] row-split over 8 (64 MiB blocks, each saved as 4 records),
// target = columns over 4: 2 KiB runs, and the extent walk of a multi-record block.
void BM_Strided_ColumnsOfChunkedFloat32(benchmark::State& state) {
  static const Layout l =
      make_layout({65536, 2048}, {8, 1}, {0, 512}, {65536, 512}, 4, /*records_per_block=*/4);
  run_tensor_map(state, l);
}

// 3-D experts bf16 [16, 2048, 1024]: source split over experts (dim 0) by 8, target over the
// middle dimension by 4: runs of 512 rows x 1024 = 1 MiB, i.e. one or two runs per request.
void BM_Contiguous3D_MiddleOfExpertBlocks(benchmark::State& state) {
  static const Layout l = make_layout({16, 2048, 1024}, {8, 1, 1}, {0, 512, 0}, {16, 512, 1024}, 2);
  run_tensor_map(state, l);
}

// Same experts, target splits the last dimension by 4: 256-element (512 B) runs, 2048 per
// request, the worst case a transformer layout produces.
void BM_Strided3D_LastDimOfExpertBlocks(benchmark::State& state) {
  static const Layout l = make_layout({16, 2048, 1024}, {8, 1, 1}, {0, 0, 256}, {16, 2048, 256}, 2);
  run_tensor_map(state, l);
}

// A whole target file: per tensor a record header (in memory) then its content, like the
// planner builds. `tensors` layers of strided bf16 [2048, 2048] column slices plus small
// Float32 norm vectors; the request also pays the piece search and header runs.
void BM_VirtualFile_StridedLayers(benchmark::State& state) {
  static std::vector<Layout> layouts;
  static VirtualFile file = [] {
    VirtualFile::Builder b;
    for (int i = 0; i < 64; ++i) {
      layouts.push_back(make_layout({2048, 2048}, {8, 1}, {0, 512}, {2048, 512}, 2));
      b.add_bytes(std::string(70, 'h'));
      const auto& c = layouts.back().content;
      b.add_tensor(c, 0, c->nbytes());
      layouts.push_back(make_layout({2048}, {8}, {0}, {2048}, 4));
      b.add_bytes(std::string(60, 'h'));
      const auto& n = layouts.back().content;
      b.add_tensor(n, 0, n->nbytes());
    }
    return b.finish();
  }();
  std::vector<Run> runs;
  runs.reserve(8192);
  uint64_t offset = 0, requests = 0, run_count = 0;
  for (auto _ : state) {
    runs.clear();
    const uint64_t got = file.map(offset, kRequest, runs);
    benchmark::DoNotOptimize(runs.data());
    run_count += runs.size();
    ++requests;
    offset = offset + got >= file.size() ? 0 : offset + got;
  }
  state.counters["runs_per_req"] =
      benchmark::Counter(static_cast<double>(run_count) / static_cast<double>(requests));
  state.counters["req_per_s"] =
      benchmark::Counter(static_cast<double>(requests), benchmark::Counter::kIsRate);
  state.SetBytesProcessed(static_cast<int64_t>(requests * kRequest));
}

}  // namespace

BENCHMARK(BM_Contiguous_RowRangeOfRowBlocks);
BENCHMARK(BM_Strided_ColumnsOfRowBlocks);
BENCHMARK(BM_Strided_ColumnsOfColumnBlocks);
BENCHMARK(BM_Strided_ColumnsOfChunkedFloat32);
BENCHMARK(BM_Contiguous3D_MiddleOfExpertBlocks);
BENCHMARK(BM_Strided3D_LastDimOfExpertBlocks);
BENCHMARK(BM_VirtualFile_StridedLayers);

BENCHMARK_MAIN();
