// Text taken from a file (a tensor name, a dtype string, a dict key) as it may be shown on a
// terminal or put in a one-line message. Control characters would move the cursor, recolour or
// retitle the terminal, end a message at a NUL or split it over lines, so each is written as an
// escape instead: \xNN for C0 controls, DEL and bytes that are not UTF-8, \u00NN for the C1
// controls some terminals obey, \\ for the backslash (so an escape is never ambiguous).
// Everything else, non-ASCII letters included, is kept. Pure function; thread-safe.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace ckptfs {

namespace printable_detail {

// Length of the well-formed UTF-8 sequence at text[i], or 0 (overlongs, surrogates and code
// points past U+10FFFF are not well-formed).
inline size_t utf8_length(std::string_view text, size_t i) {
  const auto c = static_cast<uint8_t>(text[i]);
  const size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (len == 0 || i + len > text.size()) return 0;
  uint32_t cp = len == 1 ? c : c & (0x7Fu >> len);
  for (size_t k = 1; k < len; ++k) {
    const auto d = static_cast<uint8_t>(text[i + k]);
    if ((d & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (d & 0x3F);
  }
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

inline bool plain(uint8_t c) { return c >= 0x20 && c < 0x7F && c != '\\'; }

}  // namespace printable_detail

inline std::string printable(std::string_view text) {
  using printable_detail::plain;
  size_t i = 0;
  while (i < text.size() && plain(static_cast<uint8_t>(text[i]))) ++i;
  if (i == text.size()) return std::string(text);  // the usual case: nothing to escape
  std::string out(text.substr(0, i));
  while (i < text.size()) {
    const auto c = static_cast<uint8_t>(text[i]);
    if (plain(c)) {
      out += static_cast<char>(c);
      ++i;
    } else if (c == '\\') {
      out += "\\\\";
      ++i;
    } else if (const size_t len = printable_detail::utf8_length(text, i); len >= 2) {
      const auto second = static_cast<uint8_t>(text[i + 1]);
      if (c == 0xC2 && second < 0xA0)  // U+0080..U+009F
        out += fmt::format("\\u{:04x}", second);
      else
        out.append(text.substr(i, len));
      i += len;
    } else {
      out += fmt::format("\\x{:02x}", c);
      ++i;
    }
  }
  return out;
}

}  // namespace ckptfs
