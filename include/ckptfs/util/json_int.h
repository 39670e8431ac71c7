// Integers from JSON files other programs wrote (strategy files, MindFormers' metadata.json): an
// integer within [lo, hi], or `refuse(why)` called, which must throw (the caller's Error naming
// its file and key). Any nlohmann JSON type. Pure; thread-safe.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string_view>
#include <vector>

namespace ckptfs::util {

template <class Json, class Refuse>
int64_t json_int(const Json& value, int64_t lo, int64_t hi, const Refuse& refuse) {
  if (!value.is_number_integer()) refuse("is not an integer");
  // An unsigned value past INT64_MAX is compared before it could wrap to a negative one.
  if (value.is_number_unsigned() && value.template get<uint64_t>() > static_cast<uint64_t>(hi))
    refuse(fmt::format("value {} is out of range", value.template get<uint64_t>()));
  const auto v = value.template get<int64_t>();
  if (v < lo || v > hi) refuse(fmt::format("value {} is out of range", v));
  return v;
}

template <class Json, class Refuse>
std::vector<int64_t> json_ints(const Json& value, int64_t lo, int64_t hi, const Refuse& refuse) {
  if (!value.is_array()) refuse("is not a list of integers");
  std::vector<int64_t> out;
  for (const Json& v : value) out.push_back(json_int(v, lo, hi, refuse));
  return out;
}

}  // namespace ckptfs::util
