// The one error type of ckptfs. Its message already names what is wrong and where (file and
// byte offset, parameter, option), so callers print it as is. It never crosses the FUSE C
// boundary: the fs layer turns it into an errno and a log line.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

namespace ckptfs {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

// The text of an errno value (thread-safe, unlike strerror).
inline std::string errno_text(int err) {
  return std::error_code(err, std::generic_category()).message();
}

}  // namespace ckptfs
