// Names from input made safe to print. A scenario name, a JSON key, a file name or a tensor name
// read from a checkpoint reaches a terminal, a log or an error message: a newline in it would
// forge a line of output, an ESC sequence would drive the terminal, a NUL would cut a C string
// (what()) short. printable() writes every control character as a visible escape; the loaders
// refuse control characters in the names they own (scenario names), the printers escape the rest.
// Header-only: the lowest module (comm/) so that checkpoint/ and harness/ both use the one rule.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace shardcheck::comm {

// The first control character of `s`, as printable() would write it ("\\n", "\\x1b", "\\u009b"),
// with its byte offset; {"" , npos} when there is none. Control characters: C0 (0x00-0x1f), DEL
// (0x7f), and the C1 controls U+0080..U+009F in their UTF-8 form (0xc2 0x80..0x9f; U+009B is a CSI
// on some terminals).
struct ControlChar {
  std::string escaped;
  std::size_t offset = std::string_view::npos;
};

namespace text_detail {

inline const char* short_escape(unsigned char c) {
  switch (c) {
    case '\n':
      return "\\n";
    case '\r':
      return "\\r";
    case '\t':
      return "\\t";
    case '\0':
      return "\\0";
    default:
      return nullptr;
  }
}

// Length of the control character at s[i] (1, or 2 for a UTF-8 C1 control), 0 if none.
inline std::size_t control_at(std::string_view s, std::size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x20 || c == 0x7f) return 1;
  if (c == 0xc2 && i + 1 < s.size()) {
    const auto d = static_cast<unsigned char>(s[i + 1]);
    if (d >= 0x80 && d <= 0x9f) return 2;
  }
  return 0;
}

inline void append_escape(std::string& out, std::string_view s, std::size_t i, std::size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  if (n == 2) {
    const auto d = static_cast<unsigned char>(s[i + 1]);
    out += "\\u00";
    out += kHex[d >> 4];
    out += kHex[d & 0xf];
    return;
  }
  const auto c = static_cast<unsigned char>(s[i]);
  if (const char* e = short_escape(c)) {
    out += e;
    return;
  }
  out += "\\x";
  out += kHex[c >> 4];
  out += kHex[c & 0xf];
}

}  // namespace text_detail

namespace text_detail {
inline std::string escaped(std::string_view s, bool keep_newlines) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = keep_newlines && s[i] == '\n' ? 0 : control_at(s, i);
    if (n == 0) {
      out += s[i++];
      continue;
    }
    append_escape(out, s, i, n);
    i += n;
  }
  return out;
}
}  // namespace text_detail

// `s` with every control character escaped (see ControlChar); other bytes unchanged.
inline std::string printable(std::string_view s) {
  return text_detail::escaped(s, false);
}

// printable(), but newlines kept: for messages of several lines written by this program, whose
// embedded names may still hold anything else.
inline std::string printable_lines(std::string_view s) {
  return text_detail::escaped(s, true);
}

inline ControlChar first_control(std::string_view s) {
  for (std::size_t i = 0; i < s.size(); ++i)
    if (const std::size_t n = text_detail::control_at(s, i); n > 0) {
      ControlChar c;
      text_detail::append_escape(c.escaped, s, i, n);
      c.offset = i;
      return c;
    }
  return {};
}

}  // namespace shardcheck::comm
