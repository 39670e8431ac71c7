// A vector that keeps up to N elements inside itself and only more on the heap. A scan holds
// millions of parameters, nearly all of one record: a std::vector would allocate for each.
// Elements must be trivially copyable (extents, dimensions). Not thread-safe (a value type).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <new>
#include <type_traits>

namespace ckptfs {

template <typename T, size_t N>
class SmallVector {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>);
  static_assert(N > 0);

 public:
  using value_type = T;
  using size_type = size_t;
  using difference_type = std::ptrdiff_t;
  using reference = T&;
  using const_reference = const T&;
  using pointer = T*;
  using const_pointer = const T*;
  using iterator = T*;
  using const_iterator = const T*;

  SmallVector() noexcept : heap_(nullptr) {}
  SmallVector(std::initializer_list<T> items) : heap_(nullptr) {
    assign(items.begin(), items.end());
  }
  SmallVector(const SmallVector& other) : heap_(nullptr) { assign(other.begin(), other.end()); }
  SmallVector(SmallVector&& other) noexcept : heap_(nullptr) { take(other); }
  SmallVector& operator=(const SmallVector& other) {
    if (this != &other) assign(other.begin(), other.end());
    return *this;
  }
  SmallVector& operator=(SmallVector&& other) noexcept {
    if (this != &other) {
      free_heap();
      take(other);
    }
    return *this;
  }
  SmallVector& operator=(std::initializer_list<T> items) {
    assign(items.begin(), items.end());
    return *this;
  }
  ~SmallVector() { free_heap(); }

  T* data() noexcept { return on_heap() ? heap_ : inline_; }
  const T* data() const noexcept { return on_heap() ? heap_ : inline_; }
  size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  size_t capacity() const noexcept { return capacity_; }

  T* begin() noexcept { return data(); }
  T* end() noexcept { return data() + size_; }
  const T* begin() const noexcept { return data(); }
  const T* end() const noexcept { return data() + size_; }

  T& operator[](size_t i) noexcept { return data()[i]; }
  const T& operator[](size_t i) const noexcept { return data()[i]; }
  T& front() noexcept { return data()[0]; }
  const T& front() const noexcept { return data()[0]; }
  T& back() noexcept { return data()[size_ - 1]; }
  const T& back() const noexcept { return data()[size_ - 1]; }

  void push_back(const T& value) {
    if (size_ == capacity_) {
      const T copy = value;  // `value` may be one of ours
      reserve(size_t{capacity_} * 2);
      data()[size_++] = copy;
      return;
    }
    data()[size_++] = value;
  }
  void clear() noexcept { size_ = 0; }
  void reserve(size_t n) {
    if (n <= capacity_) return;
    if (n > UINT32_MAX) throw std::bad_alloc();
    T* bigger = new T[n];
    std::copy(begin(), end(), bigger);
    free_heap();
    heap_ = bigger;
    capacity_ = static_cast<uint32_t>(n);
  }

  friend bool operator==(const SmallVector& a, const SmallVector& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  bool on_heap() const noexcept { return capacity_ > N; }

  void assign(const T* first, const T* last) {
    clear();
    reserve(static_cast<size_t>(last - first));
    std::copy(first, last, data());
    size_ = static_cast<uint32_t>(last - first);
  }

  // `other` is left empty, inline.
  void take(SmallVector& other) noexcept {
    if (other.on_heap()) {
      heap_ = other.heap_;
      other.heap_ = nullptr;
    } else {
      std::copy(other.begin(), other.end(), inline_);
    }
    size_ = other.size_;
    capacity_ = other.capacity_;
    other.size_ = 0;
    other.capacity_ = N;
  }

  void free_heap() noexcept {
    if (!on_heap()) return;
    delete[] heap_;
    capacity_ = N;
  }

  union {
    T inline_[N];
    T* heap_;
  };
  uint32_t size_ = 0;
  uint32_t capacity_ = N;
};

}  // namespace ckptfs
