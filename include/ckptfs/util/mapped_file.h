// A read-only shared mapping of a whole file, unmapped on destruction.
// Thread-safety: data() and size(), and reads of the mapped bytes, may run from many threads at
// once; reset(), assignment and destruction must not race with them (nothing synchronizes).
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <utility>

namespace ckptfs {

class MappedFile {
 public:
  MappedFile() = default;
  // Maps `size` bytes of `fd` from offset 0; empty (data() null) if size is 0 or mmap fails.
  MappedFile(int fd, size_t size) {
    if (size == 0) return;
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return;
    data_ = static_cast<const char*>(p);
    size_ = size;
  }
  MappedFile(MappedFile&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  MappedFile& operator=(MappedFile&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() { reset(); }

  const char* data() const { return data_; }
  size_t size() const { return size_; }
  void reset() {
    if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
    data_ = nullptr;
    size_ = 0;
  }

 private:
  const char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ckptfs
