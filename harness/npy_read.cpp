// The .npy reader of npy_read.hpp: the magic and version, the header's Python dict literal
// ({'descr': ..., 'fortran_order': ..., 'shape': (...)}, exactly those keys) parsed by hand, the
// data's size checked against the shape, then the elements converted to double.
#include "harness/npy_read.hpp"

#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <string_view>

namespace shardcheck::harness {

static_assert(std::endian::native == std::endian::little, "the .npy reader assumes little-endian");

namespace {

namespace fs = std::filesystem;

[[noreturn]] void npy_fail(const fs::path& file, const std::string& what) {
  throw NpyError(file.string() + ": " + what);
}

// The header dict of a .npy file: a Python literal with string keys; values are a string, True or
// False, or a tuple of non-negative integers.
class NpyDictParser {
 public:
  NpyDictParser(const fs::path& file, std::string_view text) : file_(file), s_(text) {}

  void parse(NpyHeader& h, bool& fortran_order) {
    bool have_descr = false, have_order = false, have_shape = false;
    skip_space();
    expect('{');
    for (;;) {
      skip_space();
      if (peek() == '}') break;
      const std::string key = string_literal();
      skip_space();
      expect(':');
      skip_space();
      if (key == "descr") {
        if (have_descr) fail("the key 'descr' appears twice");
        if (peek() != '\'' && peek() != '"')
          fail("'descr' is not a dtype string (structured arrays are not read)");
        h.descr = string_literal();
        have_descr = true;
      } else if (key == "fortran_order") {
        if (have_order) fail("the key 'fortran_order' appears twice");
        fortran_order = boolean();
        have_order = true;
      } else if (key == "shape") {
        if (have_shape) fail("the key 'shape' appears twice");
        h.shape = tuple();
        have_shape = true;
      } else {
        fail("unexpected key '" + key + "' (expected descr, fortran_order and shape)");
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() != '}') fail("expected ',' or '}' after the value of '" + key + "'");
    }
    ++pos_;  // '}'
    skip_space();
    if (pos_ != s_.size()) fail("unexpected text after the header's dict");
    if (!have_descr || !have_order || !have_shape)
      fail(std::string("the header lacks '") +
           (!have_descr   ? "descr"
            : !have_order ? "fortran_order"
                          : "shape") +
           "'");
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    npy_fail(file_, "malformed header: " + what);
  }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n')) ++pos_;
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "' at byte " + std::to_string(pos_));
    ++pos_;
  }
  std::string string_literal() {
    const char quote = peek();
    if (quote != '\'' && quote != '"')
      fail("expected a quoted string at byte " + std::to_string(pos_));
    const std::size_t end = s_.find(quote, pos_ + 1);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string out(s_.substr(pos_ + 1, end - pos_ - 1));
    pos_ = end + 1;
    return out;
  }
  bool boolean() {
    if (s_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (s_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    fail("'fortran_order' is neither True nor False");
  }
  std::vector<int64_t> tuple() {
    expect('(');
    std::vector<int64_t> out;
    for (;;) {
      skip_space();
      if (peek() == ')') break;
      if (peek() < '0' || peek() > '9')
        fail("'shape' holds something other than non-negative integers");
      int64_t v = 0;
      while (peek() >= '0' && peek() <= '9') {
        const int digit = peek() - '0';
        if (v > (std::numeric_limits<int64_t>::max() - digit) / 10) fail("a dimension overflows");
        v = v * 10 + digit;
        ++pos_;
      }
      if (peek() == 'L') ++pos_;  // Python 2's long literal
      out.push_back(v);
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() != ')') fail("expected ',' or ')' in 'shape'");
    }
    ++pos_;
    return out;
  }

  const fs::path& file_;
  std::string_view s_;
  std::size_t pos_ = 0;
};

struct DtypeInfo {
  const char* descr;
  const char* name;
  std::size_t bytes;
};
constexpr DtypeInfo kDtypes[] = {{"<f8", "float64", 8},
                                 {"<f4", "float32", 4},
                                 {"<f2", "float16", 2},
                                 {"<i4", "int32", 4},
                                 {"<i8", "int64", 8}};

// The header and, for `with_data`, the data bytes (exactly what the shape needs).
NpyHeader read_file(const fs::path& file, std::string* data) {
  std::error_code ec;
  const fs::file_status st = fs::status(file, ec);
  if (!fs::exists(st)) npy_fail(file, "no such file");
  if (!fs::is_regular_file(st)) npy_fail(file, "not a regular file");
  const std::uintmax_t size = fs::file_size(file, ec);
  if (ec) npy_fail(file, "cannot read its size (" + ec.message() + ")");
  std::ifstream f(file, std::ios::binary);
  if (!f) npy_fail(file, "cannot be opened for reading");

  char lead[8];
  const bool have_lead = static_cast<bool>(f.read(lead, sizeof lead));
  if (!have_lead || std::memcmp(lead, "\x93NUMPY", 6) != 0)
    npy_fail(file, "not a .npy file (no \\x93NUMPY magic)");
  const int major = static_cast<unsigned char>(lead[6]);
  const int minor = static_cast<unsigned char>(lead[7]);
  if ((major != 1 && major != 2) || minor != 0)
    npy_fail(file, ".npy format version " + std::to_string(major) + "." + std::to_string(minor) +
                       " is not read (expected 1.0 or 2.0)");
  const std::size_t len_bytes = major == 1 ? 2 : 4;
  unsigned char len_raw[4] = {0, 0, 0, 0};
  if (!f.read(reinterpret_cast<char*>(len_raw), static_cast<std::streamsize>(len_bytes)))
    npy_fail(file, "truncated in the header length");
  std::size_t header_len = 0;
  for (std::size_t i = len_bytes; i-- > 0;) header_len = header_len * 256 + len_raw[i];
  const std::size_t data_offset = 8 + len_bytes + header_len;
  if (data_offset > size)
    npy_fail(file, "truncated in the header (" + std::to_string(header_len) +
                       " header bytes announced, the file has " + std::to_string(size) +
                       " bytes in all)");
  std::string text(header_len, '\0');
  if (!f.read(text.data(), static_cast<std::streamsize>(header_len)))
    npy_fail(file, "cannot read the header");
  if (text.empty() || text.back() != '\n')
    npy_fail(file, "malformed header: it does not end in a newline");

  NpyHeader h;
  bool fortran_order = false;
  NpyDictParser(file, text).parse(h, fortran_order);
  if (fortran_order)
    npy_fail(file,
             "fortran_order is True: only C-order arrays are read (save with "
             "np.ascontiguousarray)");
  if (!h.descr.empty() && h.descr[0] == '>')
    npy_fail(file, "big-endian data (descr '" + h.descr + "'): only little-endian is read");
  const DtypeInfo* info = nullptr;
  for (const DtypeInfo& d : kDtypes)
    if (h.descr == d.descr) info = &d;
  if (!info)
    npy_fail(file, "dtype '" + h.descr + "' is not read (expected <f8, <f4, <f2, <i4 or <i8)");
  h.dtype = info->name;
  h.item_bytes = info->bytes;
  h.data_offset = data_offset;

  // The element count, and its bytes, without overflow.
  std::uintmax_t numel = 1;
  const std::uintmax_t limit = std::numeric_limits<std::uintmax_t>::max() / 8;
  for (const int64_t d : h.shape) {
    const auto ud = static_cast<std::uintmax_t>(d);
    if (ud != 0 && numel > limit / ud)
      npy_fail(file, "the shape " + shape_text(h.shape) + " has too many elements");
    numel *= ud;
  }
  const std::uintmax_t need = numel * h.item_bytes;
  const std::uintmax_t have = size - data_offset;
  if (have < need)
    npy_fail(file, "truncated: the shape " + shape_text(h.shape) + " of " + h.descr + " needs " +
                       std::to_string(need) + " data bytes, the file has " + std::to_string(have));
  if (have > need)
    npy_fail(file, std::to_string(have - need) + " bytes after the data (the shape " +
                       shape_text(h.shape) + " of " + h.descr + " needs " + std::to_string(need) +
                       ")");
  h.numel = static_cast<std::size_t>(numel);
  if (data) {
    data->assign(static_cast<std::size_t>(need), '\0');
    if (!f.read(data->data(), static_cast<std::streamsize>(need)))
      npy_fail(file, "cannot read the data");
  }
  return h;
}

double half_to_double(uint16_t h) {
  const int exponent = (h >> 10) & 0x1F;
  const int mantissa = h & 0x3FF;
  double v = 0;
  if (exponent == 0)
    v = std::ldexp(mantissa, -24);  // zero and subnormals
  else if (exponent == 31)
    v = mantissa ? std::numeric_limits<double>::quiet_NaN()
                 : std::numeric_limits<double>::infinity();
  else
    v = std::ldexp(mantissa + 1024, exponent - 25);
  return (h & 0x8000) ? -v : v;
}

template <class T>
T load_le(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

NpyHeader read_npy_header(const std::filesystem::path& file) {
  return read_file(file, nullptr);
}

NpyArray read_npy(const std::filesystem::path& file) {
  std::string data;
  NpyArray a;
  a.header = read_file(file, &data);
  const NpyHeader& h = a.header;
  a.values.resize(h.numel);
  const char* p = data.data();
  if (h.descr == "<f8") {
    for (std::size_t i = 0; i < h.numel; ++i) a.values[i] = load_le<double>(p + 8 * i);
  } else if (h.descr == "<f4") {
    for (std::size_t i = 0; i < h.numel; ++i) a.values[i] = load_le<float>(p + 4 * i);
  } else if (h.descr == "<f2") {
    for (std::size_t i = 0; i < h.numel; ++i)
      a.values[i] = half_to_double(load_le<uint16_t>(p + 2 * i));
  } else {
    a.ints.resize(h.numel);
    for (std::size_t i = 0; i < h.numel; ++i) {
      a.ints[i] = h.descr == "<i4" ? load_le<int32_t>(p + 4 * i) : load_le<int64_t>(p + 8 * i);
      a.values[i] = static_cast<double>(a.ints[i]);
    }
  }
  return a;
}

}  // namespace shardcheck::harness
