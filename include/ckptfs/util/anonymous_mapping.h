// Private anonymous pages mapped for one owner and unmapped when it frees them: their memory
// leaves the process at once, where a freed heap block can stay in the allocator's arenas. The
// kernel hands the pages over zeroed. Size 0 maps nothing (data() null); a failed mmap throws
// std::bad_alloc. Thread-safety: one owner at a time; the bytes may be read and written from
// any thread the owner lets, but reset(), assignment and destruction must not race with that.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>

namespace ckptfs {

class AnonymousMapping {
 public:
  AnonymousMapping() = default;
  explicit AnonymousMapping(size_t size) {
    if (size == 0) return;
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    data_ = static_cast<uint8_t*>(p);
    size_ = size;
  }
  AnonymousMapping(AnonymousMapping&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  AnonymousMapping& operator=(AnonymousMapping&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  AnonymousMapping(const AnonymousMapping&) = delete;
  AnonymousMapping& operator=(const AnonymousMapping&) = delete;
  ~AnonymousMapping() { reset(); }

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // Unmaps the pages now; empty afterwards.
  void reset() noexcept {
    if (data_ != nullptr) ::munmap(data_, size_);
    data_ = nullptr;
    size_ = 0;
  }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ckptfs
