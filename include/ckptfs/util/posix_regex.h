// A POSIX extended regular expression (grep -E's syntax) matched against a whole name. Not
// std::regex: its matcher recurses once per character, and a checkpoint's tensor name may be as
// long as its file makes it (a 200 kB name overflows the stack); glibc's matcher works in bounded
// stack. Names may hold NUL bytes (REG_STARTEND: the bounds, not a terminator, end them).
// Thread-safety: compiled once; matching is const and may run on several threads at once.
#pragma once

#include <regex.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/error.h"

namespace ckptfs::util {

class PosixRegex {
 public:
  // Compiles `pattern`, anchored at both ends so that it must match the whole name. With
  // `groups`, match() reports the parenthesized groups. Throws Error "<what>: not a regular
  // expression (<why>)".
  PosixRegex(const std::string& pattern, std::string_view what, bool groups = false) {
    const int err =
        ::regcomp(&re_, ("^(" + pattern + ")$").c_str(), REG_EXTENDED | (groups ? 0 : REG_NOSUB));
    if (err != 0) {
      char why[256];
      ::regerror(err, &re_, why, sizeof why);
      fail("{}: not a regular expression ({})", what, why);
    }
  }
  PosixRegex(const PosixRegex&) = delete;
  PosixRegex& operator=(const PosixRegex&) = delete;
  ~PosixRegex() { ::regfree(&re_); }

  bool matches(std::string_view name) const {
    regmatch_t bounds{0, static_cast<regoff_t>(name.size())};
    return ::regexec(&re_, name.data(), 1, &bounds, REG_STARTEND) == 0;
  }

  // How many parenthesized groups the pattern has (the anchoring one not counted).
  size_t groups() const { return re_.re_nsub - 1; }

  // On a match, the bounds in `name` of the whole name (element 0) and of each group (1 ...
  // groups(); {-1, -1} for a group that took no part); nullopt if `name` does not match.
  // Needs `groups` at construction.
  std::optional<std::vector<regmatch_t>> match(std::string_view name) const {
    std::vector<regmatch_t> m(re_.re_nsub + 1);
    m[0] = {0, static_cast<regoff_t>(name.size())};
    if (::regexec(&re_, name.data(), m.size(), m.data(), REG_STARTEND) != 0) return std::nullopt;
    m.erase(m.begin());  // the anchoring group's bounds are the whole name's
    return m;
  }

 private:
  regex_t re_;
};

}  // namespace ckptfs::util
