// The bytes a strided view (a torch.save tensor) reaches in its storage, computed so that no
// product or sum can wrap: a crafted stride of 2^63-1 on a 16-byte element type made the end of
// a view wrap to a few bytes, inside any storage. Pure function; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

namespace ckptfs {

// Views larger than this are refused: no storage holds them, and sizes stay far from 64 bits.
inline constexpr uint64_t kMaxViewBytes = uint64_t{1} << 62;

struct ViewReach {
  uint64_t bytes = 0;  // elements x element size: what the tensor holds
  // One past the last byte of storage it reads (storage_offset + sum((size-1) x stride) + 1
  // elements), UINT64_MAX when that does not fit 64 bits; 0 for a view with no elements.
  uint64_t end = 0;
};

// Nullopt when a size or stride is negative, the lists differ in length, or the view holds
// more than kMaxViewBytes.
inline std::optional<ViewReach> view_reach(std::span<const int64_t> shape,
                                           std::span<const int64_t> stride, uint64_t offset,
                                           uint32_t element_size) {
  if (shape.size() != stride.size() || element_size == 0) return std::nullopt;
  using u128 = unsigned __int128;
  u128 numel = 1, last = offset;
  bool past = false;  // `last` went past 64 bits: the view cannot fit any storage
  for (size_t k = 0; k < shape.size(); ++k) {
    if (shape[k] < 0 || stride[k] < 0) return std::nullopt;
    numel *= static_cast<uint64_t>(shape[k]);  // below 2^125: both factors are below 2^63
    if (numel > kMaxViewBytes / element_size) return std::nullopt;
  }
  ViewReach r;
  r.bytes = static_cast<uint64_t>(numel * element_size);
  if (numel == 0) return r;
  for (size_t k = 0; k < shape.size() && !past; ++k) {
    // Each term is below 2^126 and `last` below 2^64 here, so the sum cannot wrap.
    last += static_cast<u128>(shape[k] - 1) * static_cast<uint64_t>(stride[k]);
    past = last > UINT64_MAX;
  }
  const u128 end = past ? ~u128{0} : (last + 1) * element_size;  // below 2^69: no wrap
  r.end = end > UINT64_MAX ? UINT64_MAX : static_cast<uint64_t>(end);
  return r;
}

}  // namespace ckptfs
