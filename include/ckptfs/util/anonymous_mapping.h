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
  // When the pages are made. kOnTouch: each page on its first touch (a fault each). kNow: all
  // in the constructor, in one call, for a buffer every byte of which is about to be written:
  // faulted in page by page as a GET's body arrived, the pages of S3 ranges were a quarter of
  // the daemon's CPU in a cold read (asking for 2 MiB pages instead made it worse: clearing
  // them cost more than the faults saved). Where the kernel does not know the advice, the pages
  // are made on touch as with kOnTouch.
  enum class Pages { kOnTouch, kNow };

  AnonymousMapping() = default;
  explicit AnonymousMapping(size_t size, Pages pages = Pages::kOnTouch) {
    if (size == 0) return;
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    data_ = static_cast<uint8_t*>(p);
    size_ = size;
    if (pages == Pages::kNow) ::madvise(data_, size_, MADV_POPULATE_WRITE);
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
