// Encoding and strict decoding of shard headers (little-endian fields), XXH3 checksums and shard
// file names. Every length read from a header is bounded before it is used.
#include "checkpoint/shard_file.hpp"

#include <xxhash.h>

#include <cstring>

#include "checkpoint/errors.hpp"
#include "comm/errors.hpp"

namespace shardcheck::checkpoint {

namespace {

constexpr char kMagic[8] = {'S', 'C', 'K', 'S', 'H', 'A', 'R', 'D'};
constexpr std::uint8_t kSliceFlat = 0, kSliceBox = 1;

struct DTypeCode {
  comm::DType t;
  std::uint8_t code;
};
constexpr DTypeCode kCodes[] = {
    {comm::DType::f64, 1}, {comm::DType::f32, 2}, {comm::DType::bf16, 3}, {comm::DType::f16, 4},
    {comm::DType::i32, 5}, {comm::DType::i64, 6}, {comm::DType::u8, 7}};

class Writer {
 public:
  void u8(std::uint8_t v) { out_.push_back(std::byte{v}); }
  void u16(std::uint16_t v) { le(v, 2); }
  void u32(std::uint32_t v) { le(v, 4); }
  void u64(std::uint64_t v) { le(v, 8); }
  void raw(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  std::vector<std::byte>& bytes() { return out_; }

 private:
  void le(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(std::byte(static_cast<std::uint8_t>(v >> (8 * i))));
  }
  std::vector<std::byte> out_;
};

// Bounds-checked little-endian reader; any read past the end is a malformed header.
class Reader {
 public:
  Reader(std::span<const std::byte> b, const std::string& file) : b_(b), file_(file) {}
  std::uint64_t le(int n) {
    need(static_cast<std::size_t>(n));
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i)
      v |= std::uint64_t(std::to_integer<std::uint8_t>(b_[pos_ + static_cast<std::size_t>(i)]))
           << (8 * i);
    pos_ += static_cast<std::size_t>(n);
    return v;
  }
  std::span<const std::byte> raw(std::size_t n) {
    need(n);
    auto s = b_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  std::size_t pos() const { return pos_; }
  [[noreturn]] void fail(const std::string& why) const {
    throw RestoreError(Reason::bad_header, why, file_);
  }

 private:
  void need(std::size_t n) const {
    if (n > b_.size() - pos_) fail("header ends early (" + std::to_string(b_.size()) + " bytes)");
  }
  std::span<const std::byte> b_;
  std::size_t pos_ = 0;
  const std::string& file_;
};

std::size_t header_size_for(std::size_t ndim, bool flat, std::size_t name) {
  return kHeaderFixedBytes + 8 * ndim + (flat ? 16 : 16 * ndim) + name + 8;
}

}  // namespace

std::uint64_t xxh3(std::span<const std::byte> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

std::string hex64(std::uint64_t v) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<std::size_t>(i)] = digits[v & 15];
  return s;
}

bool parse_hex64(const std::string& s, std::uint64_t& out) {
  if (s.size() != 16) return false;
  out = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else
      return false;
    out = (out << 4) | static_cast<std::uint64_t>(d);
  }
  return true;
}

