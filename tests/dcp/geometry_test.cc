// check_chunks on chunk sets a hostile .metadata can hold: many chunks must be checked in about
// n log n, whatever their arrangement, and an overlap among them still found.
#include "../../src/dcp/geometry.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "ckptfs/error.h"

namespace ckptfs::dcp {
namespace {

Tensor tensor(std::vector<int64_t> shape) {
  return Tensor{.fqn = std::string(1, 'w'),
                .code = std::string("F32"),
                .element_size = 4,
                .shape = std::move(shape),
                .chunks = {}};
}

void add(Tensor& t, std::vector<int64_t> offsets, std::vector<int64_t> sizes) {
  Chunk& c = t.chunks.emplace_back();
  c.offsets = std::move(offsets);
  c.sizes = std::move(sizes);
}

double seconds_to_check(const Tensor& t) {
  const auto start = std::chrono::steady_clock::now();
  check_chunks(".metadata", t);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// (Timings are generous for a loaded machine; the old check took minutes.) Before: every pair of
// the 200 000 chunks sharing row 0 was compared (about 2e10 pairs, minutes); a .metadata of 25 MB
// holds them.
TEST(DcpGeometry, ManyChunksInOneRowAreCheckedQuickly) {
  const int64_t n = 200000;
  Tensor t = tensor({1, n});
  for (int64_t i = 0; i < n; ++i) add(t, {0, i}, {1, 1});
  EXPECT_LT(seconds_to_check(t), 20.0);
  add(t, {0, n - 1}, {1, 1});  // one more on the last: an overlap (and too many elements)
  t.shape = {1, n};
  EXPECT_THROW(check_chunks(".metadata", t), Error);
}

// Rows of 2-wide bricks, every other row shifted by one: no grid. `k` rows of about `k` each.
Tensor brick_wall(int64_t k) {
  Tensor t = tensor({k, 2 * k});
  for (int64_t r = 0; r < k; ++r) {
    const int64_t shift = r % 2;
    if (shift) add(t, {r, 0}, {1, 1});
    for (int64_t c = 0; c + 1 < k; ++c) add(t, {r, shift + 2 * c}, {1, 2});
    add(t, {r, shift + 2 * (k - 1)}, {1, 2 - shift});
  }
  return t;
}

// A grid of 700 x 700 chunks passes in seconds; so does a small brick wall, and a large one is
// refused in seconds, in one line saying why, instead of being compared pair by pair.
TEST(DcpGeometry, LargeGridsPassAndLargeNonGridsEndQuickly) {
  const int64_t k = 700;
  Tensor grid = tensor({k, 2 * k});
  for (int64_t r = 0; r < k; ++r)
    for (int64_t c = 0; c < k; ++c) add(grid, {r, 2 * c}, {1, 2});
  EXPECT_LT(seconds_to_check(grid), 20.0);

  EXPECT_LT(seconds_to_check(brick_wall(60)), 20.0);

  const Tensor big = brick_wall(1000);
  const auto start = std::chrono::steady_clock::now();
  try {
    check_chunks(".metadata", big);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not cells of one grid"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30.0);
}

// An overlap in a set that is not a grid, compensated by a gap so the element count is right.
TEST(DcpGeometry, OverlapCompensatedByAGapIsRefused) {
  Tensor t = tensor({4, 4});
  add(t, {0, 0}, {2, 2});
  add(t, {1, 1}, {2, 2});  // overlaps the first at (1, 1)
  add(t, {0, 2}, {1, 2});
  add(t, {3, 0}, {1, 4});
  add(t, {1, 3}, {2, 1});
  add(t, {2, 0}, {1, 1});
  try {
    check_chunks(".metadata", t);
    FAIL() << "overlap not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("overlap"), std::string::npos) << e.what();
  }
}

// A grid with one cell listed twice and another left out: refused as an overlap.
TEST(DcpGeometry, GridCellListedTwiceIsRefused) {
  Tensor t = tensor({2, 2});
  add(t, {0, 0}, {1, 1});
  add(t, {0, 1}, {1, 1});
  add(t, {1, 0}, {1, 1});
  add(t, {0, 0}, {1, 1});
  try {
    check_chunks(".metadata", t);
    FAIL() << "duplicate cell not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("overlap"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ckptfs::dcp
