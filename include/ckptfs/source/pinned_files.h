// The chosen source files as a shipped index keeps them (`index build --dst-strategy` writes
// them, a pinned mount reads them back instead of listing the source directory). The text is
// read from a file another machine copied, so parsing it trusts nothing. Pure functions; safe
// from any thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "ckptfs/source/step_choice.h"

namespace ckptfs::source {

// "mixed 0" or "mixed 1" (Choice::mixed_allowed), then one "<rank>\t<path>" line per chosen
// file; every line ends in '\n'. `choice`'s paths are written as they are (callers make them
// absolute).
std::string files_text(const Choice& choice);

// The Choice files_text wrote (files and mixed_allowed only); nullopt for anything else: a
// missing or unknown first line, a line without a tab or its final '\n', a rank that is not a
// non-negative decimal number or is given twice, a path that is not absolute or holds a NUL,
// and a text naming no file.
std::optional<Choice> parse_files_text(std::string_view text);

}  // namespace ckptfs::source