Xxh3Stream::Xxh3Stream() : state_(XXH3_createState()) {
  SC_CHECK(state_ != nullptr, "XXH3_createState failed");
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}
Xxh3Stream::~Xxh3Stream() {
  XXH3_freeState(static_cast<XXH3_state_t*>(state_));
}
void Xxh3Stream::update(std::span<const std::byte> bytes) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), bytes.data(), bytes.size());
}
std::uint64_t Xxh3Stream::digest() const {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

std::uint8_t dtype_code(comm::DType t) {
  for (const auto& c : kCodes)
    if (c.t == t) return c.code;
  SC_CHECK(false, "dtype without a shard code");
  return 0;
}

std::vector<std::byte> encode_shard_header(const ShardHeader& h) {
  SC_CHECK(h.shape.size() <= kMaxDims && h.tensor.size() <= kMaxNameBytes,
           "header fields out of bounds");
  const bool flat = std::holds_alternative<FlatRange>(h.slice);
  Writer w;
  w.raw(kMagic, sizeof kMagic);
  w.u32(kFormatVersion);
  w.u32(static_cast<std::uint32_t>(header_size_for(h.shape.size(), flat, h.tensor.size())));
  w.u8(dtype_code(h.dtype));
  w.u8(flat ? kSliceFlat : kSliceBox);
  w.u16(static_cast<std::uint16_t>(h.shape.size()));
  w.u32(static_cast<std::uint32_t>(h.tensor.size()));
  w.u64(h.payload_bytes);
  w.u64(h.payload_xxh3);
  for (auto e : h.shape) w.u64(e);
  if (flat) {
    w.u64(std::get<FlatRange>(h.slice).begin);
    w.u64(std::get<FlatRange>(h.slice).count);
  } else {
    for (auto e : std::get<Box>(h.slice).offset) w.u64(e);
    for (auto e : std::get<Box>(h.slice).length) w.u64(e);
  }
  w.raw(h.tensor.data(), h.tensor.size());
  w.u64(xxh3(w.bytes()));
  return std::move(w.bytes());
}

std::uint32_t shard_header_size(std::span<const std::byte> fixed) {
  static const std::string none;
  Reader r(fixed.first(std::min(fixed.size(), kHeaderFixedBytes)), none);
  auto magic = r.raw(sizeof kMagic);
  if (std::memcmp(magic.data(), kMagic, sizeof kMagic) != 0) r.fail("bad magic");
  const auto version = r.le(4);
  if (version != kFormatVersion)
    throw RestoreError(Reason::version_mismatch, "shard format version " + std::to_string(version) +
                                                     ", this reader knows " +
                                                     std::to_string(kFormatVersion));
  const auto size = r.le(4);
  r.le(1);
  const auto kind = r.le(1);
  const auto ndim = r.le(2);
  const auto name = r.le(4);
  if (kind != kSliceFlat && kind != kSliceBox) r.fail("unknown slice kind");
  if (ndim > kMaxDims) r.fail("ndim " + std::to_string(ndim) + " > " + std::to_string(kMaxDims));
  if (name == 0 || name > kMaxNameBytes) r.fail("tensor name length " + std::to_string(name));
  if (size != header_size_for(ndim, kind == kSliceFlat, name))
    r.fail("header size " + std::to_string(size) + " does not match its fields");
  return static_cast<std::uint32_t>(size);
}

ShardHeader parse_shard_header(std::span<const std::byte> bytes, const std::string& file) {
  Reader r(bytes, file);
  if (bytes.size() < kHeaderFixedBytes) r.fail("header ends early");
  std::uint32_t size;
  try {
    size = shard_header_size(bytes);
  } catch (const RestoreError& e) {
    throw RestoreError(e.reason(), e.detail(), file);
  }
  r.raw(16);
  ShardHeader h;
  h.header_bytes = size;
  const auto code = r.le(1);
  const bool flat = r.le(1) == kSliceFlat;
  const auto ndim = static_cast<std::size_t>(r.le(2));
  const auto name = static_cast<std::size_t>(r.le(4));
  h.payload_bytes = r.le(8);
  h.payload_xxh3 = r.le(8);
  bool known = false;
  for (const auto& c : kCodes)
    if (c.code == code) h.dtype = c.t, known = true;
  if (!known) r.fail("unknown dtype code " + std::to_string(code));
  for (std::size_t d = 0; d < ndim; ++d) h.shape.push_back(r.le(8));
  if (flat) {
    FlatRange f;
    f.begin = r.le(8);
    f.count = r.le(8);
    h.slice = f;
  } else {
    Box b;
    for (std::size_t d = 0; d < ndim; ++d) b.offset.push_back(r.le(8));
    for (std::size_t d = 0; d < ndim; ++d) b.length.push_back(r.le(8));
    h.slice = std::move(b);
  }
  auto nm = r.raw(name);
  h.tensor.assign(reinterpret_cast<const char*>(nm.data()), nm.size());
  if (h.tensor.find('\0') != std::string::npos) r.fail("NUL in tensor name");
  const std::uint64_t want = xxh3(bytes.first(r.pos()));
  const std::uint64_t stored = r.le(8);
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
  if (stored != want) r.fail("header checksum mismatch");
#else
  (void)stored;  // fuzz builds only: let the fuzzer reach the checks behind the checksum
  (void)want;
#endif
  const auto total = checked_volume(h.shape);
  if (!total) r.fail("logical shape too large");
  if (!within(h.shape, h.slice)) r.fail(describe(h.slice) + " outside the logical shape");
  const std::uint64_t n = element_count(h.slice);
  if (n == 0) r.fail("empty slice");
  if (h.payload_bytes != n * comm::size_of(h.dtype))
    r.fail("payload " + std::to_string(h.payload_bytes) + " bytes for " + std::to_string(n) +
           " elements of " + std::string(comm::name_of(h.dtype)));
  return h;
}

std::string shard_file_name(const std::string& tensor, const Slice& slice, int rank) {
  std::string s;
  for (char c : tensor) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '-' || c == '_';
    s += ok ? c : '_';
    if (s.size() == 96) break;
  }
  if (s.empty() || s[0] == '.') s.insert(s.begin(), '_');
  s += '.' + hex64(xxh3(std::as_bytes(std::span(tensor.data(), tensor.size())))).substr(0, 8);
  std::string tag;
  if (const auto* f = std::get_if<FlatRange>(&slice)) {
    tag = ".f" + std::to_string(f->begin) + '+' + std::to_string(f->count);
  } else {
    const Box& b = std::get<Box>(slice);
    tag = ".b";
    for (std::size_t d = 0; d < b.offset.size(); ++d)
      tag += (d ? "_" : "") + std::to_string(b.offset[d]);
    tag += '+';
    for (std::size_t d = 0; d < b.length.size(); ++d)
      tag += (d ? "_" : "") + std::to_string(b.length[d]);
  }
  // Boxes of many large dims would exceed a file name's 255 bytes: name them by hash instead.
  if (s.size() + tag.size() > 240) {
    const std::string d = describe(slice);
    tag = ".s" + hex64(xxh3(std::as_bytes(std::span(d.data(), d.size()))));
  }
  s += tag + ".r" + std::to_string(rank) + ".shard";
  // No ".." anywhere, so the reader's blanket path rule never rejects a name the writer made.
  for (std::size_t i = 1; i < s.size(); ++i)
    if (s[i] == '.' && s[i - 1] == '.') s[i] = '_';
  return s;
}

bool is_safe_file_name(const std::string& name) {
  if (name.empty() || name.size() > 255 || name[0] == '.') return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '-' || c == '_' || c == '+';
    if (!ok) return false;
  }
  return true;
}

}  // namespace shardcheck::checkpoint
