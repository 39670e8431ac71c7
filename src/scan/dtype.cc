#include "ckptfs/scan/dtype.h"

#include <ostream>

namespace ckptfs::scan {

namespace {

// Index 0 is "" (a map tensor's), then the dense types in kDenseTypes' order, then "str".
constexpr size_t kDtypeFirstDense = 1;
constexpr size_t kDtypeString = kDtypeFirstDense + kDenseTypes.size();

std::string_view known_dtype_name(size_t i) {
  if (i == 0) return "";
  if (i == kDtypeString) return "str";
  return kDenseTypes[i - kDtypeFirstDense].name;
}

}  // namespace

Dtype::Dtype(std::string_view name) {
  for (size_t i = 0; i <= kDtypeString; ++i)
    if (known_dtype_name(i) == name) {
      known_ = static_cast<uint8_t>(i);
      return;
    }
  other_ = std::make_unique<const std::string>(name);
}

Dtype::Dtype(const Dtype& other)
    : other_(other.other_ ? std::make_unique<const std::string>(*other.other_) : nullptr),
      known_(other.known_) {}

Dtype& Dtype::operator=(const Dtype& other) {
  if (this != &other) *this = Dtype(other);
  return *this;
}

std::string_view Dtype::name() const { return other_ ? *other_ : known_dtype_name(known_); }

uint32_t Dtype::element_size() const {
  if (other_ || known_ < kDtypeFirstDense || known_ >= kDtypeString) return 0;
  return kDenseTypes[known_ - kDtypeFirstDense].size;
}

std::ostream& operator<<(std::ostream& out, const Dtype& dtype) { return out << dtype.name(); }

}  // namespace ckptfs::scan
