// MindSpore tensor_type strings (spec §1.4): the one table of them. The safetensors codes
// (safetensors/format.h) and metadata.json's dtype names map onto these.
#pragma once

#include <fmt/format.h>

#include <array>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <string_view>

namespace ckptfs::scan {

struct DenseType {
  std::string_view name;  // as MindSpore writes it: "Float32"
  uint32_t size;          // bytes per element
};

// Every tensor_type whose content is a dense array of fixed-size elements.
inline constexpr std::array<DenseType, 13> kDenseTypes{{{"Bool", 1},
                                                        {"Int8", 1},
                                                        {"UInt8", 1},
                                                        {"Int16", 2},
                                                        {"UInt16", 2},
                                                        {"Int32", 4},
                                                        {"UInt32", 4},
                                                        {"Int64", 8},
                                                        {"UInt64", 8},
                                                        {"Float16", 2},
                                                        {"Float32", 4},
                                                        {"Float64", 8},
                                                        {"BFloat16", 2}}};

// Bytes per element of a dense tensor of this type; 0 when content is not a dense array of
// fixed-size elements ("str", "Int4", "random_op", names MindSpore cannot load).
constexpr uint32_t element_size(std::string_view tensor_type) {
  for (const DenseType& t : kDenseTypes)
    if (t.name == tensor_type) return t.size;
  return 0;
}

// A tensor_type as a parameter holds it: 16 bytes, and no allocation for a name of the table
// above, "str" or "" (a map tensor's). Any other name (Int4, random_op, a name MindSpore cannot
// load) is kept on the heap. Reads as a std::string_view; compares with one.
class Dtype {
 public:
  Dtype() = default;
  Dtype(std::string_view name);  // NOLINT(google-explicit-constructor): a type name is a Dtype
  Dtype(const std::string& name) : Dtype(std::string_view(name)) {}  // NOLINT
  Dtype(const char* name) : Dtype(std::string_view(name)) {}         // NOLINT
  Dtype(const Dtype& other);
  Dtype(Dtype&&) noexcept = default;
  Dtype& operator=(const Dtype& other);
  Dtype& operator=(Dtype&&) noexcept = default;
  ~Dtype() = default;

  std::string_view name() const;
  operator std::string_view() const { return name(); }  // NOLINT(google-explicit-constructor)
  bool empty() const { return name().empty(); }
  // element_size(name()), without looking the name up again.
  uint32_t element_size() const;

  // One overload per kind of operand, so that no comparison needs a conversion to pick one.
  friend bool operator==(const Dtype& a, const Dtype& b) { return a.name() == b.name(); }
  friend bool operator==(const Dtype& a, std::string_view b) { return a.name() == b; }
  friend bool operator==(const Dtype& a, const std::string& b) { return a.name() == b; }
  friend bool operator==(const Dtype& a, const char* b) { return a.name() == b; }

 private:
  std::unique_ptr<const std::string> other_;  // a name outside the table, or null
  uint8_t known_ = 0;                         // else: index into the table of known names
};

std::ostream& operator<<(std::ostream& out, const Dtype& dtype);

}  // namespace ckptfs::scan

template <>
struct fmt::formatter<ckptfs::scan::Dtype> : fmt::formatter<std::string_view> {
  auto format(const ckptfs::scan::Dtype& dtype, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(dtype.name(), ctx);
  }
};
