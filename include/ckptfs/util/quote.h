// What a message may say about the bytes of a file. Messages reach places more people can read
// than the file (a world-readable log, a terminal, a ticket), and a source may be a symlink to a
// file nobody meant to expose, so a message names the file, the byte offset and what is wrong,
// and quotes the file's own bytes only this far:
// - a number read from the file is printed only if it is no larger than the file (then it is an
//   offset, a length or a count inside the file, which is what identifies the problem); a
//   larger one is described by the bound it broke (the file's size, the bytes left, a limit),
//   never by its value, which could be any eight bytes of the file (file_number, file_shape);
// - text read from the file (a tensor name, a dtype) goes through file_text(): at most
//   kQuoteLimit bytes, escaped as printable() escapes them, so no control character reaches a
//   terminal or a log line;
// - a parser library's own message goes through json_error_text(), which cuts the input it
//   quotes.
// Pure functions, safe from any thread.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "ckptfs/util/printable.h"
#include "ckptfs/util/shape_text.h"

namespace ckptfs {

// Bytes of a name or type string a message shows; real names are shorter.
inline constexpr size_t kQuoteLimit = 64;

// `text` in double quotes: its first `limit` bytes as printable() shows them (control
// characters, NUL and bytes that are not UTF-8 escaped), the double quote as \x22 so the quoted
// text cannot end early; a longer text ends with "..." and its length ("...\" (300 bytes)").
inline std::string file_text(std::string_view text, size_t limit = kQuoteLimit) {
  const std::string_view shown = text.substr(0, limit);
  std::string out = "\"";
  for (const char c : printable(shown)) {
    if (c == '"')
      out += "\\x22";
    else
      out += c;
  }
  if (shown.size() < text.size()) return fmt::format("{}...\" ({} bytes)", out, text.size());
  out += '"';
  return out;
}

// A number read from a file of `file_size` bytes, as a message may show it: the number if it is
// no larger than the file, else ">N" with N the file's size (see the top of this header).
inline std::string file_number(uint64_t value, uint64_t file_size) {
  if (value <= file_size) return std::to_string(value);
  return fmt::format(">{}", file_size);
}

// A shape read from a file of `file_size` bytes: "[2,3]" if no dimension is larger than the
// file, else "[...] (a dimension negative or larger than the N-byte file)".
inline std::string file_shape(std::span<const int64_t> dims, uint64_t file_size) {
  for (int64_t d : dims)
    if (d < 0 || static_cast<uint64_t>(d) > file_size)
      return fmt::format("[...] (a dimension negative or larger than the {}-byte file)", file_size);
  return shape_text(dims);
}

// A JSON parser's message without the input it quotes: nlohmann's parse errors end with
// "; last read: '<input>'" and its number errors say "parsing '<token>'"; everything from the
// first quote on is cut.
inline std::string json_error_text(std::string_view what) {
  const size_t last_read = what.find("; last read");
  if (last_read != std::string_view::npos) what = what.substr(0, last_read);
  const size_t quote = what.find('\'');
  if (quote != std::string_view::npos) what = what.substr(0, quote);
  while (!what.empty() && (what.back() == ' ' || what.back() == ':')) what.remove_suffix(1);
  return std::string(what);
}

}  // namespace ckptfs
