// Little-endian field access and exact preads, shared by the zip reader and the torch scan.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace ckptfs::torchzip {

inline uint16_t le16(const char* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t le32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t le64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// Reads exactly `length` bytes at `offset`; throws Error naming the file and offset on a short
// read or an I/O error.
void read_exact(int fd, const std::string& name, uint64_t offset, char* out, uint64_t length);

}  // namespace ckptfs::torchzip
