#include "ckptfs/ckpt/crc32.h"

#include <zlib.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <bit>
#include <climits>
#include <cstring>

namespace ckptfs::ckpt {

namespace {

// Below this length zlib's per-call setup dominates: an index build digests millions of record
// headers of some 50 bytes each, which zlib ran at a quarter of the rate of the table walk below.
// From here on zlib's braided loop is the faster one, where the folding below is not available.
constexpr size_t kShortSpan = 256;
// The folding takes 16 bytes at least (a record header of 50 bytes: three folds and two bytes of
// table walk, a third of the table walk's instructions).
constexpr size_t kFoldSpan = 16;

// Slicing-by-8 tables of the reflected zlib polynomial: kTables[0] is the byte-at-a-time table,
// kTables[k][b] the CRC of byte b followed by k zero bytes.
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
    t[0][i] = c;
  }
  for (size_t s = 1; s < 8; ++s)
    for (size_t i = 0; i < 256; ++i) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  return t;
}

constexpr Tables kTables = make_tables();

// On the inverted state (as the folding below), so that the two can hand over to each other.
uint32_t table_walk(uint32_t crc, const uint8_t* p, size_t n) {
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    if constexpr (std::endian::native == std::endian::big) w = __builtin_bswap64(w);
    w ^= crc;
    crc = kTables[7][w & 0xff] ^ kTables[6][(w >> 8) & 0xff] ^ kTables[5][(w >> 16) & 0xff] ^
          kTables[4][(w >> 24) & 0xff] ^ kTables[3][(w >> 32) & 0xff] ^
          kTables[2][(w >> 40) & 0xff] ^ kTables[1][(w >> 48) & 0xff] ^ kTables[0][w >> 56];
  }
  for (; n > 0; ++p, --n) crc = (crc >> 8) ^ kTables[0][(crc ^ *p) & 0xff];
  return crc;
}

#if defined(__x86_64__)
// Carry-less multiplication folding (the method of Intel's "Fast CRC Computation for Generic
// Polynomials Using PCLMULQDQ", reflected form): 64 bytes folded per step into four 128-bit
// lanes (16 into one lane below 64), the lanes into one, then a Barrett reduction to 32 bits.
// The constants are x^k mod P for the fold distances and P's quotient, bit-reflected. n >= 16 and a
// multiple of 16; on the inverted state. About ten times zlib's rate on the index entries this
// checks.
#define CKPTFS_CLMUL __attribute__((target("pclmul,sse4.1")))

CKPTFS_CLMUL __m128i load(const uint8_t* at) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(at));
}

// x carried 128 bits further (x times k) and added to the next 16 bytes.
CKPTFS_CLMUL __m128i fold16(__m128i x, __m128i k, __m128i next) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x11), next),
                       _mm_clmulepi64_si128(x, k, 0x00));
}

CKPTFS_CLMUL uint32_t fold(uint32_t crc, const uint8_t* p, size_t n) {
  __m128i x1 = _mm_xor_si128(load(p), _mm_cvtsi32_si128(static_cast<int>(crc)));
  const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009e, 0x01751997d0);
  if (n >= 64) {
    __m128i x2 = load(p + 16), x3 = load(p + 32), x4 = load(p + 48);
    p += 64;
    n -= 64;
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596, 0x0154442bd4);
    for (; n >= 64; p += 64, n -= 64) {
      x1 = fold16(x1, k1k2, load(p));
      x2 = fold16(x2, k1k2, load(p + 16));
      x3 = fold16(x3, k1k2, load(p + 32));
      x4 = fold16(x4, k1k2, load(p + 48));
    }
    x1 = fold16(x1, k3k4, x2);
    x1 = fold16(x1, k3k4, x3);
    x1 = fold16(x1, k3k4, x4);
  } else {
    p += 16;
    n -= 16;
  }
  for (; n >= 16; p += 16, n -= 16) x1 = fold16(x1, k3k4, load(p));
  // 128 bits to 64, then Barrett's reduction to 32.
  const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
  __m128i x2 = _mm_clmulepi64_si128(x1, k3k4, 0x10);
  x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
  x2 = _mm_srli_si128(x1, 4);
  x1 = _mm_and_si128(x1, low32);
  x1 = _mm_xor_si128(_mm_clmulepi64_si128(x1, _mm_set_epi64x(0, 0x0163cd6124), 0x00), x2);
  const __m128i poly = _mm_set_epi64x(0x01f7011641, 0x01db710641);
  x2 = _mm_and_si128(x1, low32);
  x2 = _mm_and_si128(_mm_clmulepi64_si128(x2, poly, 0x10), low32);
  x2 = _mm_clmulepi64_si128(x2, poly, 0x00);
  x1 = _mm_xor_si128(x1, x2);
  return static_cast<uint32_t>(_mm_extract_epi32(x1, 1));
}

const bool kHasClmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif

}  // namespace

uint32_t crc32_update(uint32_t crc, std::span<const uint8_t> bytes) {
#if defined(__x86_64__)
  if (kHasClmul && bytes.size() >= kFoldSpan) {
    const size_t folded = bytes.size() & ~size_t{15};
    const uint32_t state = fold(~crc, bytes.data(), folded);
    return ~table_walk(state, bytes.data() + folded, bytes.size() - folded);
  }
#endif
  if (bytes.size() < kShortSpan) return ~table_walk(~crc, bytes.data(), bytes.size());
  uLong value = crc;
  while (!bytes.empty()) {
    const size_t n = std::min<size_t>(bytes.size(), UINT_MAX);
    value = ::crc32(value, bytes.data(), static_cast<uInt>(n));
    bytes = bytes.subspan(n);
  }
  return static_cast<uint32_t>(value);
}

}  // namespace ckptfs::ckpt
