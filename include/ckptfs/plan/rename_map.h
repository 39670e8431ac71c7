// A rename map (--rename FILE): ordered rules that give a checkpoint's tensors the names a loader
// wants, without code. One rule a line, `REGEX REPLACEMENT` separated by spaces or tabs (neither
// holds whitespace); blank lines and lines starting with '#' are skipped. REGEX is POSIX extended
// (grep -E's) and must match the whole key; the FIRST rule whose REGEX matches renames the key,
// later rules are not tried; a key no rule matches keeps its name. In REPLACEMENT, \1 ... \9 are
// REGEX's groups, \0 the whole key, \\ a backslash. Reading refuses a rule that is not one, and
// renaming refuses an empty name and two tensors served under one name, each in one line naming
// the file (and line).
// Thread-safety: immutable once read; apply() may run on any thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/util/posix_regex.h"

namespace ckptfs::plan {

class RenameMap {
 public:
  // The rules of the file at `path`. Throws Error "<path>:<line>: ..." for a line that is not a
  // rule (not two fields, a bad REGEX, a \N naming no group, a stray backslash), "<path>: ..."
  // for a file that cannot be read.
  static std::shared_ptr<const RenameMap> read(const std::string& path);
  // The same from `text`, which messages call `file`.
  static std::shared_ptr<const RenameMap> parse(std::string_view text, const std::string& file);

  // The name `key` is served under. Throws Error naming the file and the rule's line if it makes
  // the name empty.
  std::string apply(std::string_view key) const;
  // Every key renamed, in order. Throws Error naming the file if two keys (renamed or not) would
  // be served under one name.
  std::vector<std::string> apply_all(const std::vector<std::string>& keys) const;

  const std::string& file() const { return file_; }

 private:
  struct Rule {
    std::unique_ptr<util::PosixRegex> regex;
    std::string replacement;
    size_t line = 0;
  };
  std::string file_;
  std::vector<Rule> rules_;
};

}  // namespace ckptfs::plan
