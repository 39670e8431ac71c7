// A POSIX extended regular expression (grep -E's syntax) matched against a whole name. Not
// std::regex: its matcher recurses once per character, and a checkpoint's tensor name may be as
// long as its file makes it (a 200 kB name overflows the stack); glibc's matcher works in bounded
// stack. Names may hold NUL bytes (REG_STARTEND: the bounds, not a terminator, end them).
// Thread-safety: compiled once; matching is const and may run on several threads at once.
#pragma once

#include <regex.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/error.h"

namespace ckptfs::util {

// glibc's regcomp expands every repetition count (`{m,n}` makes n copies, nested ones multiply)
// and its matcher backtracks on back-references: a rule of 25 characters could then run for
// hours. A rule may hold no back-reference and repeat its parts at most this many times in all.
inline constexpr uint64_t kMaxExpanded = 256;

// Throws Error naming `what` for a back-reference or a pattern whose repetition counts expand
// past kMaxExpanded atoms. A bound, not a parser: regcomp still decides what is valid.
inline void check_regex_cost(std::string_view p, std::string_view what) {
  struct Group {
    uint64_t total = 0;  // the atoms of the group so far, repetitions expanded
    uint64_t last = 0;   // those of its last item, which a repetition count applies to
  };
  std::vector<Group> groups(1);
  auto add = [&](uint64_t n) {
    groups.back().total += n;
    groups.back().last = n;
  };
  auto too_large = [&] {
    fail(
        "{}: the pattern repeats its parts more than {} times in all (its {{m,n}} counts, "
        "nested ones multiplied); write it with * or + instead",
        what, kMaxExpanded);
  };
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\') {
      if (i + 1 < p.size() && p[i + 1] >= '1' && p[i + 1] <= '9')
        fail(
            "{}: a back-reference (\\{}) is not allowed: matching it can take exponential time; "
            "write the pattern without it",
            what, p[i + 1]);
      ++i;
      add(1);
    } else if (c == '[') {  // a bracket expression is one atom, whatever it holds
      size_t j = i + 1;
      if (j < p.size() && p[j] == '^') ++j;
      if (j < p.size() && p[j] == ']') ++j;
      while (j < p.size() && p[j] != ']') {
        if (p[j] == '[' && j + 1 < p.size() &&
            (p[j + 1] == ':' || p[j + 1] == '=' || p[j + 1] == '.')) {
          const size_t end = p.find(std::string{p[j + 1], ']'}, j + 2);
          j = end == std::string::npos ? p.size() : end + 2;
        } else {
          ++j;
        }
      }
      i = j;
      add(1);
    } else if (c == '(') {
      groups.emplace_back();
    } else if (c == ')' && groups.size() > 1) {
      const uint64_t n = groups.back().total;
      groups.pop_back();
      add(n);
    } else if (c == '{') {
      uint64_t high = 0;
      size_t j = i + 1;
      for (; j < p.size() && p[j] >= '0' && p[j] <= '9'; ++j)
        high = std::min<uint64_t>(high * 10 + static_cast<uint64_t>(p[j] - '0'), kMaxExpanded + 1);
      if (j < p.size() && p[j] == ',') {
        const size_t upper = ++j;
        uint64_t n = 0;
        for (; j < p.size() && p[j] >= '0' && p[j] <= '9'; ++j)
          n = std::min<uint64_t>(n * 10 + static_cast<uint64_t>(p[j] - '0'), kMaxExpanded + 1);
        if (j > upper) high = n;  // {m,}: m copies and a star
      }
      i = j;  // the closing brace (regcomp refuses a count left open)
      Group& g = groups.back();
      if (high > 1) {
        if (g.last * (high - 1) > kMaxExpanded) too_large();
        g.total += g.last * (high - 1);
        g.last *= high;
      }
    } else if (c == '|') {
      groups.back().last = 0;
    } else if (c != '*' && c != '+' && c != '?') {
      add(1);
    }
    if (groups.back().total > kMaxExpanded) too_large();
  }
}

class PosixRegex {
 public:
  // Compiles `pattern` (after check_regex_cost), anchored at both ends so that it must match the
  // whole name. With `groups`, match() reports the parenthesized groups. Throws Error "<what>: not
  // a regular expression (<why>)".
  PosixRegex(const std::string& pattern, std::string_view what, bool groups = false) {
    check_regex_cost(pattern, what);
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
